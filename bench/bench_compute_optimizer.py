#!/usr/bin/env python3
"""Compute optimizer benchmark: a TrainModule step of the BERT-style classifier (head on token 0,
hidden 256, 4 layers, batch 8 x 128) with ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER on and off.

With it on, the head's `h[:, 0]` moves upstream, so the last layer's FFN, LayerNorms and its
attention's query row (Q projection, scores, softmax, context, output projection) run on one row
per sequence, forward and backward. Both variants train copies of the same model on the same batch
in one process, their steps interleaved; per-step time is the median (and minimum) of the steps
after two warm-up steps, and the losses must agree.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_compute_optimizer.py [--threads 2] [--steps 15]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import import_onnxtrain, median  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()

    import torch
    import models
    onnxtrain = import_onnxtrain()
    from onnxtrain.torch import TrainModule

    torch.set_num_threads(args.threads)
    onnxtrain.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = models.BertClassifier(models.BertConfig())
    ids = torch.randint(1, 1000, (8, 128))
    labels = torch.randint(0, 2, (8,))

    variants = {}
    for flag in ("1", "0"):  # the setting is read when the module exports its graphs
        os.environ["ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER"] = flag
        model = TrainModule(copy.deepcopy(base))
        optimizer = torch.optim.AdamW(model.parameters(), 1e-4)

        def step(model=model, optimizer=optimizer):
            loss = torch.nn.functional.cross_entropy(model(ids), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.item()

        losses = [step(), step()]
        variants[flag] = (step, [], losses)
    for _ in range(args.steps):
        for step, times, losses in variants.values():
            start = time.perf_counter()
            losses.append(step())
            times.append(1e3 * (time.perf_counter() - start))

    on, off = variants["1"], variants["0"]
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(on[2], off[2]))
    print(f"BERT-style classifier, TrainModule step, {args.threads} threads, {args.steps} steps each")
    for name, (_, times, _) in (("compute optimizer on", on), ("compute optimizer off", off)):
        print(f"  {name:22s} median {median(times):7.1f} ms   min {min(times):7.1f} ms")
    print(f"  off / on: {median(off[1]) / median(on[1]):.2f}x   (losses agree within {worst:.1e} relative)")
    if worst > 1e-4:
        sys.exit(f"the losses of the two variants differ by {worst:.1e} relative")


if __name__ == "__main__":
    main()
