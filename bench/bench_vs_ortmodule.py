#!/usr/bin/env python3
"""TrainModule against ORTModule, ONNX Runtime training 1.19.2's PyTorch front end, on the same loop.

For the torch modules of bench_train_module.py (``--models``, default ``bert,gpt``: the BERT-style
encoder with a 2-class head and the GPT-style decoder with its 8192-token LM head, hidden 256,
4 layers, 8 x 128 tokens; ``cnn`` too), the user's loop is unchanged,

    loss = cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

with torch.optim.AdamW, and the model wrapped three ways: not at all (eager torch), in
``onnxtrain.torch.TrainModule`` and in ``onnxruntime.training.ortmodule.ORTModule``. All three run
Debian's torch 1.13 in the ``ortmodule`` peer's interpreter (scripts/setup_peers.sh ortmodule: ORT
training 1.19.2 with ORTModule's C++ extensions built against that torch), each variant in a fresh
process per round, rounds interleaved (the variant going first rotates), same batches and initial
weights; warm-up steps (the first exports and builds) are timed apart. Threads: torch and onnxtrain
get ``--threads``; ORTModule's session takes ORT's default (one intra-op thread per physical core,
2 here) and OMP_NUM_THREADS is set to ``--threads`` for every process.
Target: TrainModule at least 1.5x faster per step than ORTModule on the BERT-style and GPT-style
models. The first-step losses of the three are compared (same weights, same batch).

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_vs_ortmodule.py [--models bert,gpt] [--rounds 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_SPEEDUP = 1.5  # ORTModule step time / TrainModule step time, at least
VARIANTS = ("torch", "trainmodule", "ortmodule")
# The loop's phases, timed apart: the wrapped module's forward, torch's loss, the backward (the
# loss's gradient in torch, then the engine's backward), torch's AdamW, zero_grad.
PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")


def _quiet_nvtx(torch) -> None:
    """ORT 1.19.2 marks each ORTModule call with torch.cuda.nvtx ranges, which a CPU-only torch
    build (Debian's) refuses with a RuntimeError; with no GPU there is nothing to mark, so the ranges
    become no-ops. Nothing else of ORTModule changes."""
    try:
        torch.cuda.nvtx.range_push("probe")
        torch.cuda.nvtx.range_pop()
    except RuntimeError:
        torch.cuda.nvtx.range_push = lambda msg: None
        torch.cuda.nvtx.range_pop = lambda: None


def worker(args) -> None:
    """One variant, one process: prints a JSON line with its step times and losses."""
    import torch
    sys.path.insert(0, HERE)
    from models import training_loop_case
    torch.set_num_threads(args.threads)
    model, batches = training_loop_case(args.model, args.warmup + args.steps)
    if args.worker == "trainmodule":
        import onnxtrain
        from onnxtrain.torch import TrainModule
        onnxtrain.set_num_threads(args.threads)
        model, version = TrainModule(model), f"onnxtrain {getattr(onnxtrain, '__version__', 'dev')}"
    elif args.worker == "ortmodule":
        _quiet_nvtx(torch)
        import onnxruntime
        from onnxruntime.training.ortmodule import ORTModule
        model, version = ORTModule(model), f"onnxruntime-training {onnxruntime.__version__}"
    else:
        version = f"torch {torch.__version__}"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, losses = [], []
    phases = {name: [] for name in PHASES}  # ms per measured step, each phase of the loop
    for step, (x, y) in enumerate(batches):
        marks = [time.perf_counter()]
        logits = model(x)
        marks.append(time.perf_counter())
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        optimizer.zero_grad()
        marks.append(time.perf_counter())
        times.append((marks[-1] - marks[0]) * 1e3)
        losses.append(loss.item())
        if step >= args.warmup:
            for name, begin, end in zip(PHASES, marks, marks[1:]):
                phases[name].append((end - begin) * 1e3)
    print(json.dumps({"version": version, "warmup_s": sum(times[:args.warmup]) / 1e3,
                      "times_ms": times[args.warmup:], "losses": losses, "phases_ms": phases}))


def run_worker(variant: str, model: str, args) -> dict:
    import peers
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    import onnxtrain  # the workers import this same build
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(onnxtrain.__file__)),
                                                    env.get("PYTHONPATH")) if p)
    cmd = [os.path.abspath(__file__), "--worker", variant, "--model", model, "--threads", str(args.threads),
           "--warmup", str(args.warmup), "--steps", str(args.steps)]
    proc = peers.run("ortmodule", cmd, timeout_s=args.timeout, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{variant} on {model} failed: {lines[-1][:300] if lines else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_model(model: str, args) -> dict:
    runs = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            runs[variant].append(run_worker(variant, model, args))
        print(f"    {model} round {r + 1}/{args.rounds}: " + ", ".join(
            f"{v} {statistics.median(runs[v][-1]['times_ms']):.1f} ms" for v in VARIANTS), flush=True)
    row = {"model": model}
    for v, reps in runs.items():
        row[f"{v}_ms"] = statistics.median(t for rep in reps for t in rep["times_ms"])
        row[f"{v}_best_ms"] = min(statistics.median(rep["times_ms"]) for rep in reps)
        row[f"{v}_warmup_s"] = statistics.median(rep["warmup_s"] for rep in reps)
        row[f"{v}_first_loss"] = reps[0]["losses"][0]
        row[f"{v}_version"] = reps[0]["version"]
        row[f"{v}_phases_ms"] = {p: statistics.median(t for rep in reps for t in rep["phases_ms"][p]) for p in PHASES}
    row["speedup"] = row["ortmodule_ms"] / row["trainmodule_ms"]
    row["speedup_best"] = row["ortmodule_best_ms"] / row["trainmodule_best_ms"]
    ref = row["torch_first_loss"]
    for v in ("trainmodule", "ortmodule"):
        row[f"{v}_loss_rel_diff"] = abs(row[f"{v}_first_loss"] - ref) / max(abs(ref), 1e-30)
    return row


def report(rows, args) -> None:
    versions = ", ".join(rows[0][f"{v}_version"] for v in VARIANTS) if rows else ""
    print(f"\n{versions}; {args.threads} threads, {args.rounds} rounds of {args.warmup} warm-up + {args.steps} steps "
          f"per variant; step = forward + loss + backward + AdamW step + zero_grad; medians over all steps")
    print(f"{'model':6s} {'torch ms':>9s} {'ORTModule ms':>12s} {'TrainModule ms':>14s} {'vs ORTModule':>12s} "
          f"{'best':>6s} {'vs torch':>8s}  {'warm-up s (ORT/ours)':>20s}  {'1st loss rel diff (ORT/ours)':>28s}  status")
    for row in rows:
        ok = "met" if row["speedup"] >= TARGET_SPEEDUP else "NOT MET"
        print(f"{row['model']:6s} {row['torch_ms']:9.1f} {row['ortmodule_ms']:12.1f} {row['trainmodule_ms']:14.1f} "
              f"{row['speedup']:11.2f}x {row['speedup_best']:5.2f}x {row['torch_ms'] / row['trainmodule_ms']:7.2f}x  "
              f"{row['ortmodule_warmup_s']:9.1f} / {row['trainmodule_warmup_s']:<8.1f}  "
              f"{row['ortmodule_loss_rel_diff']:13.1e} / {row['trainmodule_loss_rel_diff']:<12.1e}  {ok}")
    print(f"target: TrainModule >= {TARGET_SPEEDUP:g}x faster than ORTModule per step")
    print("\nphases of the step, medians in ms (" + ", ".join(PHASES) + "): where the engines differ; torch's loss and "
          "AdamW run in every variant")
    for row in rows:
        for v in VARIANTS:
            print(f"{row['model']:6s} {v:12s} " + "  ".join(f"{p} {row[f'{v}_phases_ms'][p]:7.1f}" for p in PHASES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="measured steps per round")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json")
    # a worker process: one variant of one model
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, HERE)
    import peers
    from bench_vs_ort_training import machine_line
    from common import import_onnxtrain
    import_onnxtrain()  # fails early, with its hint, when onnxtrain is not built
    peers.ensure("ortmodule")
    print(f"TrainModule vs ORTModule ({peers.PACKAGES['ortmodule']}): {machine_line()}", flush=True)
    rows = [bench_model(m, args) for m in args.models.split(",") if m]
    report(rows, args)
    print(f"\nend: {machine_line()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
