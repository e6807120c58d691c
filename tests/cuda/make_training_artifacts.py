#!/usr/bin/env python3
"""Training artifacts of small BERT-style, GPT-style and ResNet-style models, with their batches,
for the GPU training test (tests/cuda/training_test.cc: a Module on the GPU follows the CPU's loss
curve). The lent GPU machine has no full build to generate them, so `scripts/gpu_check.sh
--prepare` writes them here and the check carries them there.

    PYTHONPATH=build/python /usr/bin/python3 tests/cuda/make_training_artifacts.py OUT_DIR

Writes OUT_DIR/<model>/ (training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint,
batches.npz with x0, t0, ..., x3, t3: four batches of random inputs and targets, which the test
cycles through, so that the loss falls as the model learns them) for bert, gpt and resnet, and
OUT_DIR/ops.txt, the op types of all their graphs, one a line (the minimal build's op list).
Deterministic: seed 0 for weights and batches.
"""
import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_training  # noqa: E402  (the training-mode export)
import models  # noqa: E402

# Small enough to carry (the checkpoints together are under 2 MB) and to train 50 steps on a CPU
# in seconds, large enough that every kind of op of the full-size models is there.
TRANSFORMER = models.BertConfig(vocab_size=512, hidden=64, layers=2, heads=2, ffn=128, max_len=32)


class FlatLogits(nn.Module):
    """A language model's logits (B, S, V) as token rows (B * S, V): the artifacts' cross-entropy
    takes [N, C] scores and [N] labels."""

    def __init__(self, model: nn.Module, vocab: int):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).reshape(-1, self.vocab)


BATCHES = 4
# AdamW's learning rate. At 1e-3 the ResNet's training is chaotic on these batches: parameters
# perturbed by 1e-7 gave loss curves 4e-6 to 4e-2 apart by step 50, depending on the draw, so no
# two implementations could be held to 1e-4; at 3e-4 six draws stayed within 2e-6 and the loss
# still falls from 2.75 to 0.89 (2026-11-28).
LR = {"bert": 1e-3, "gpt": 1e-3, "resnet": 3e-4}


def cases():
    """(name, model, batches: [(input, target)]) for each model."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    cfg = TRANSFORMER
    bert = models.BertClassifier(cfg, num_classes=3)
    yield "bert", bert, [(torch.randint(0, cfg.vocab_size, (4, 32), generator=g), torch.randint(0, 3, (4,), generator=g))
                         for _ in range(BATCHES)]
    gpt = FlatLogits(models.GPTDecoder(cfg), cfg.vocab_size)
    yield "gpt", gpt, [(torch.randint(0, cfg.vocab_size, (4, 32), generator=g),
                        torch.randint(0, cfg.vocab_size, (4 * 32,), generator=g)) for _ in range(BATCHES)]
    resnet = models.SmallResNet(widths=(8, 16, 16, 32), num_classes=10)
    yield "resnet", resnet, [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
                             for _ in range(BATCHES)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    args = parser.parse_args()
    from onnxtrain import artifacts

    ops = set()
    for name, model, batches in cases():
        model.train()
        directory = os.path.join(args.out, name)
        data = bench_training.export_training(model, (batches[0][0],), ["x"], ["logits"])
        artifacts.generate_artifacts(data, requires_grad=bench_training.parameter_names(model),
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=LR[name]),
                                     artifact_directory=directory)
        arrays = {}
        for i, (x, t) in enumerate(batches):
            arrays[f"x{i}"], arrays[f"t{i}"] = x.numpy(), t.numpy()
        np.savez(os.path.join(directory, "batches.npz"), **arrays)  # stored, not deflated: the minimal build reads it
        with open(os.path.join(directory, "ops.txt")) as f:
            ops.update(line.strip() for line in f if line.strip() and not line.startswith("#"))
        print(f"make_training_artifacts: {name} -> {directory}")
    with open(os.path.join(args.out, "ops.txt"), "w") as f:
        f.write("".join(op + "\n" for op in sorted(ops)))


if __name__ == "__main__":
    main()
