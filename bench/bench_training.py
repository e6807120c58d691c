#!/usr/bin/env python3
"""Forward + backward step benchmark: onnxtrain's gradient graph against PyTorch eager.

For the BERT-style encoder (hidden 256, 4 layers, 4 heads, seq 128, batch 8, with a classifier
head) and the small CNN, each wrapped with a cross-entropy loss, it times one step that computes
the loss and every parameter's gradient:

* onnxtrain: the model exported from PyTorch in training mode, differentiated by
  onnxtrain.autodiff, run by InferenceSession (forward and backward in one planned graph);
* PyTorch: ``loss = module(x, y); loss.backward()`` (gradients zeroed between steps);
* ONNX Runtime: the forward (inference) of the same model, the bar a training step is held to
  (issue 3: fwd+bwd within 3.5x of ONNX Runtime's forward).

Also reports the memory planner's arena for the step next to PyTorch's peak RSS growth (measured
in a child process). Targets: >= 2.5x faster than PyTorch; <= 3.5x ORT's forward.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_training.py [--threads 2] [--models bert,cnn]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import import_onnxtrain, median, time_ms  # noqa: E402


def build(name: str, seed: int = 0):
    """The module with its loss, and example (x, target), for ``name``."""
    import torch
    from torch import nn

    import models

    class WithLoss(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.loss = nn.CrossEntropyLoss()

        def forward(self, x, target):
            return self.loss(self.model(x), target)

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if name == "bert":
        model = models.BertClassifier(models.BertConfig(), num_classes=2)
        x, target = torch.randint(0, 8192, (8, 128), generator=g), torch.randint(0, 2, (8,), generator=g)
    elif name == "cnn":
        model = models.SmallCNN()
        x, target = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    else:
        raise KeyError(name)
    return WithLoss(model), model, x, target


def export_training(module, x, target) -> bytes:
    import torch
    f = io.BytesIO()
    torch.onnx.export(module, (x, target), f, input_names=["x", "target"], output_names=["loss"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    return f.getvalue()


def torch_rss_growth(name: str, threads: int, steps: int) -> float:
    """Peak RSS growth (MiB) over ``steps`` training steps, measured in a fresh process."""
    code = f"""
import resource, sys, torch
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from bench_training import build
torch.set_num_threads({threads})
module, _, x, t = build({name!r})
module.train()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range({steps}):
    module.zero_grad(set_to_none=True)
    module(x, t).backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024.0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def ort_forward_ms(model, x, threads: int, runs: int, workdir: str) -> float:
    """Median ONNX Runtime forward time of the inference export, or NaN when ORT is missing."""
    import torch

    from bench_inference import EngineResult, OrtEngine
    engine = OrtEngine(threads, workdir, budget_s=5.0)
    if engine.unavailable:
        return float("nan")
    path = os.path.join(workdir, "forward.onnx")
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=17)
    np.save(os.path.join(workdir, "x.npy"), x.numpy())
    engine.prepare("m", path, [("x", os.path.join(workdir, "x.npy"))])
    result = EngineResult()
    engine.run("m", 3, runs, result)
    return median(result.times_ms)


def bench(name: str, args, workdir: str) -> dict:
    import torch

    ot = import_onnxtrain()
    from onnxtrain.autodiff import build_gradient_graph
    torch.set_num_threads(args.threads)
    module, model, x, target = build(name)
    module.train()
    data = export_training(module, x, target)
    params = [n for n, p in module.named_parameters() if p.requires_grad]
    grad_model = build_gradient_graph(data, params, ["loss"])
    sess = ot.InferenceSession(grad_model, num_threads=args.threads)
    feeds = {"x": x.numpy(), "target": target.numpy()}
    names = ["loss"] + [f"{p}_grad" for p in params]
    ot_loss = sess.run(names, feeds)[0]

    def torch_step():
        module.zero_grad(set_to_none=True)
        module(x, target).backward()

    row = {"model": name}
    row["torch_ms"] = median(time_ms(torch_step, 2, args.runs, args.budget))
    row["onnxtrain_ms"] = median(time_ms(lambda: sess.run(names, feeds), 2, args.runs, args.budget))
    row["loss_abs_err"] = float(abs(ot_loss - module(x, target).item()))
    row["ort_forward_ms"] = ort_forward_ms(model, x, args.threads, args.runs, workdir)
    row["speedup_vs_torch"] = row["torch_ms"] / row["onnxtrain_ms"]
    row["step_over_ort_forward"] = row["onnxtrain_ms"] / row["ort_forward_ms"]
    row["memory"] = sess.memory_report()
    row["torch_rss_growth_mib"] = torch_rss_growth(name, args.threads, 3)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--models", default="bert,cnn")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per engine and model")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models.split(","):
            try:
                rows.append(bench(name, args, workdir))
            except Exception as exc:  # one failing model must not hide the others
                rows.append({"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    print(f"\nforward+backward step, {args.threads} threads (targets: >= 2.5x faster than torch, "
          f"<= 3.5x ORT forward)")
    print(f"{'model':6} {'onnxtrain ms':>12} {'torch ms':>9} {'ORT fwd ms':>10} {'torch/ot':>8} {'ot/ORTfwd':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:6} ERROR {r['error']}")
            continue
        print(f"{r['model']:6} {r['onnxtrain_ms']:12.1f} {r['torch_ms']:9.1f} {r['ort_forward_ms']:10.1f} "
              f"{r['speedup_vs_torch']:8.2f} {r['step_over_ort_forward']:9.2f}")
    for r in rows:
        if "error" not in r:
            print(f"{r['model']}: onnxtrain {r['memory']}; torch peak RSS growth "
                  f"{r['torch_rss_growth_mib']:.1f} MiB; |loss difference| {r['loss_abs_err']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
