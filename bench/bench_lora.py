#!/usr/bin/env python3
"""Quantized LLM fine-tuning benchmarks (issue 14), on the example model (examples/tiny_llm.py,
22M parameters, GenAI-builder layout):

1. MatMulNBits forward (int4, block 32) against ONNX Runtime (the `ort` peer, onnxruntime 1.31), on the
   example's projection shapes, for one token and for a 512-token prompt (batch 1).
2. Training tokens/s: onnxtrain int4 base + LoRA (rank 8 on q/k/v/o/gate/up/down) against PyTorch
   eager LoRA on the fp32 base (frozen base, the same adapters), both at --threads threads and at
   one thread; each engine trains in its own process (onnxtrain with the example's recompute plan).
3. Peak memory of int4 + LoRA fine-tuning against full fp32 fine-tuning (AdamW), same batch and
   sequence (batch 1 and --batch at --seq, and the example's batch 8 x seq 64): the artifacts are
   generated here, then a fresh process loads them and trains 3 steps; its peak RSS growth over
   its RSS after imports is the figure. int4 + LoRA is measured as the example generates it (the
   SwiGLU intermediates recomputed, examples/lora_finetune.py's MEMORY_OPT_CONFIG) and with every
   activation stashed.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_lora.py [--threads 2] [--skip matmul,tokens,memory]
    short (memory only, about 2 minutes): ... bench/bench_lora.py --skip matmul,tokens --rounds 1

Prints ratios measured in the same run (rounds alternate between engines) and, last, each target.
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
import peers  # noqa: E402
from common import add_torch_argument, import_onnxtrain, median, run_torch_lanes, torch_description  # noqa: E402
from lora_finetune import MEMORY_OPT_CONFIG  # noqa: E402
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
                proc = peers.run("ort", [peers.ORT_RUNNER, "--model", path, "--input", f"A={apath}", "--threads",
                                         str(args.threads), "--warmup", "3", "--runs", str(runs)])
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr.strip().splitlines()[0])
                theirs += json.loads(proc.stdout.strip().splitlines()[-1])["times_ms"]
            o, t = median(ours), median(theirs)
            om, tm = min(ours), min(theirs)
            rows.append((k, n, m, o, t))
            print(f"{k:>5} x {n:<5} {m:>5} {o:>9.3f} ({om:6.3f}) {t:>9.3f} ({tm:6.3f}) {t / o:5.2f}x ({tm / om:4.2f}x)")
    return rows


# One engine's training steps in a fresh process (so neither engine's thread pools, spinning
# OpenMP workers or BLAS threads run beside the other's): prints the step times in seconds.
STEPS_CHILD = r"""
import os, sys, json, time
sys.path.insert(0, {examples!r}); sys.path.insert(0, {bench!r})
import numpy as np
from tiny_llm import byte_windows
rng = np.random.default_rng(0)
batches = [byte_windows(bytes(range(256)) * 64, {seq}, rng, {batch}) for _ in range(4)]
if {engine!r} == "onnxtrain":
    from common import import_onnxtrain
    ot = import_onnxtrain()
    from onnxtrain.api import CheckpointState, Module, Optimizer
    ot.set_num_threads({threads})
    state = CheckpointState.load_checkpoint(os.path.join({dir!r}, "checkpoint"))
    module = Module(os.path.join({dir!r}, "training_model.onnx"), state)
    opt = Optimizer(os.path.join({dir!r}, "optimizer_model.onnx"), module)

    def step(x, y):
        module(x, y)
        opt.step()
        module.lazy_reset_grad()
else:
    import torch
    from tiny_llm import Config, init_weights, torch_lm
    torch.set_num_threads({threads})
    cfg = Config()
    model = torch_lm(cfg, init_weights(cfg), lora_rank=8, lora_alpha=16, targets={targets!r})
    topt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        topt.step()
        topt.zero_grad()
step(*batches[0])  # warm-up: plans, primitive caches, the optimizer's state
times = []
for i in range({steps}):
    t = time.perf_counter()
    step(*batches[i % 4])
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def run_steps(args, engine, threads, art_dir):
    code = STEPS_CHILD.format(examples=os.path.join(REPO, "examples"), bench=HERE, engine=engine, threads=threads,
                              dir=art_dir, seq=args.seq, batch=args.batch, steps=args.steps, targets=TARGETS)
    # PyTorch's BLAS (Debian: OpenBLAS, own pthreads) gets the same thread count as its OpenMP pool.
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} training steps failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_tokens(args):
    """Training tokens/s: rounds alternate between the engines, each round a fresh process. Each
    engine runs with --threads threads and with 1: on a loaded machine (more runnable threads than
    cores) a step of many short parallel regions waits for descheduled workers, and one thread can
    be several times faster. Ratios: at equal threads, and each engine at its faster setting."""
    threads = sorted({args.threads, 1}, reverse=True)
    engines = [(e, t) for t in threads for e in ("onnxtrain", "torch")]
    times = {e: [] for e in engines}
    with tempfile.TemporaryDirectory() as d:
        make_training_artifacts(d, lora=True, memory_opt_config=MEMORY_OPT_CONFIG)  # as the example trains
        for _ in range(args.rounds):
            for engine, t in engines:
                times[(engine, t)] += run_steps(args, engine, t, d)
    tok = args.batch * args.seq
    rate = {e: tok / median(t) for e, t in times.items()}
    print(f"\nLoRA training step (rank 8 on q/k/v/o/gate/up/down), batch {args.batch} x seq {args.seq}: tokens/s,"
          f" median of {args.rounds} x {args.steps} steps")
    for t in threads:
        print(f"  {t} thread(s): onnxtrain int4 + LoRA {rate[('onnxtrain', t)]:8.0f}   PyTorch eager fp32 LoRA "
              f"{rate[('torch', t)]:8.0f}   ratio {rate[('onnxtrain', t)] / rate[('torch', t)]:.2f}x")
    ours = max(rate[("onnxtrain", t)] for t in threads)
    peer = max(rate[("torch", t)] for t in threads)
    print(f"  each at its faster setting: ratio {ours / peer:.2f}x (target >= 2x)")
    return rate[("onnxtrain", args.threads)], rate[("torch", args.threads)], ours, peer


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



def make_training_artifacts(d, lora, memory_opt_config=""):
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
                                     lora=artifacts.LoraConfig(rank=8, alpha=16, target=TARGETS),
                                     memory_opt_config=memory_opt_config)
    else:
        artifacts.generate_artifacts(model, requires_grad=list(weights), loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=d)


def bench_memory(args):
    """Peak RSS growth of a training step, in a fresh process per run, for each batch x seq; the
    configurations alternate and the figure is the median of --rounds runs each."""
    configs = [("full fp32 fine-tuning (AdamW)", False, ""),
               (f"int4 + LoRA as the example (recompute {MEMORY_OPT_CONFIG})", True, MEMORY_OPT_CONFIG),
               ("int4 + LoRA, every activation stashed", True, "")]
    out = []
    with tempfile.TemporaryDirectory() as work:
        dirs = []
        for i, (_, lora, rc) in enumerate(configs):
            dirs.append(os.path.join(work, str(i)))
            os.makedirs(dirs[-1])
            make_training_artifacts(dirs[-1], lora, rc)  # here: the child process only loads and trains
        for batch, seq in [(1, args.seq), (args.batch, args.seq), (8, 64)]:  # the last: the example's
            peaks = [[] for _ in configs]
            for _ in range(args.rounds):
                for i, d in enumerate(dirs):
                    code = CHILD.format(examples=os.path.join(REPO, "examples"), bench=HERE, threads=args.threads,
                                        dir=d, seq=seq, batch=batch)
                    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
                    if proc.returncode != 0:
                        raise RuntimeError(proc.stderr)
                    peaks[i].append(json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"])
            full = median(peaks[0])
            print(f"\nPeak memory of training (module + optimizer + 3 steps, peak RSS growth), batch {batch} x seq {seq}:")
            for (name, _, _), p in zip(configs, peaks):
                print(f"  {name:<62} {median(p) / 2**20:8.1f} MiB  {100 * median(p) / full:5.1f}%")
            print("  target: int4 + LoRA <= 35% of full fp32 fine-tuning")
            out.append((batch, seq, full, [median(p) for p in peaks[1:]]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="timed training steps per round and engine")
    ap.add_argument("--skip", default="", help="comma-separated: matmul,tokens,memory")
    add_torch_argument(ap)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if "tokens" not in skip and not run_torch_lanes(args):  # tokens/s is timed against PyTorch
        return
    verdict = []
    if "matmul" not in skip:
        with tempfile.TemporaryDirectory() as work:
            rows = bench_matmul_nbits(args, work)
        for m in (1, 512):
            worst = min(t / o for _, _, mm, o, t in rows if mm == m)
            verdict.append(f"MatMulNBits forward, M={m}: slowest shape at {worst:.2f}x ONNX Runtime's speed"
                           f" (target >= 1x): {'met' if worst >= 1 else 'not met'}")
    if "tokens" not in skip:
        ours, peer, ours_best, peer_best = bench_tokens(args)
        verdict.append(f"LoRA training tokens/s: {ours / peer:.2f}x {torch_description()} eager LoRA at {args.threads} threads, "
                       f"{ours_best / peer_best:.2f}x each at its faster thread count (target >= 2x): "
                       f"{'met' if min(ours / peer, ours_best / peer_best) >= 2 else 'not met'}")
    if "memory" not in skip:
        for batch, seq, full, (lora, lora_stashed) in bench_memory(args):
            verdict.append(f"peak memory, batch {batch} x seq {seq}: int4 + LoRA as the example {100 * lora / full:.1f}%"
                           f" of full fp32 fine-tuning (target <= 35%): {'met' if lora <= 0.35 * full else 'not met'};"
                           f" every activation stashed {100 * lora_stashed / full:.1f}%")
    print("\nTargets (LoRA fine-tuning on int4):")
    for line in verdict:
        print("  " + line)


if __name__ == "__main__":
    main()
