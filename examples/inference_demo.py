#!/usr/bin/env python3
"""onnxtrain inference demo: run PyTorch models exported to ONNX through onnxtrain and check the answers.

    make demo-inference  # or: PYTHONPATH=build/python python3 examples/inference_demo.py

For each model (an MLP, a small CNN with BatchNorm and a small BERT-style encoder, defined in
bench/models.py) it

1. exports the PyTorch model to ONNX (opset 17) under examples/out/,
2. runs it with ``onnxtrain.InferenceSession``, exactly as one would with ONNX Runtime,
3. asserts that the outputs match PyTorch's, and
4. prints the forward time of onnxtrain and of PyTorch on the same thread count.

It exits with status 1 when a model cannot run or does not match. The training demo is
examples/demo.py (``make demo``).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
from common import import_onnxtrain, median, time_ms  # noqa: E402
import models  # noqa: E402

OUT_DIR = os.path.join(REPO_ROOT, "examples", "out")


def demo_models():
    """(name, build function) pairs: small enough that the whole demo takes well under a minute."""
    small_bert = models.BertConfig(vocab_size=1000, hidden=128, layers=2, heads=4, ffn=512,
                                   max_len=64)
    return [
        ("mlp", "MLP 784-256-10, batch 32",
         lambda: models.build_mlp(seed=0, batch=32, sizes=(784, 256, 10)), ("input",), ("logits",)),
        ("cnn", "CNN conv-bn-relu x3 + pool + linear, 3x32x32, batch 8",
         lambda: models.build_cnn(seed=0, batch=8), ("input",), ("logits",)),
        ("small_bert", "BERT encoder h128 L2 H4, seq 64, batch 4",
         lambda: models.build_bert(seed=0, batch=4, seq=64, cfg=small_bert),
         ("input_ids",), ("hidden_states",)),
    ]


def run_one(onnxtrain, name, description, build, input_names, output_names, threads, runs):
    """Exports one model, runs it in onnxtrain and PyTorch, checks and times both.

    Returns True when onnxtrain's outputs match PyTorch's.
    """
    print(f"\n== {name}: {description}")
    model, inputs = build()
    path = os.path.join(OUT_DIR, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.export(model, inputs, path, input_names, output_names)
    print(f"exported {os.path.relpath(path, REPO_ROOT)} ({os.path.getsize(path) / 1e6:.1f} MB)")

    with torch.no_grad():
        expected = model(*inputs).numpy()

    try:
        sess = onnxtrain.InferenceSession(path, num_threads=threads)
        feeds = {arg.name: t.numpy() for arg, t in zip(sess.get_inputs(), inputs)}
        (actual,) = sess.run(None, feeds)
    except onnxtrain.Error as exc:
        print(f"onnxtrain cannot run it yet: {exc}")
        return False

    err = float(np.max(np.abs(actual - expected)))
    close = np.allclose(actual, expected, rtol=1e-3, atol=1e-4)
    print(f"inputs {[(a.name, a.shape, a.type) for a in sess.get_inputs()]}")
    print(f"output {sess.get_outputs()[0].name} {actual.shape}: max abs err vs PyTorch {err:.2e}"
          f" -> {'match' if close else 'MISMATCH'}")
    if not close:
        return False

    onnxtrain_ms = median(time_ms(lambda: sess.run(None, feeds), warmup=3, runs=runs, budget_s=5))
    with torch.no_grad():
        torch_ms = median(time_ms(lambda: model(*inputs), warmup=3, runs=runs, budget_s=5))
    print(f"forward, {threads} threads, median of {runs}: onnxtrain {onnxtrain_ms:.2f} ms, "
          f"PyTorch {torch_ms:.2f} ms ({torch_ms / onnxtrain_ms:.2f}x)")
    print(f"memory: {sess.memory_report()}")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)

    onnxtrain = import_onnxtrain()
    torch.set_num_threads(args.threads)
    os.makedirs(OUT_DIR, exist_ok=True)
    print(f"onnxtrain from {os.path.dirname(onnxtrain.__file__)}, torch {torch.__version__}")

    ok = [run_one(onnxtrain, *spec, threads=args.threads, runs=args.runs)
          for spec in demo_models()]
    print(f"\n{sum(ok)}/{len(ok)} models ran in onnxtrain and matched PyTorch")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
