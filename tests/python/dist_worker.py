"""Run by tests/python/test_distributed.py, alone or under mpirun: trains artifacts with the
Python on-device API, Optimizer(data_parallel=True) under mpirun.

    dist_worker.py ARTIFACTS DATA.npz OUT.npz GLOBAL_BATCH STEPS ACCUM [blocking]

Micro-batch g covers rows [g*B, (g+1)*B) (wrapping); rank r of N takes its r-th B/N of them. Rank
0 writes the trained parameters and the losses (the global batch's: averaged over ranks). The
allreduce overlaps the last micro-batch's backward unless "blocking" is given."""
import os
import sys

import numpy as np

import onnxtrain.distributed as dist
from onnxtrain.api import CheckpointState, Module, Optimizer


def main():
    art, data, out = sys.argv[1:4]
    batch, steps, accum = map(int, sys.argv[4:7])
    world = dist.init()
    local = batch // world.size
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module, data_parallel=world.size > 1,
                          bucket_bytes=4096, check_every=10, overlap=sys.argv[7:8] != ["blocking"],
                          gradient_accumulation_steps=accum)
    d = np.load(data)
    x, y = d["x"], d["y"]
    losses = []
    for s in range(steps):
        for k in range(accum):
            g = s * accum + k
            rows = (g * batch + world.rank * local + np.arange(local)) % len(x)
            losses.append(float(module(x[rows], y[rows])))
        optimizer.step()
        module.lazy_reset_grad()
    if world.rank == 0:
        params = {n: p.data for n, p in state.parameters if p.requires_grad}
        np.savez(out, losses=np.array(losses), **{"p_" + n: v for n, v in params.items()},
                 stats=np.array([optimizer.data_parallel_stats()[k] for k in ("steps", "calls", "bytes", "overlapped_steps")]))


if __name__ == "__main__":
    main()
