#!/usr/bin/env python3
"""Transcendentals benchmark: a GPT-style decoder whose MLP uses the tanh form of GELU (GPT-2's
gelu_new, Hugging Face's gelu_pytorch_tanh), the case the SIMD math layer (src/core/fast_math.h)
and the tanh-GELU fusion are for.

Model: bench/models.py GPTDecoder, hidden 128, 2 layers, 4 heads, FFN 512, vocab 512, batch 8 x 64
tokens (bench_mixed_precision's GPT size), GELU as ``--gelu`` (tanh: nn.GELU(approximate="tanh");
gelu_new: written out op by op).

* forward: the inference export through onnxtrain's InferenceSession against ONNX Runtime 1.31
  (the `ort` peer), both on ``--threads`` threads, in interleaved rounds (target: onnxtrain's
  median at most 1.0x ORT's);
* train step: Module + Optimizer (AdamW) from generate_artifacts, forward + backward + update,
  for each build named by ``--builds label=<build>/python`` (default: this tree's build alone;
  name another checkout's build to compare, e.g. the commit before a change), in interleaved rounds (target: at least 1.3x faster than the
  build before the math layer).

* ops (``--ops``): each transcendental op alone on 1 Mi float32 values (normal, sd 3; Log on
  their absolute values), one thread, per build: the kernels without the model around them.

Every engine runs in its own process per round (``--worker``), so builds do not share a process;
each round's figure is the median of its timed runs and the report gives the median over rounds.
Run with OMP_WAIT_POLICY=passive on a shared machine; note that it applies to onnxtrain's OpenMP
pool only (ONNX Runtime's own pool spins either way), so each of onnxtrain's ~40 parallel regions
per forward then pays a wake-up that ORT does not: compare with and without it.

    OMP_WAIT_POLICY=passive /usr/bin/python3 bench/bench_transcendentals.py [--rounds 5] [--threads 2]
        [--gelu tanh|gelu_new] [--builds new=build/python,old=../old-checkout/build/python] [--ops]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)

BATCH, SEQ = 8, 64


def build_model(gelu: str, seed: int = 0):
    import torch
    from torch import nn

    import models

    torch.manual_seed(seed)
    cfg = models.BertConfig(vocab_size=512, hidden=128, layers=2, heads=4, ffn=512, max_len=SEQ, gelu=gelu)

    class ClassesSecond(nn.Module):  # [B, S, V] -> [B, V, S]: the layout CrossEntropy takes
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(ids).transpose(1, 2)

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g)
    return ClassesSecond(models.GPTDecoder(cfg)), x, torch.roll(x, -1, dims=1)


def export(model, x, path: str, training: bool) -> None:
    import torch

    import models
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if training:
            torch.onnx.export(model.train(), (x,), path, input_names=["x"], output_names=["logits"], opset_version=17,
                              do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                              **models.torchscript_exporter())
        else:
            torch.onnx.export(model.eval(), (x,), path, input_names=["x"], output_names=["logits"], opset_version=17,
                              **models.torchscript_exporter())


# --------------------------------------------------------------------------------------------------
# Worker: one engine, one kind of run, in this process; prints a JSON line.


OPS = [("Exp", {}, ""), ("Log", {}, ""), ("Tanh", {}, ""), ("Erf", {}, ""), ("Sigmoid", {}, ""), ("Softplus", {}, ""),
       ("Gelu", {}, "onnxtrain"), ("Gelu", {"approximate": "tanh"}, "onnxtrain")]


def op_times(args) -> dict:
    """Median ms per op on 1 Mi float32 values; a build without a kernel form reports None."""
    import numpy as np
    from onnx import TensorProto, helper

    import onnxtrain
    from common import time_ms
    x = (np.random.default_rng(0).standard_normal(1 << 20) * 3).astype(np.float32)
    out = {}
    for op, attrs, domain in OPS:
        key = op + ("(tanh)" if attrs else "")
        node = helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)
        graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)])
        xi = np.abs(x) if op == "Log" else x
        try:
            sess = onnxtrain.InferenceSession(model.SerializeToString())
            sess.run(None, {"x": xi})
        except Exception:  # noqa: BLE001 - an older build without approximate="tanh"
            out[key] = None
            continue
        out[key] = statistics.median(time_ms(lambda: sess.run(None, {"x": xi}), 3, 15))
    return out


def worker(args) -> None:
    import numpy as np

    import onnxtrain
    from common import time_ms
    onnxtrain.set_num_threads(args.threads)
    if args.worker == "ops":
        print(json.dumps(op_times(args)))
        return
    x = np.load(os.path.join(args.workdir, "x.npy"))
    if args.worker == "forward":
        sess = onnxtrain.InferenceSession(os.path.join(args.workdir, "forward.onnx"))
        out = sess.run(None, {"x": x})[0]
        times = time_ms(lambda: sess.run(None, {"x": x}), args.warmup, args.runs)
        np.save(os.path.join(args.workdir, f"out_{args.label}.npy"), out)
        print(json.dumps({"times_ms": times}))
        return
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer
    art = os.path.join(args.workdir, f"artifacts_{args.label}")
    if not os.path.isdir(art):
        import onnx
        params = [i.name for i in onnx.load(os.path.join(args.workdir, "train.onnx")).graph.initializer
                  if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) > 0]
        artifacts.generate_artifacts(os.path.join(args.workdir, "train.onnx"), requires_grad=params,
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=1e-3),
                                     artifact_directory=art)
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    t = np.load(os.path.join(args.workdir, "t.npy"))
    losses = []

    def step():
        losses.append(float(module(x, t)))
        optimizer.step()
        module.lazy_reset_grad()

    times = time_ms(step, args.warmup, args.runs)
    import onnx
    ops = [n.op_type for n in onnx.load(os.path.join(art, "training_model.onnx")).graph.node]
    print(json.dumps({"times_ms": times, "first_loss": losses[0], "tanh_nodes": ops.count("Tanh"),
                      "gelu_grad_nodes": ops.count("GeluGrad")}))


def run_worker(kind: str, label: str, pythonpath: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--label", label, "--workdir", args.workdir,
           "--threads", str(args.threads), "--warmup", str(args.warmup), "--runs", str(args.runs if kind == "forward"
                                                                                       else args.train_runs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} {kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runs", type=int, default=30, help="timed forwards per round and engine")
    p.add_argument("--train-runs", type=int, default=10, help="timed train steps per round and build")
    p.add_argument("--gelu", default="tanh", choices=["tanh", "gelu_new", "none"])
    default_builds = f"new={os.path.join(REPO_ROOT, 'build', 'python')}"
    p.add_argument("--builds", default=default_builds, help="label=<python dir>,...: the first is measured against ORT")
    p.add_argument("--skip", default="", help="forward and/or train, comma-separated")
    p.add_argument("--ops", action="store_true", help="also time each op alone, one thread, per build")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--label", default="", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    import numpy as np

    import peers
    builds = [tuple(b.split("=", 1)) for b in args.builds.split(",") if b]
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        model, x, t = build_model(args.gelu)
        export(model, x, os.path.join(workdir, "forward.onnx"), training=False)
        np.save(os.path.join(workdir, "x.npy"), x.numpy())
        np.save(os.path.join(workdir, "t.npy"), t.numpy())
        import torch
        with torch.no_grad():
            reference = model.eval().double()(x).numpy()
        export(build_model(args.gelu)[0], x, os.path.join(workdir, "train.onnx"), training=True)
        if "forward" not in skip:
            peers.ensure("ort")
        ops = {label: [] for label, _ in builds}
        fwd = {label: [] for label, _ in builds}
        fwd["ort"] = []
        train = {label: [] for label, _ in builds}
        info = {}
        for r in range(args.rounds):
            if "forward" not in skip:
                for label, path in builds:
                    fwd[label].append(statistics.median(run_worker("forward", label, path, args)["times_ms"]))
                rep = peers.ort_time(os.path.join(workdir, "forward.onnx"), {"x": x.numpy()}, workdir,
                                     threads=args.threads, warmup=args.warmup, runs=args.runs)
                fwd["ort"].append(rep["median_ms"])
            if args.ops:
                threads, args.threads = args.threads, 1
                for label, path in builds:
                    ops[label].append(run_worker("ops", label, path, args))
                args.threads = threads
            if "train" not in skip:
                for label, path in builds:
                    res = run_worker("train", label, path, args)
                    info[label] = res
                    train[label].append(statistics.median(res["times_ms"]))
            if any(fwd.values()) or any(train.values()):
                print(f"round {r + 1}: " + ", ".join(f"{k} fwd {v[-1]:.2f} ms" for k, v in fwd.items() if v) + "; " +
                      ", ".join(f"{k} train {v[-1]:.2f} ms" for k, v in train.items() if v), flush=True)
        load = os.getloadavg()
        print(f"\nGPT-style decoder, GELU {args.gelu}, batch {BATCH} x {SEQ} tokens, {args.threads} threads, "
              f"{args.rounds} interleaved rounds; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        if "forward" not in skip:
            # On a shared machine a round can be several times slower than the engine (ONNX Runtime's
            # spinning pool loses its cores): the best round is the figure of an undisturbed run.
            ort, ort_best = statistics.median(fwd["ort"]), min(fwd["ort"])
            print(f"forward (median of round medians, best round): ORT 1.31 {ort:.2f} ms, best {ort_best:.2f} ms")
            for label, _ in builds:
                m, best = statistics.median(fwd[label]), min(fwd[label])
                err = float(np.abs(np.load(os.path.join(workdir, f"out_{label}.npy")) - reference).max())
                print(f"  onnxtrain {label}: {m:.2f} ms = {m / ort:.2f}x ORT; best {best:.2f} ms = "
                      f"{best / ort_best:.2f}x ORT's best (max |err| vs float64 torch {err:.1e})")
        if "train" not in skip:
            base = statistics.median(train[builds[-1][0]])
            print("train step (forward + backward + AdamW, median of round medians):")
            for label, _ in builds:
                m = statistics.median(train[label])
                i = info[label]
                print(f"  onnxtrain {label}: {m:.2f} ms ({base / m:.2f}x faster than {builds[-1][0]}; first loss "
                      f"{i['first_loss']:.5f}; training graph: {i['tanh_nodes']} Tanh, {i['gelu_grad_nodes']} GeluGrad)")
        if args.ops:
            print("ops alone, 1 Mi float32 values, one thread (ms, median of round medians): " +
                  " | ".join(label for label, _ in builds))
            for key in ops[builds[0][0]][0]:
                cells = []
                for label, _ in builds:
                    vals = [r[key] for r in ops[label] if r.get(key) is not None]
                    cells.append(f"{statistics.median(vals):.3f}" if vals else "-")
                print(f"  {key:<14} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
