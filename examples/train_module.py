#!/usr/bin/env python3
"""A plain PyTorch training script, sped up by one line: ``model = TrainModule(model)``.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_module.py [--steps 40] [--threads 2]

The script below is an ordinary PyTorch loop (a BERT-style classifier learning whether a sequence
starts with a token from the upper half of the vocabulary, torch.optim.AdamW, a cosine LR schedule
and gradient clipping). ``train()`` runs it twice from the same weights and batches: as written, and
with the one-line change marked below. It prints both runs' losses and step times; the first
TrainModule step includes exporting the model and building its graphs, reported separately.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
from common import import_onnxtrain  # noqa: E402
import models  # noqa: E402

VOCAB, SEQ, BATCH = 32, 64, 16


def make_batches(steps: int, seed: int = 0):
    """Token ids and labels: 1 when the first token is in the upper half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        labels = (ids[:, 0] >= VOCAB // 2).long()
        batches.append((ids, labels))
    return batches


def train(model: nn.Module, batches, use_onnxtrain: bool):
    """The user's training script. Returns (losses, per-step seconds)."""
    if use_onnxtrain:
        from onnxtrain.torch import TrainModule
        model = TrainModule(model)  # <- the one-line change
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(batches))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    losses, times = [], []
    for ids, labels in batches:
        start = time.perf_counter()
        loss = loss_fn(model(ids), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    stats = model.build_stats if use_onnxtrain else []
    return losses, times, stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    onnxtrain = import_onnxtrain()
    torch.set_num_threads(args.threads)  # the same threads for both runs
    onnxtrain.set_num_threads(args.threads)

    torch.manual_seed(0)
    cfg = models.BertConfig(vocab_size=VOCAB, hidden=128, layers=2, heads=4, ffn=512, max_len=SEQ)
    model = models.BertClassifier(cfg, num_classes=2)
    batches = make_batches(args.steps)

    plain_losses, plain_times, _ = train(copy.deepcopy(model), batches, use_onnxtrain=False)
    ot_losses, ot_times, stats = train(copy.deepcopy(model), batches, use_onnxtrain=True)

    print(f"{'step':>4} {'PyTorch loss':>13} {'TrainModule loss':>17}")
    for step in range(0, args.steps, max(1, args.steps // 8)):
        print(f"{step:4d} {plain_losses[step]:13.5f} {ot_losses[step]:17.5f}")
    plain_ms = statistics.median(plain_times[1:]) * 1e3
    ot_ms = statistics.median(ot_times[1:]) * 1e3
    worst = max(abs(a - b) / abs(b) for a, b in zip(ot_losses, plain_losses))
    print(f"\n{args.threads} threads, median of steps 2..{args.steps}:")
    print(f"  PyTorch       {plain_ms:7.1f} ms per step")
    print(f"  TrainModule   {ot_ms:7.1f} ms per step   ({plain_ms / ot_ms:.2f}x)")
    print(f"  first TrainModule step {ot_times[0]:.2f} s: export {stats[0]['export_s']:.2f} s + graph build "
          f"{stats[0]['build_s']:.2f} s, once per input shape")
    print(f"  largest relative loss difference over {args.steps} steps: {worst:.1e}")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
