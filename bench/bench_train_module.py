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

These three run once per PyTorch (``--torch debian|torch2|both``, both by default: Debian's 1.13
here, then torch 2.x in the torch2 peer's interpreter), each table headed by the torch it measured.

Hugging Face models (``--models hf-bert,hf-gpt2,hf-llama``, transformers from the torch2 peer's
venv): BertForSequenceClassification with BERT-base's shape (12 x 768, short sequences: batch 8 of
32 tokens), GPT2LMHeadModel with GPT-2 small's (12 x 768, vocabulary 50257; batch 4 of 64) and a
small Llama (8 x 512, 8 heads sharing 2 key/value heads, vocabulary 32000; batch 4 of 64), built
from configs with random weights, the loss the model's own (``model(**batch).loss``), AdamW. Three
variants per precision (fp32, and bf16 under ``torch.autocast("cpu")``): eager PyTorch,
``torch.compile(model)`` (inductor; its first step, which compiles, is reported as compile time) and
TrainModule (its first step exports and builds). Each variant runs in a fresh process per round
(``--rounds``, the variant going first rotating), ``--warmup`` untimed steps then ``--steps`` timed
ones, as a user runs one model per process. Peak memory: each variant again in a process of its
own, the peak resident memory above the built model's over ``--memory-steps`` steps (sampled every
2 ms).
Targets: TrainModule >= 2x eager and >= 1.3x compiled per step, peak memory <= eager's.

    ~/.cache/onnxtrain/peers/torch2/bin/python bench/bench_train_module.py --models hf-bert,hf-gpt2,hf-llama --threads 2
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_torch_argument, import_onnxtrain, median, report_rows, run_models,  # noqa: E402
                    run_torch_lanes, torch_description)


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


# ---- Hugging Face models ---------------------------------------------------------------------------

HF_MODELS = ("hf-bert", "hf-gpt2", "hf-llama")
HF_VARIANTS = ("eager", "compile", "trainmodule")


def hf_case(name: str, steps: int, seed: int = 0):
    """The model (train mode) and `steps` batches (dicts with labels) of one HF benchmark model."""
    import torch
    import transformers as hf
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name == "hf-bert":  # BERT-base: 12 layers of 768, 12 heads, FFN 3072
        model, (batch, seq) = hf.BertForSequenceClassification(hf.BertConfig(num_labels=2)), (8, 32)
        vocab = model.config.vocab_size
        draw = lambda: {"input_ids": torch.randint(1, vocab, (batch, seq), generator=g),  # noqa: E731
                        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
                        "labels": torch.randint(0, 2, (batch,), generator=g)}
    else:
        if name == "hf-gpt2":  # GPT-2 small: 12 layers of 768, 12 heads, vocabulary 50257
            model = hf.GPT2LMHeadModel(hf.GPT2Config(use_cache=False))
        elif name == "hf-llama":
            model = hf.LlamaForCausalLM(hf.LlamaConfig(
                vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, use_cache=False))
        else:
            raise KeyError(name)
        batch, seq = 4, 64
        vocab = model.config.vocab_size

        def draw():
            ids = torch.randint(1, vocab, (batch, seq), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long), "labels": ids}
    return model.train(), [draw() for _ in range(steps)]


class HfRun:
    """One variant of the user's HF loop (`model(**batch).loss`, AdamW), in fp32 or bf16 autocast."""

    def __init__(self, model, precision: str):
        import torch
        self.model, self.precision = model, precision
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        self.times, self.losses = [], []

    def step(self, batch):
        import torch
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())


def hf_variant(model, variant: str):
    import torch
    from onnxtrain.torch import TrainModule
    if variant == "compile":
        return torch.compile(model)
    return TrainModule(model) if variant == "trainmodule" else model


def hf_child(name: str, variant: str, precision: str, args) -> str:
    """Runs `hf_child_main` in a fresh interpreter (this one's: the torch2 peer's) and returns the
    last line it printed."""
    import subprocess
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                          "--hf-child", f"{name}:{variant}:{precision}", "--steps", str(args.steps),
                          "--warmup", str(args.warmup), "--memory-steps", str(args.memory_steps)],
                         capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        raise RuntimeError(f"{name} {variant} {precision}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip().splitlines()[-1]


def hf_child_main(spec: str, args) -> None:
    """One variant in a process of its own. With --memory-steps 0 in the spec's place (the timing
    run): trains --warmup + --steps steps and prints a JSON line of step times, losses and the
    wrapper's build figures. The memory run (--memory-steps > 0, spec ending ":memory") prints the
    peak resident memory (MiB) above the process's after it built the model, sampled every 2 ms
    while the variant trains --memory-steps steps. ru_maxrss would not do: importing torch 2.x maps
    more than a step of these models uses (its first runs gave eager and TrainModule the same
    maxrss to the KiB)."""
    import threading
    name, variant, precision, *mode = spec.split(":")
    if mode == ["memory"]:
        model, batches = hf_case(name, args.memory_steps)
        run = HfRun(hf_variant(model, variant), precision)
        page = os.sysconf("SC_PAGE_SIZE")

        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page

        base = rss()
        peak, done = [base], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for batch in batches:
            run.step(batch)
        done.set()
        sampler.join()
        print((peak[0] - base) / 2**20)
        return
    model, batches = hf_case(name, args.warmup + args.steps)
    run = HfRun(hf_variant(model, variant), precision)
    for batch in batches:
        run.step(batch)
    out = {"times": run.times, "losses": run.losses}
    if variant == "trainmodule":
        wrapped = run.model
        stats = wrapped.build_stats[0]
        out.update(export_s=stats["export_s"], build_s=stats["build_s"], exports=wrapped.export_count)
        by_op = {}
        for r in wrapped.profile() or []:
            key = (r["graph"], r["op_type"])
            by_op[key] = by_op.get(key, 0.0) + r["total_us"]
        total = sum(by_op.values())
        if total:
            out["profile_top"] = [(g, op, round(us / total * 100, 1))
                                  for (g, op), us in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]]
    print(json.dumps(out))


def bench_hf(name: str, precision: str, args) -> dict:
    """Each variant in a fresh process per round, as a user runs one model per process (in one
    process the three models' allocations change each other's page faults: TrainModule's BERT-base
    step took 3.0 s there against 0.6 s alone), rounds interleaved with the variant going first
    rotating. Step time: the median over every round of the steps after --warmup (the first step
    exports, builds or compiles; the second still plans)."""
    variants = [v for v in HF_VARIANTS if v in args.variants.split(",")]
    assert "eager" in variants and "trainmodule" in variants, "--variants needs eager and trainmodule"
    results = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            results[v].append(json.loads(hf_child(name, v, precision, args)))
    row = {"model": name, "precision": precision, "steps": args.steps, "warmup": args.warmup,
           "rounds": args.rounds, "threads": args.threads}
    for v, runs in results.items():
        row[f"{v}_step_ms"] = median([t for run in runs for t in run["times"][args.warmup:]]) * 1e3
        row[f"{v}_round_ms"] = [round(median(run["times"][args.warmup:]) * 1e3, 1) for run in runs]
        row[f"{v}_first_step_s"] = median([run["times"][0] for run in runs])
    if "compile" in results:
        row["compile_s"] = row["compile_first_step_s"] - row["compile_step_ms"] / 1e3
        row["vs_compile"] = row["compile_step_ms"] / row["trainmodule_step_ms"]
    tm = results["trainmodule"][0]
    row["export_s"], row["build_s"], row["exports"] = tm["export_s"], tm["build_s"], tm["exports"]
    row["vs_eager"] = row["eager_step_ms"] / row["trainmodule_step_ms"]
    # Same weights and batches in every process; dropout (BERT's and GPT-2's configs) draws other
    # masks in each engine, so only a model without it agrees to rounding.
    row["max_loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(tm["losses"], results["eager"][0]["losses"]))
    if "profile_top" in tm:
        row["profile_top"] = tm["profile_top"]
    if args.memory_steps:
        for v in variants:
            row[f"{v}_peak_mib"] = float(hf_child(name, v, precision + ":memory", args))
        row["memory_ratio"] = row["trainmodule_peak_mib"] / row["eager_peak_mib"]
    return row


def hf_report(rows, args) -> None:
    print(f"\nHugging Face models, {args.threads} threads, each variant in its own process per round, {args.rounds} "
          f"rounds of {args.warmup} warm-up + {args.steps} steps (median over the rounds' steps) "
          f"(targets: TrainModule >= 2x eager, >= 1.3x torch.compile, peak memory <= eager)")
    print(f"{'model':9} {'prec':5} {'eager ms':>9} {'compile ms':>11} {'TrainMod ms':>12} {'x eager':>8} "
          f"{'x compile':>10} {'compile s':>10} {'export+build s':>15} {'peak MiB e/c/T':>20}")

    def line(r):
        peak = "/".join(f"{r[v + '_peak_mib']:.0f}" if v + "_peak_mib" in r else "-" for v in HF_VARIANTS)
        opt = lambda key, fmt: format(r[key], fmt) if key in r else "-"  # noqa: E731  (compile left out)
        return (f"{r['model']:9} {r['precision']:5} {r['eager_step_ms']:9.1f} {opt('compile_step_ms', '11.1f'):>11} "
                f"{r['trainmodule_step_ms']:12.1f} {r['vs_eager']:8.2f} {opt('vs_compile', '10.2f'):>10} "
                f"{opt('compile_s', '10.1f'):>10} {r['export_s'] + r['build_s']:15.1f} {peak:>20}")

    def detail(r):
        s = (f"{r['model']} {r['precision']}: max relative loss difference to eager {r['max_loss_rel_diff']:.1e}; "
             f"exports {r['exports']}; round medians ms " +
             ", ".join(f"{v} {r[v + '_round_ms']}" for v in HF_VARIANTS if v + "_round_ms" in r))
        if "memory_ratio" in r:
            s += f"; peak memory TrainModule/eager {r['memory_ratio']:.2f}"
        if "profile_top" in r:
            s += "; profile (% of kernel time): " + ", ".join(f"{g[0]}:{op} {p}" for g, op, p in r["profile_top"])
        return s

    report_rows(rows, line, detail, args.json)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--models", default="bert,gpt,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--precisions", default="fp32,bf16", help="HF models: fp32 and/or bf16 (autocast)")
    parser.add_argument("--memory-steps", type=int, default=3, help="HF models: steps of each peak-memory run (0: none)")
    parser.add_argument("--variants", default=",".join(HF_VARIANTS), help="HF models: which of eager,compile,trainmodule")
    parser.add_argument("--rounds", type=int, default=3, help="HF models: processes per variant, interleaved")
    parser.add_argument("--warmup", type=int, default=2, help="HF models: untimed steps per process")
    parser.add_argument("--hf-child", help=argparse.SUPPRESS)
    add_torch_argument(parser)
    args = parser.parse_args(argv)
    names = args.models.split(",")
    hf_names = [n for n in names if n in HF_MODELS]
    names = [n for n in names if n not in HF_MODELS]
    # The bench models run once per torch (--torch, both by default); the Hugging Face models in
    # the interpreter this runs in (the torch2 peer's, which has transformers).
    if names and not hf_names and not args.hf_child and not run_torch_lanes(args, argv):
        return 0
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(args.threads)
    ot.set_num_threads(args.threads)
    if args.hf_child:
        hf_child_main(args.hf_child, args)
        return 0
    if hf_names:
        rows = []
        for precision in args.precisions.split(","):
            for row in run_models(hf_names, lambda name: bench_hf(name, precision, args)):
                print(json.dumps(row), flush=True)  # each row as it comes: a long run keeps what it measured
                rows.append(row)
        hf_report(rows, args)
    if not names:
        return 0
    rows = run_models(names, lambda name: bench(name, args))
    print(f"\nTrainModule training step (torch.optim.AdamW unless noted), {torch_description()}, {args.threads} threads, "
          f"{args.steps} steps (target: >= 2x faster than torch for bert and gpt)")
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
