#!/usr/bin/env python3
"""Data-parallel benchmark (src/distributed): the BERT-style encoder of bench/models.py (hidden
256, 4 layers, seq 128, global batch 8, classifier head, AdamW) trained by the on-device API.

1. **allreduce cost per step** with 2 ranks (mpirun -np 2, 1 thread each), reduced after the
   backward: the time the optimizer spends averaging gradients (pack, MPI allreduce, unpack; after
   a barrier, so waiting for the slower rank is not counted), the bytes each rank reduces, and the
   rates: algorithm bandwidth (bytes / time) and ring bus bandwidth (2 (N-1)/N x bytes / time, the
   bytes a ring moves per rank); for 25 MB and 4 MB buckets;
2. **overlap**: the step time (train step + optimizer step) of 2 ranks x 1 thread with each
   bucket reduced on the communication thread during the backward against reduced after it, for
   25 MB buckets (the encoder's 21 MB fill one, which is final only at the backward's end) and 4 MB
   buckets (6 buckets, the first final early in the backward), and the part of the allreduce the
   training thread still waited for;
3. **step time** of 2 ranks x 1 thread (each rank half the batch) against 1 rank x 2 threads (the
   whole batch). All configurations run interleaved round by round so the machine's load hits each.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_distributed.py [--steps 20] [--rounds 3]

The figures feed the scaling model in docs/DISTRIBUTED.md. Only ratios measured in the same run
mean anything on a loaded machine.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "oob_tcp_if_include", "lo", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY"]


def prepare(workdir: str) -> None:
    """Artifacts of the encoder with a classifier head, and a batch of data."""
    import numpy as np
    sys.path.insert(0, HERE)
    import torch
    from bench_training import build, parameter_names
    from onnxtrain import artifacts
    module, model, x, target = build("bert")
    f = io.BytesIO()  # a free batch dimension: each rank takes half of the batch
    torch.onnx.export(model, (x,), f, input_names=["x"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    data = f.getvalue()
    artifacts.generate_artifacts(data, requires_grad=parameter_names(model), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.AdamW(lr=1e-4), artifact_directory=workdir)
    np.savez(os.path.join(workdir, "batch.npz"), x=x.numpy(), y=target.numpy())
    del torch


def worker(workdir: str, steps: int, bucket_mb: float, overlap: bool, out: str) -> None:
    """Runs in every rank (or alone): `steps` train steps over this rank's share of the batch."""
    import numpy as np
    import onnxtrain.distributed as dist
    from onnxtrain.api import CheckpointState, Module, Optimizer
    world = dist.init()
    comm = None
    if world.size > 1:
        from mpi4py import MPI  # a barrier before the allreduce: rank skew is not allreduce cost
        comm = MPI.COMM_WORLD
    state = CheckpointState.load_checkpoint(os.path.join(workdir, "checkpoint"))
    module = Module(os.path.join(workdir, "training_model.onnx"), state, os.path.join(workdir, "eval_model.onnx"))
    opt = Optimizer(os.path.join(workdir, "optimizer_model.onnx"), module, data_parallel=world.size > 1,
                    bucket_bytes=int(bucket_mb * (1 << 20)), overlap=overlap)
    batch = np.load(os.path.join(workdir, "batch.npz"))
    local = len(batch["x"]) // world.size
    rows = slice(world.rank * local, (world.rank + 1) * local)
    x, y = batch["x"][rows], batch["y"][rows]
    times = []
    for s in range(steps + 2):  # two warmup steps
        t0 = time.perf_counter()
        module(x, y)
        if comm is not None:
            comm.Barrier()
        opt.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - t0)
        if s == 1:
            base = dict(opt.data_parallel_stats())
    stats = opt.data_parallel_stats()
    if world.rank == 0:
        n = stats["steps"] - base["steps"]
        with open(out, "w") as f:
            json.dump({"step_s": sorted(times[2:])[len(times[2:]) // 2],
                       "allreduce_s": (stats["seconds"] - base["seconds"]) / n if n else 0.0,
                       "wait_s": (stats["wait_seconds"] - base["wait_seconds"]) / n if n else 0.0,
                       "overlapped": stats["overlapped_steps"] - base["overlapped_steps"],
                       "bytes": (stats["bytes"] - base["bytes"]) // n if n else 0,
                       "calls": (stats["calls"] - base["calls"]) // n if n else 0,
                       "params": int(module.get_parameters_size())}, f)


def launch(workdir: str, ranks: int, threads: int, steps: int, bucket_mb: float, overlap: bool = False) -> dict:
    out = os.path.join(workdir, f"r{ranks}_t{threads}_b{bucket_mb}_o{int(overlap)}.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", workdir, "--steps", str(steps),
           "--bucket-mb", str(bucket_mb), "--overlap", str(int(overlap)), "--out", out]
    if ranks > 1:
        cmd = MPIRUN + ["-np", str(ranks)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--overlap", type=int, default=0)
    p.add_argument("--out")
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a.steps, a.bucket_mb, bool(a.overlap), a.out)
        return 0
    if shutil.which("mpirun") is None:
        print("bench_distributed: mpirun not found (scripts/install_deps.sh installs openmpi-bin); skipped")
        return 0
    import onnxtrain.distributed as dist
    if not dist.mpi_built():
        print("bench_distributed: onnxtrain was built without MPI; skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_dist_") as workdir:
        prepare(workdir)
        runs = {(mb, overlap): [] for mb in (25.0, 4.0) for overlap in (False, True)}
        one = []
        for _ in range(a.rounds):  # interleaved: every 2x1 configuration, then 1x2
            for (mb, overlap), rs in runs.items():
                rs.append(launch(workdir, 2, 1, a.steps, mb, overlap))
            one.append(launch(workdir, 1, 2, a.steps, 25.0))
    med = lambda rs, k: sorted(r[k] for r in rs)[len(rs) // 2]  # noqa: E731
    two = runs[(25.0, False)]
    nbytes, ar = two[0]["bytes"], med(two, "allreduce_s")
    print(f"BERT-style encoder: {two[0]['params'] / 1e6:.2f} M parameters, {nbytes / 1e6:.1f} MB of gradients "
          f"per rank per step; global batch 8 (seq 128); {a.rounds} rounds x {a.steps} steps, medians")
    print(f"2 ranks x 1 thread, reduced after the backward: allreduce {ar * 1e3:.2f} ms/step in {two[0]['calls']} "
          f"call(s) (25 MB buckets): {nbytes / ar / 1e9:.2f} GB/s algorithm bandwidth, {nbytes / ar / 1e9:.2f} GB/s "
          f"ring bus bandwidth (2(N-1)/N = 1 at N = 2)")
    t4 = med(runs[(4.0, False)], "allreduce_s")
    print(f"  4 MB buckets: {runs[(4.0, False)][0]['calls']} calls, {t4 * 1e3:.2f} ms/step, {nbytes / t4 / 1e9:.2f} GB/s")
    summary = {}
    for mb in (25.0, 4.0):
        off, on = runs[(mb, False)], runs[(mb, True)]
        s_off, s_on = med(off, "step_s"), med(on, "step_s")
        ratios = sorted(b["step_s"] / o["step_s"] for b, o in zip(off, on))
        w_on, busy_on = med(on, "wait_s"), med(on, "allreduce_s")
        print(f"overlap, {mb:g} MB buckets ({on[0]['calls']} per step): step {s_off * 1e3:.1f} ms reduced after the "
              f"backward, {s_on * 1e3:.1f} ms overlapped (per-round speed-ups {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {ratios[len(ratios) // 2]:.2f}x); overlapped: allreduce {busy_on * 1e3:.1f} ms on the "
              f"communication thread, {w_on * 1e3:.1f} ms of it waited for after the backward "
              f"({on[0]['overlapped']} of {a.steps + 2 - 2} steps overlapped)")
        summary[str(mb)] = {"step_blocking_s": s_off, "step_overlap_s": s_on, "speedup": ratios[len(ratios) // 2],
                            "overlap_busy_s": busy_on, "overlap_wait_s": w_on}
    s2, s1 = med(two, "step_s"), med(one, "step_s")
    print(f"step time: 2 ranks x 1 thread {s2 * 1e3:.1f} ms (allreduce {100 * ar / s2:.1f}% of it), "
          f"1 rank x 2 threads {s1 * 1e3:.1f} ms; ratio 2x1 / 1x2 = {s2 / s1:.2f}")
    print("json " + json.dumps({"params": two[0]["params"], "bytes": nbytes, "allreduce_s": ar, "step_2x1_s": s2,
                                "step_1x2_s": s1, "allreduce_4mb_s": t4, "overlap": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
