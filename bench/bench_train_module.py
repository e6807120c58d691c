#!/usr/bin/env python3
"""TrainModule benchmark: an unchanged PyTorch training loop, plain against wrapped.

For the BERT-style encoder with a classifier head (hidden 256, 4 layers, seq 128, batch 8), the
GPT-style decoder (same sizes, LM head over 8192 tokens) and the small CNN (batch 32, 3x32x32),
each trained for ``--steps`` steps on the same batches from the same initial weights:

* torch:        ``loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()``
                with torch.optim.AdamW;
* TrainModule:  the same loop with ``model = onnxtrain.torch.TrainModule(model)``;
* +FusedAdam:   TrainModule with onnxtrain.torch.FusedAdam instead of torch.optim.AdamW.

Per-step time is the median of the steps after the first (the variants' steps interleave, so a
changing machine load weighs on all alike); the first call's export and graph build are reported
separately. Target: TrainModule >= 2x faster per step than PyTorch for the
transformer models once warm. The losses of the runs are compared as a sanity check.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_train_module.py [--threads 2] [--models bert,gpt,cnn]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import import_onnxtrain, median, report_rows, run_models  # noqa: E402


class Run:
    """One variant of the user's loop: its own copy of the model and its optimizer."""

    def __init__(self, model, make_optimizer):
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
        self.times, self.losses = [], []

    def step(self, x, y):
        import torch
        start = time.perf_counter()
        logits = self.model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())


def bench(name: str, args) -> dict:
    import torch

    from models import training_loop_case
    from onnxtrain.torch import FusedAdam, TrainModule
    model, batches = training_loop_case(name, args.steps)
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-4)  # noqa: E731
    runs = {"torch": Run(copy.deepcopy(model), adamw),
            "trainmodule": Run(TrainModule(copy.deepcopy(model)), adamw),
            "fused": Run(TrainModule(copy.deepcopy(model)), lambda p: FusedAdam(p, lr=1e-4))}
    # Steps interleave (torch, TrainModule, +FusedAdam, torch, ...): load that changes while the
    # benchmark runs weighs on every variant alike.
    for x, y in batches:
        for run in runs.values():
            run.step(x, y)
    row = {"model": name, "steps": args.steps, "threads": args.threads}
    for label, run in runs.items():
        row[f"{label}_step_ms"] = median(run.times[1:]) * 1e3
        row[f"{label}_first_step_s"] = run.times[0]
    stats = runs["trainmodule"].model.build_stats[0]
    row["export_s"], row["build_s"], row["memory"] = stats["export_s"], stats["build_s"], stats["memory"]
    for label in ("trainmodule", "fused"):
        row[f"{label}_speedup"] = row["torch_step_ms"] / row[f"{label}_step_ms"]
        row[f"{label}_max_loss_rel_diff"] = max(abs(a - b) / abs(b)
                                                for a, b in zip(runs[label].losses, runs["torch"].losses))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--models", default="bert,gpt,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(args.threads)
    ot.set_num_threads(args.threads)
    rows = run_models(args.models.split(","), lambda name: bench(name, args))
    print(f"\nTrainModule training step (torch.optim.AdamW unless noted), {args.threads} threads, {args.steps} steps "
          f"(target: >= 2x faster than torch for bert and gpt)")
    print(f"{'model':6} {'torch ms':>9} {'TrainModule ms':>15} {'speedup':>8} {'+FusedAdam ms':>14} {'speedup':>8} "
          f"{'export s':>9} {'build s':>8}")
    report_rows(
        rows,
        lambda r: (f"{r['model']:6} {r['torch_step_ms']:9.1f} {r['trainmodule_step_ms']:15.1f} "
                   f"{r['trainmodule_speedup']:8.2f} {r['fused_step_ms']:14.1f} {r['fused_speedup']:8.2f} "
                   f"{r['export_s']:9.2f} {r['build_s']:8.2f}"),
        lambda r: (f"{r['model']}: first TrainModule step {r['trainmodule_first_step_s']:.2f} s (torch "
                   f"{r['torch_first_step_s']:.2f} s); max relative loss difference to torch: "
                   f"{r['trainmodule_max_loss_rel_diff']:.1e} (AdamW), {r['fused_max_loss_rel_diff']:.1e} (FusedAdam); "
                   f"{r['memory']}"),
        args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
