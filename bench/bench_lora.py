#!/usr/bin/env python3
"""Quantized LLM fine-tuning benchmarks (issue 14), on the example model (examples/tiny_llm.py,
22M parameters, GenAI-builder layout):

1. MatMulNBits forward (int4, block 32) against ONNX Runtime (npm onnxruntime-node), on the
   example's projection shapes, for one token and for a 512-token prompt (batch 1).
2. Training tokens/s: onnxtrain int4 base + LoRA (rank 8 on q/k/v/o/gate/up/down) against PyTorch
   eager LoRA on the fp32 base (frozen base, the same adapters, the same threads).
3. Peak memory of int4 + LoRA fine-tuning against full fp32 fine-tuning (AdamW), same batch and
   sequence: the artifacts are generated here, then a fresh process loads them and trains 3 steps;
   its peak RSS growth over its RSS after imports is the figure.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_lora.py [--threads 2] [--quick]

Prints ratios measured in the same run; rounds alternate between engines.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "examples"))
from common import import_onnxtrain, median  # noqa: E402
from tiny_llm import Config, build_model, init_weights  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def nbits_model(k, n, block=32, seed=0):
    from onnx import TensorProto, helper, numpy_helper
    ot = import_onnxtrain()
    from onnxtrain.quantize import quantize_model
    w = (np.random.default_rng(seed).standard_normal((k, n)) * 0.02).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name="/proj/MatMul")], "mm",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "s", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "s", n])],
                          initializer=[numpy_helper.from_array(w, "W")])
    data, _ = quantize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), 4, block)
    del ot
    return data


def bench_matmul_nbits(args, workdir):
    ot = import_onnxtrain()
    cfg = Config()
    shapes = [(cfg.hidden, cfg.hidden), (cfg.hidden, cfg.intermediate), (cfg.intermediate, cfg.hidden)]
    print(f"MatMulNBits forward (int4, block 32), {args.threads} threads: ms, median (min); ratio = ORT / ours")
    print(f"{'K x N':>12} {'M':>5} {'onnxtrain':>18} {'ORT':>18} {'ratio':>13}")
    rows = []
    for k, n in shapes:
        path = os.path.join(workdir, f"nbits_{k}x{n}.onnx")
        with open(path, "wb") as f:
            f.write(nbits_model(k, n))
        ot.set_num_threads(args.threads)
        sess = ot.InferenceSession(path)
        for m in (1, 512):
            a = np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)
            apath = os.path.join(workdir, f"a_{k}_{m}.npy")
            np.save(apath, a)
            ours, theirs = [], []
            runs = 200 if m == 1 else 20
            for _ in range(3):  # interleaved rounds
                for _ in range(3):
                    sess.run(None, {"A": a})
                for _ in range(runs):
                    t = time.perf_counter()
                    sess.run(None, {"A": a})
                    ours.append(1e3 * (time.perf_counter() - t))
                proc = subprocess.run(["node", os.path.join(HERE, "ort_runner.js"), "--model", path, "--input",
                                       f"A={apath}", "--threads", str(args.threads), "--warmup", "3", "--runs",
                                       str(runs)], capture_output=True, text=True, cwd=HERE, timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr.strip().splitlines()[0])
                theirs += json.loads(proc.stdout.strip().splitlines()[-1])["times_ms"]
            o, t = median(ours), median(theirs)
            om, tm = min(ours), min(theirs)
            rows.append((k, n, m, o, t))
            print(f"{k:>5} x {n:<5} {m:>5} {o:>9.3f} ({om:6.3f}) {t:>9.3f} ({tm:6.3f}) {t / o:5.2f}x ({tm / om:4.2f}x)")
    return rows


def bench_tokens(args):
    import torch
    ot = import_onnxtrain()
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer
    from onnxtrain.quantize import quantize_model
    from tiny_llm import byte_windows, torch_lm
    torch.set_num_threads(args.threads)
    ot.set_num_threads(args.threads)
    cfg = Config()
    weights = init_weights(cfg)
    int4, _ = quantize_model(build_model(cfg, weights), 4, 32)
    with tempfile.TemporaryDirectory() as d:
        artifacts.generate_artifacts(int4, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=d,
                                     lora=artifacts.LoraConfig(rank=8, alpha=16, target=TARGETS))
        state = CheckpointState.load_checkpoint(os.path.join(d, "checkpoint"))
        module = Module(os.path.join(d, "training_model.onnx"), state)
        opt = Optimizer(os.path.join(d, "optimizer_model.onnx"), module)
        model = torch_lm(cfg, weights, lora_rank=8, lora_alpha=16, targets=TARGETS)
        topt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        rng = np.random.default_rng(0)
        batches = [byte_windows(bytes(range(256)) * 64, args.seq, rng, args.batch) for _ in range(4)]

        def ours(x, y):
            module(x, y)
            opt.step()
            module.lazy_reset_grad()

        def theirs(x, y):
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            topt.step()
            topt.zero_grad()

        times = {"ours": [], "torch": []}
        for rnd in range(args.rounds):
            for name, fn in (("ours", ours), ("torch", theirs)):
                for i, (x, y) in enumerate(batches):
                    t = time.perf_counter()
                    fn(x, y)
                    if rnd or i:  # the first step of each engine warms up
                        times[name].append(time.perf_counter() - t)
    tok = args.batch * args.seq
    o, t = tok / median(times["ours"]), tok / median(times["torch"])
    print(f"\nLoRA training step, batch {args.batch} x seq {args.seq}, {args.threads} threads: tokens/s")
    print(f"  onnxtrain int4 + LoRA   {o:8.0f}")
    print(f"  PyTorch eager fp32 LoRA {t:8.0f}")
    print(f"  ratio {o / t:.2f}x (target >= 2x)")
    return o, t


CHILD = r"""
import os, sys, json
sys.path.insert(0, {examples!r}); sys.path.insert(0, {bench!r})
import numpy as np
from common import import_onnxtrain
ot = import_onnxtrain()
from onnxtrain.api import CheckpointState, Module, Optimizer
from tiny_llm import byte_windows
ot.set_num_threads({threads})
d = {dir!r}
open("/proc/self/clear_refs", "w").write("5")   # resets VmHWM (peak RSS) to the current RSS
base = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
state = CheckpointState.load_checkpoint(os.path.join(d, "checkpoint"))
module = Module(os.path.join(d, "training_model.onnx"), state)
opt = Optimizer(os.path.join(d, "optimizer_model.onnx"), module)
rng = np.random.default_rng(0)
for _ in range(3):
    x, y = byte_windows(bytes(range(256)) * 64, {seq}, rng, {batch})
    module(x, y); opt.step(); module.lazy_reset_grad()
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({{"peak_bytes": hwm - base}}))
"""


def make_training_artifacts(d, lora):
    """Artifacts of the example model: full fp32 fine-tuning (AdamW on every weight) or int4 + LoRA."""
    import_onnxtrain()
    from onnxtrain import artifacts
    from onnxtrain.quantize import quantize_model
    cfg = Config()
    weights = init_weights(cfg)
    model = build_model(cfg, weights)
    if lora:
        data, _ = quantize_model(model, 4, 32)
        artifacts.generate_artifacts(data, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=d,
                                     lora=artifacts.LoraConfig(rank=8, alpha=16, target=TARGETS))
    else:
        artifacts.generate_artifacts(model, requires_grad=list(weights), loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=d)


def bench_memory(args):
    """Peak RSS growth of a training step, in a fresh process per run, for each batch x seq."""
    out = []
    for batch, seq in [(1, args.seq), (args.batch, args.seq)]:
        results = {}
        for lora in (False, True):
            with tempfile.TemporaryDirectory() as d:
                make_training_artifacts(d, lora)  # here: the child process only loads and trains
                code = CHILD.format(examples=os.path.join(REPO, "examples"), bench=HERE, threads=args.threads, dir=d,
                                    seq=seq, batch=batch)
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr)
                results[lora] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"]
        full, lora = results[False], results[True]
        print(f"\nPeak memory of training (module + optimizer + 3 steps), batch {batch} x seq {seq}:")
        print(f"  full fp32 fine-tuning (AdamW)  {full / 2**20:8.1f} MiB")
        print(f"  int4 + LoRA                    {lora / 2**20:8.1f} MiB")
        print(f"  ratio {100 * lora / full:.1f}% (target <= 35%)")
        out.append((batch, seq, full, lora))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated: matmul,tokens,memory")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as work:
        if "matmul" not in skip:
            bench_matmul_nbits(args, work)
    if "tokens" not in skip:
        bench_tokens(args)
    if "memory" not in skip:
        bench_memory(args)


if __name__ == "__main__":
    main()
