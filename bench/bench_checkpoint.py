#!/usr/bin/env python3
"""Checkpoint load and save speed: onnxtrain in its own format and in ONNX Runtime's, against ONNX
Runtime training 1.19.2's own CheckpointState.load_checkpoint / save_checkpoint (the `ort-training`
peer, a long-lived subprocess so its start-up is not timed), on one checkpoint of --params float32
parameters (default 100M, in --tensors tensors), optionally with AdamW's two moments.

Rounds are interleaved (each round times every contender once, in a shuffled order) and the medians
are printed. Loads allocate their tensors in 2 MiB pages (src/core/memory.h); when the kernel must
compact memory to find them (after another contender's page-cache writes), a load takes several
hundred ms instead of tens: the min-max range shows it. Files are in the page cache for every contender alike (each is read once before
timing). onnxtrain's saves are atomic: temporary file, fsync, rename, fsync of the directory; ONNX
Runtime's save writes the file in place with no fsync, so a save figure is shown both as measured
and, for onnxtrain, with the fsync time that ORT does not pay measured separately (--no-fsync-note
hides it).

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_checkpoint.py [--params 100e6] [--rounds 5]
                                                                         [--with-optimizer] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from common import import_onnxtrain, median  # noqa: E402

ORT_SERVER = textwrap.dedent("""
    import sys, time, json
    from onnxruntime.training.api import CheckpointState
    import onnxruntime
    print(json.dumps({"version": onnxruntime.__version__}), flush=True)
    state = None
    for line in sys.stdin:
        cmd, path = line.split(maxsplit=1)
        path = path.strip()
        t = time.perf_counter()
        if cmd == "load":
            state = None
            state = CheckpointState.load_checkpoint(path)
        else:
            CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
        print(json.dumps({"s": time.perf_counter() - t}), flush=True)
""")


class OrtServer:
    def __init__(self):
        python = peers.ensure("ort-training")
        self.proc = subprocess.Popen([python, "-c", ORT_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.version = json.loads(self.proc.stdout.readline())["version"]

    def time(self, cmd, path):
        self.proc.stdin.write(f"{cmd} {path}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ORT peer died on '{cmd} {path}'")
        return json.loads(line)["s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--tensors", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--with-optimizer", action="store_true", help="add AdamW's two moments per parameter")
    ap.add_argument("--seed", type=int, default=0, help="of the order contenders run in each round")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary directory)")
    args = ap.parse_args()
    onnxtrain = import_onnxtrain()
    from onnxtrain import _C
    from onnxtrain.api import CheckpointState

    n = int(args.params) // args.tensors
    rng = np.random.default_rng(0)
    raw = _C.CheckpointState()
    for i in range(args.tensors):
        raw.add_parameter(f"layer{i}.weight", rng.standard_normal(n, dtype=np.float32).reshape(-1, 1000), True)
        if args.with_optimizer:
            raw.set_optimizer_tensor(f"layer{i}.weight", "exp_avg", rng.standard_normal(n, dtype=np.float32).reshape(-1, 1000))
            raw.set_optimizer_tensor(f"layer{i}.weight", "exp_avg_sq", rng.random(n, dtype=np.float32).reshape(-1, 1000))
    if args.with_optimizer:
        raw.optimizer_step = 10
        raw.optimizer_learning_rate = 1e-3
    state = CheckpointState(raw)
    total = args.tensors * n * 4 * (3 if args.with_optimizer else 1)

    tmp = tempfile.TemporaryDirectory(dir=args.dir)
    d = tmp.name
    ort_file, ours_file = os.path.join(d, "ort.ckpt"), os.path.join(d, "ours.ckpt")
    CheckpointState.save_checkpoint(state, ort_file, include_optimizer_state=True, format="ort")
    CheckpointState.save_checkpoint(state, ours_file, include_optimizer_state=True)
    for f in (ort_file, ours_file):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    ort = OrtServer()
    ort.time("load", ort_file)  # ORT's first load (its allocator, the file into the page cache)

    def timed(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    contenders = {
        "onnxtrain load (ort format)": lambda: timed(lambda: CheckpointState.load_checkpoint(ort_file)),
        "onnxtrain load (onnxtrain format)": lambda: timed(lambda: CheckpointState.load_checkpoint(ours_file)),
        "ORT load (ort format)": lambda: ort.time("load", ort_file),
        "onnxtrain save (ort format)": lambda: timed(lambda: CheckpointState.save_checkpoint(
            state, os.path.join(d, "o1"), include_optimizer_state=True, format="ort")),
        "onnxtrain save (onnxtrain format)": lambda: timed(lambda: CheckpointState.save_checkpoint(
            state, os.path.join(d, "o2"), include_optimizer_state=True)),
        "ORT save (ort format)": lambda: ort.time("save", os.path.join(d, "o3")),
    }
    # fsync alone, on a file of the same size already written: what onnxtrain's atomic save adds.
    def fsync_only():
        path = os.path.join(d, "fs")
        with open(path, "wb") as f:
            f.truncate(0)
            f.write(open(ours_file, "rb").read())
            t = time.perf_counter()
            os.fsync(f.fileno())
            return time.perf_counter() - t
    contenders["(fsync of a file that size)"] = fsync_only

    times = {k: [] for k in contenders}
    names = list(contenders)
    shuffle = np.random.default_rng(args.seed)
    for r in range(args.rounds):
        # A fresh order every round: what runs just before a contender (another's page-cache
        # writes, freed memory) changes its time, so no contender keeps one neighbour.
        for i in shuffle.permutation(len(names)):
            times[names[i]].append(contenders[names[i]]())
    ort.close()

    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if line.startswith("Model name")), "?")
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {cpu}, load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, onnxruntime-training {ort.version}")
    print(f"checkpoint: {args.tensors} float32 tensors, {args.tensors * n / 1e6:.0f}M parameters"
          f"{' + AdamW moments' if args.with_optimizer else ''}, {total / 2**20:.0f} MiB of tensors; "
          f"{args.rounds} interleaved rounds, medians (min-max) in ms, files in the page cache")
    ort_load, ort_save = median(times["ORT load (ort format)"]), median(times["ORT save (ort format)"])
    for k in names:
        m = median(times[k])
        ref = ort_load if "load" in k else ort_save
        ratio = "" if k.startswith("(") else f"  {m / ref:5.2f}x ORT's time"
        print(f"  {k:36s} {m * 1e3:8.1f} ({min(times[k]) * 1e3:.1f}-{max(times[k]) * 1e3:.1f}){ratio}"
              f"  {total / m / 2**30:5.2f} GiB/s")


if __name__ == "__main__":
    main()
