#!/usr/bin/env python3
"""onnxtrain against ONNX Runtime training (the seed system), side by side on the same files.

For each model of the zoo (bench/ort_zoo.py, its "bench" sizes: ``--models``, default all six)

* mlp         -- MLP 784-1024-1024-10, batch 64;
* digits_cnn  -- the demo's DigitsCNN, 1x8x8, batch 64 (Dropout ratio 0, so both engines compute
                 the same loss: the Dropout nodes stay in the graphs);
* resnet      -- the ResNet-18-shaped CNN with BatchNorm, widths 32-256, 3x32x32, batch 16;
* mobilenetv2 -- MobileNetV2 (width 1.0, 10 classes), 3x96x96, batch 16;
* bert        -- the BERT-style encoder (hidden 256, 4 layers, 4 heads, seq 128) + classifier, batch 8;
* gpt         -- the GPT-style decoder of the same size, vocab 8192, cross-entropy over 8x128 tokens,

the model is exported with Debian's torch in training mode, ONNX Runtime training 1.19.2 (the
`ort-training` peer) generates the artifacts once (cross-entropy loss, AdamW), and both engines
train those same files (training_model.onnx, optimizer_model.onnx, checkpoint) on the same batches:
``onnxruntime.training.api`` in the peer's interpreter and ``onnxtrain.api`` under this one. A step
is ``module(x, y)`` + ``optimizer.step()`` + ``module.lazy_reset_grad()``. Each engine runs in a
fresh process per round, rounds interleaved (the engine going first alternates), both with
``--threads`` intra-op threads (ORT: one inter-op thread, sequential execution); warm-up steps are
excluded. Reported per model: median step (over all measured steps) and best round (the lowest
round median) of each engine, onnxtrain's speed-up (ORT / onnxtrain; target: at least 2x), and the
relative difference of the two engines' first-step losses (from the same checkpoint and batch: it
says both trained the same artifacts). Where the speed-up is under the target, a profiled run of
each engine gives its kernel time per op type per step, warm-up excluded (onnxtrain: Module.profile()
with ONNXTRAIN_PROFILE=1, the training graph; ORT: SessionOptions.enable_profiling on its training
Module, the "kernel_time" events of its training and optimizer sessions' traces).

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_vs_ort_training.py [--threads 2] [--models bert,gpt] [--short]

Only ratios measured in the same run mean anything on a loaded machine; set OMP_WAIT_POLICY=passive
when other jobs share the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_SPEEDUP = 2.0  # ORT step time / onnxtrain step time, at least
ZOO = ["mlp", "digits_cnn", "resnet", "mobilenetv2", "bert", "gpt"]
NUM_BATCHES = 4       # distinct batches, cycled through by both engines


# --------------------------------------------------------------------------------------------------
# The worker: one engine, one process (stdlib and numpy at module level: the ORT peer runs it too)


def _ort_engine(art: str, threads: int, profile_dir: str):
    import onnxruntime as ort
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(profile_dir, "ort_profile")
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    # No eval model: ORT refuses its own eval model when it holds BatchNormalization.
    module = Module(os.path.join(art, "training_model.onnx"), state, session_options=options)
    if profile_dir:
        time.sleep(1.1)  # the optimizer's session takes the same options: its trace file needs another second
    optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    module.train()
    return ort.__version__, module, optimizer, (state,)


def _onnxtrain_engine(art: str, threads: int, profile_dir: str):
    import onnxtrain
    from onnxtrain.api import CheckpointState, Module, Optimizer
    onnxtrain.set_num_threads(threads)
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = Module(os.path.join(art, "training_model.onnx"), state)
    optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    return getattr(onnxtrain, "__version__", "dev"), module, optimizer, (state,)


def _by_type(profile) -> dict:
    """onnxtrain's Module.profile() rows summed per op type (microseconds)."""
    totals = {}
    for node in profile:
        totals[node["op_type"]] = totals.get(node["op_type"], 0.0) + node["total_us"]
    return totals


def _ort_profile_by_type(profile_dir: str, warmup: int) -> dict:
    """ORT's "kernel_time" events summed per op type, per step after the warm-up, from the trace
    files ORT writes when its sessions end (the training session's and the optimizer's): a file's
    runs are its "model_run" events, and kernels before its first measured run are left out."""
    by_type = {}
    for name in os.listdir(profile_dir):
        if not name.startswith("ort_profile") or not name.endswith(".json"):
            continue
        with open(os.path.join(profile_dir, name)) as f:
            text = f.read()
        events, decoder = [], json.JSONDecoder()
        for start in (m.start() for m in re.finditer(r'\{"cat" :', text)):  # event by event
            try:
                events.append(decoder.raw_decode(text, start)[0])
            except ValueError:
                pass
        runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
        if len(runs) <= warmup:
            continue
        cutoff, count = runs[warmup], len(runs) - warmup
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= cutoff:
                op = e.get("args", {}).get("op_name", "?")
                by_type[op] = by_type.get(op, 0.0) + e.get("dur", 0) / count / 1e3
    return by_type


def worker(args) -> None:
    import numpy as np
    data = np.load(os.path.join(args.art, "batches.npz"))
    profile_dir = ""
    if args.profile and args.worker == "ort":
        profile_dir = tempfile.mkdtemp(prefix="ort_profile_")
    elif args.profile:
        os.environ["ONNXTRAIN_PROFILE"] = "1"  # Module.profile(): the training graph's kernel times
    engine = _ort_engine if args.worker == "ort" else _onnxtrain_engine
    version, module, optimizer, keep = engine(args.art, args.threads, profile_dir)
    losses, times, optimizer_times, before = [], [], [], {}
    for k in range(args.warmup + args.steps):
        if k == args.warmup and args.profile and args.worker == "onnxtrain":
            before = _by_type(module.profile())
        x, y = data[f"x{k % NUM_BATCHES}"], data[f"y{k % NUM_BATCHES}"]
        start = time.perf_counter()
        loss = module(x, y)
        mid = time.perf_counter()
        optimizer.step()
        module.lazy_reset_grad()
        elapsed = time.perf_counter() - start
        if k >= args.warmup:
            optimizer_times.append((time.perf_counter() - mid) * 1e3)
        losses.append(float(np.asarray(loss)))
        if k >= args.warmup:
            times.append(elapsed * 1e3)
    report = {"version": version, "times_ms": times, "first_loss": losses[0], "losses": losses}
    if args.profile and args.worker == "ort":
        report["profile_dir"] = profile_dir  # ORT writes its traces when the process ends: the driver reads them
    elif args.profile:
        report["by_type_ms"] = {op: (us - before.get(op, 0.0)) / args.steps / 1e3
                                for op, us in _by_type(module.profile()).items()}
        # the fused update is no graph node: its wall time stands in for its kernels
        report["by_type_ms"]["(Optimizer.step)"] = statistics.mean(optimizer_times)
    print(json.dumps(report))


# --------------------------------------------------------------------------------------------------
# The driver


def _run_worker(engine: str, art: str, args, profile: bool = False) -> dict:
    import peers
    cmd = [os.path.abspath(__file__), "--worker", engine, "--art", art, "--threads", str(args.threads),
           "--warmup", str(args.warmup), "--steps", str(args.steps)] + (["--profile"] if profile else [])
    if engine == "ort":
        proc = peers.run("ort-training", cmd, timeout_s=args.timeout)
    else:
        import onnxtrain  # the worker imports the same build
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(onnxtrain.__file__)),
                                                        env.get("PYTHONPATH")) if p)
        proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{engine} failed: {lines[-1][:300] if lines else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prepare(name: str, workdir: str, optim: str = "adamw") -> str:
    """Exports the model, has ORT generate its artifacts and saves the batches; the artifact folder."""
    import numpy as np
    import peers
    import ort_zoo
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on BatchNorm counters and tracing
        path, params = ort_zoo.export(name, workdir, size="bench")
    art = os.path.join(workdir, f"{name}_artifacts")
    data = os.path.join(workdir, f"{name}_batches.npz")
    batches = ort_zoo.batches(name, NUM_BATCHES, size="bench")
    np.savez(data, **{f"x{k}": x for k, (x, _) in enumerate(batches)}, **{f"y{k}": y for k, (_, y) in enumerate(batches)})
    # steps 0: generation only (ORT_SCRIPT lists the graphs' ops and trains nothing).
    proc = peers.run("ort-training", ["-c", ort_zoo.ORT_SCRIPT, path, json.dumps(params), data, art, optim, "0"],
                     timeout_s=900)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"ORT's generate_artifacts failed: {lines[-1][:300] if lines else proc.returncode}")
    os.replace(data, os.path.join(art, "batches.npz"))
    return art


def bench_model(name: str, workdir: str, args) -> dict:
    row = {"model": name}
    try:
        art = prepare(name, workdir)
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return row
    runs = {"ort": [], "onnxtrain": []}
    errors = {}
    for r in range(args.rounds):
        for engine in (("ort", "onnxtrain") if r % 2 == 0 else ("onnxtrain", "ort")):
            if engine in errors:
                continue
            try:
                runs[engine].append(_run_worker(engine, art, args))
            except Exception as exc:  # noqa: BLE001
                errors[engine] = str(exc)
        print(f"    round {r + 1}/{args.rounds}: " + ", ".join(
            f"{e} {statistics.median(v[-1]['times_ms']):.2f} ms" for e, v in runs.items() if v and e not in errors),
              flush=True)
    for engine, rs in runs.items():
        if engine in errors:
            row[f"{engine}_error"] = errors[engine]
            continue
        times = [t for rep in rs for t in rep["times_ms"]]
        row[f"{engine}_ms"] = statistics.median(times)
        row[f"{engine}_best_ms"] = min(statistics.median(rep["times_ms"]) for rep in rs)
        row[f"{engine}_loss"] = rs[0]["first_loss"]
        row[f"{engine}_version"] = rs[0]["version"]
    if "ort_ms" in row and "onnxtrain_ms" in row:
        row["speedup"] = row["ort_ms"] / row["onnxtrain_ms"]
        row["speedup_best"] = row["ort_best_ms"] / row["onnxtrain_best_ms"]
        row["loss_rel_diff"] = abs(row["onnxtrain_loss"] - row["ort_loss"]) / max(abs(row["ort_loss"]), 1e-30)
        if args.profile_all or (row["speedup"] < TARGET_SPEEDUP and not args.no_profile):
            try:
                rep = _run_worker("ort", art, args, profile=True)
                row["ort_by_type"] = _ort_profile_by_type(rep["profile_dir"], args.warmup)
                row["ort_profiled_ms"] = statistics.mean(rep["times_ms"])
                profile_dir = rep["profile_dir"]
                shutil.rmtree(profile_dir, ignore_errors=True)
            except Exception as exc:  # noqa: BLE001
                row["ort_by_type_error"] = str(exc)
            try:
                rep = _run_worker("onnxtrain", art, args, profile=True)
                row["onnxtrain_by_type"] = rep["by_type_ms"]
                row["onnxtrain_profiled_ms"] = statistics.mean(rep["times_ms"])
            except Exception as exc:  # noqa: BLE001
                row["onnxtrain_by_type_error"] = str(exc)
    return row


def report(rows, args) -> None:
    print(f"\nstep = train_step + optimizer step + lazy_reset_grad, {args.threads} threads; "
          f"speed-up = ORT / onnxtrain (target: >= {TARGET_SPEEDUP:g}x); best = ratio of best round medians")
    print(f"{'model':12s} {'onnxtrain ms':>12s} {'ORT ms':>9s} {'speed-up':>8s} {'best':>6s}  {'loss rel diff':>13s}  status")
    for row in rows:
        name = row["model"]
        if "error" in row:
            print(f"{name:12s} ERROR {row['error']}")
            continue
        ot = f"{row['onnxtrain_ms']:12.2f}" if "onnxtrain_ms" in row else f"{'error':>12s}"
        ort = f"{row['ort_ms']:9.2f}" if "ort_ms" in row else f"{'error':>9s}"
        if "speedup" in row:
            ok = "met" if row["speedup"] >= TARGET_SPEEDUP else "NOT MET"
            print(f"{name:12s} {ot} {ort} {row['speedup']:7.2f}x {row['speedup_best']:5.2f}x  "
                  f"{row['loss_rel_diff']:13.1e}  {ok}")
        else:
            print(f"{name:12s} {ot} {ort}")
        for engine in ("onnxtrain", "ort"):
            if f"{engine}_error" in row:
                print(f"{'':12s}   {engine}: {row[engine + '_error']}")
    for row in rows:
        for engine in ("onnxtrain", "ort"):
            if f"{engine}_by_type_error" in row:
                print(f"\n{row['model']}: no {engine} breakdown: {row[engine + '_by_type_error']}")
        if "onnxtrain_by_type" not in row and "ort_by_type" not in row:
            continue
        ours, theirs = row.get("onnxtrain_by_type", {}), row.get("ort_by_type", {})
        print(f"\n{row['model']}: kernel ms per step by op type, profiled runs (onnxtrain: training graph, and "
              f"Optimizer.step's wall time; ORT: training and optimizer sessions)")
        print(f"  {'op type':34s} {'onnxtrain':>10s} {'ORT':>9s}")
        for op in sorted(set(ours) | set(theirs), key=lambda o: -max(ours.get(o, 0), theirs.get(o, 0)))[:args.top]:
            a = f"{ours[op]:10.3f}" if op in ours else f"{'-':>10s}"
            b = f"{theirs[op]:9.3f}" if op in theirs else f"{'-':>9s}"
            print(f"  {op:34s} {a} {b}")
        print(f"  {'total':34s} {sum(ours.values()):10.3f} {sum(theirs.values()):9.3f}")
        ours_step, theirs_step = row.get("onnxtrain_profiled_ms", float("nan")), row.get("ort_profiled_ms", float("nan"))
        print(f"  {'step (mean, profiled run)':34s} {ours_step:10.3f} {theirs_step:9.3f}")
        print(f"  {'outside kernels':34s} {ours_step - sum(ours.values()):10.3f} {theirs_step - sum(theirs.values()):9.3f}")


def machine_line() -> str:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; CPU {model}, {os.cpu_count()} logical; load average {load}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="measured steps per round")
    ap.add_argument("--short", action="store_true", help="2 rounds of 2 warm-up + 4 steps")
    ap.add_argument("--no-profile", action="store_true", help="no per-op breakdown where the target is missed")
    ap.add_argument("--profile-all", action="store_true", help="a per-op breakdown of every model")
    ap.add_argument("--top", type=int, default=12, help="op types shown in a breakdown")
    ap.add_argument("--timeout", type=float, default=900)
    # a worker process: one engine
    ap.add_argument("--worker", choices=["ort", "onnxtrain"], help=argparse.SUPPRESS)
    ap.add_argument("--art", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.short:
        args.rounds, args.warmup, args.steps = 2, 2, 4
    sys.path.insert(0, HERE)
    import peers
    from common import import_onnxtrain
    import_onnxtrain()  # fails early, with its hint, when onnxtrain is not built
    peers.ensure("ort-training")
    names = [n for n in args.models.split(",") if n]
    print(f"onnxtrain vs ONNX Runtime training ({peers.PACKAGES['ort-training']}): {machine_line()}")
    print(f"  {args.threads} threads, {args.rounds} rounds of {args.warmup} warm-up + {args.steps} steps per engine, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}", flush=True)
    import ort_zoo
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_vs_ort_training_") as workdir:
        for name in names:
            print(f"  {name}: {ort_zoo.DESCRIPTIONS.get(name, '?')}", flush=True)
            rows.append(bench_model(name, workdir, args))
    report(rows, args)
    print(f"\nend: {machine_line()}")


if __name__ == "__main__":
    main()
