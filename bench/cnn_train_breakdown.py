#!/usr/bin/env python3
"""Where a CNN train step's time goes, in onnxtrain and in PyTorch eager: both engines run their
convolutions through the same oneDNN (Debian's libdnnl.so.2, which torch links too), so oneDNN's
own per-primitive times (ONEDNN_VERBOSE=1: one line per executed primitive, with its time) say how
much of each step is convolution kernels, how much is reorders and pooling, and how much is
everything else (the engine's own kernels and overhead).

It answers the question behind issue 13's train-step target (at least 2.5x faster than torch):
how fast could a step be at all with these convolution kernels. Each engine runs in a fresh
process (the variable is read when oneDNN loads), the model and batch of bench_cnn.py's train step
(batch 16, AdamW), warm-up steps first, then the measured ones; reported per step are the step's
wall time (in a run without the verbose output, which slows torch's many small primitives several
times over) and oneDNN's times by primitive kind and direction (in a run with it).

    PYTHONPATH=build/python /usr/bin/python3 bench/cnn_train_breakdown.py [--threads 1] [--models resnet,mobilenetv2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_DIR, add_torch_argument, import_onnxtrain, median, run_torch_lanes, torch_description  # noqa: E402

TRAIN_BATCH = 16
MARK = "cnn_train_breakdown: measured steps begin"


def trainer(engine: str, name: str, workdir: str):
    import torch
    import models
    from bench_training import OnnxtrainTrainer, TorchTrainer
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = models.MobileNetV2(num_classes=10) if name == "mobilenetv2" else models.SmallResNet()
    image = 96 if name == "mobilenetv2" else 32
    x, target = torch.randn(TRAIN_BATCH, 3, image, image, generator=g), torch.randint(0, 10, (TRAIN_BATCH,), generator=g)
    if engine == "onnxtrain":
        return OnnxtrainTrainer(model, x, target, os.path.join(workdir, f"train_{name}"))
    keep_heap_blocks()
    return TorchTrainer(models.WithCrossEntropy(model).train(), x, target)


def keep_heap_blocks() -> None:
    """Torch at its best in this VM: its activations from glibc's heap, reused step after step,
    rather than fresh mappings whose page faults cost 15 us each here (a fresh process's ResNet
    step took 125 ms at 1 thread, 47 ms once an export had raised glibc's mmap threshold)."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest; also stops its dynamic adjustment
    libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)


def child(engine: str, name: str, threads: int, warmup: int, steps: int) -> None:
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(threads)
    ot.set_num_threads(threads)
    t = trainer(engine, name, tempfile.mkdtemp(prefix="cnn_breakdown_", dir=os.path.join(BENCH_DIR, "out")))
    for _ in range(warmup):
        t.step()
    sys.stdout.flush()
    print(MARK, flush=True)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        t.step()
        times.append(time.perf_counter() - start)
    sys.stdout.flush()
    print(json.dumps({"step_ms": 1e3 * median(times)}), flush=True)


def primitive_key(fields) -> str:
    """'convolution backward_weights', 'reorder', ... from a verbose exec line's fields."""
    kind, prop = fields[3], fields[5]
    if kind in ("convolution", "deconvolution", "pooling", "batch_normalization", "eltwise", "inner_product", "matmul"):
        return f"{kind} {prop}"
    return kind


def measure(engine: str, name: str, threads: int, warmup: int, steps: int, verbose: bool) -> dict:
    env = dict(os.environ)
    if verbose:
        # Every convolution through oneDNN, so that its verbose output times them all (by default
        # the full build runs small ones through its portable kernels: the ResNet's 8x8 stage).
        env.update(ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", ONNXTRAIN_KERNELS="library")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", engine, name, "--threads", str(threads),
                           "--warmup", str(warmup), "--steps", str(steps)],
                          capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine}/{name} failed: {proc.stderr.strip()[-400:]}")
    lines = proc.stdout.splitlines()
    begin = lines.index(MARK)
    ms = defaultdict(float)
    calls = defaultdict(int)
    result = {}
    for line in lines[begin + 1:]:
        if line.startswith("{"):
            result = json.loads(line)
            continue
        fields = line.split(",")
        if len(fields) < 6 or fields[0] not in ("onednn_verbose", "dnnl_verbose") or fields[1] != "exec":
            continue
        key = primitive_key(fields)
        ms[key] += float(fields[-1])
        calls[key] += 1
    result["onednn_ms"] = {k: v / steps for k, v in ms.items()}
    result["onednn_calls"] = {k: c / steps for k, c in calls.items()}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # One thread by default: there oneDNN's times add up to wall time in both engines. On two,
    # onnxtrain runs a convolution's backward-data and backward-weights side by side, each on one
    # thread (conv_dnnl.cc), so their sum is CPU time, above the wall time they take.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default="resnet,mobilenetv2")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    add_torch_argument(p)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child, args.threads, args.warmup, args.steps)
        return 0
    if not run_torch_lanes(args, argv):  # once per torch (--torch, both by default)
        return 0
    os.makedirs(os.path.join(BENCH_DIR, "out"), exist_ok=True)
    import torch  # noqa: F401  (torch_description reads the loaded torch)
    print(f"CNN train step breakdown against {torch_description()}: batch {TRAIN_BATCH}, {args.threads} threads, median of {args.steps} steps "
          f"after {args.warmup}; oneDNN times per step (ONEDNN_VERBOSE; the verbose output slows a step a little); "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.threads > 1:
        print("note: on more than one thread onnxtrain's backward-data and backward-weights run side by side, one thread "
              "each: their times add up to CPU time, not wall time, and the bound below is too low")
    for name in args.models.split(","):
        runs = {e: measure(e, name, args.threads, args.warmup, args.steps, verbose=True) for e in ("onnxtrain", "torch")}
        plain = {e: measure(e, name, args.threads, args.warmup, args.steps, verbose=False)["step_ms"] for e in ("onnxtrain", "torch")}
        print(f"\n{name}:")
        keys = sorted({k for r in runs.values() for k in r["onednn_ms"]}, key=lambda k: -max(r["onednn_ms"].get(k, 0) for r in runs.values()))
        print(f"  {'':34s} {'onnxtrain ms (calls)':>22s} {'torch ms (calls)':>20s}")
        for k in keys:
            cells = [f"{r['onednn_ms'].get(k, 0.0):8.2f} ({r['onednn_calls'].get(k, 0):5.0f})" for r in runs.values()]
            print(f"  {k:34s} {cells[0]:>22s} {cells[1]:>20s}")
        conv = {e: sum(v for k, v in r["onednn_ms"].items() if k.startswith("convolution")) for e, r in runs.items()}
        total = {e: sum(r["onednn_ms"].values()) for e, r in runs.items()}
        for e, r in runs.items():
            print(f"  {e:9s} step {plain[e]:7.2f} ms ({r['step_ms']:7.2f} ms with the verbose output): oneDNN convolutions "
                  f"{conv[e]:6.2f} ms, all oneDNN primitives {total[e]:6.2f} ms")
        need = plain["torch"] / 2.5
        print(f"  torch / onnxtrain step: {plain['torch'] / plain['onnxtrain']:.2f}x; 2.5x needs a step of {need:.2f} ms, and "
              f"onnxtrain's convolution kernels alone take {conv['onnxtrain']:.2f} ms: with every other op free, "
              f"{plain['torch'] / max(conv['onnxtrain'], 1e-9):.2f}x at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
