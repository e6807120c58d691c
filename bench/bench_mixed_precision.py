#!/usr/bin/env python3
"""Mixed-precision benchmark (issue 10): bf16 against fp32, onnxtrain against PyTorch, same threads.

1. **GEMM peak** of this CPU through onnxtrain's own MatMul kernel, fp32 and bf16 (bf16 inputs,
   fp32 accumulation, bf16 output), n x n x n, in this run: the ceiling for what follows.
2. **Train step** (forward, backward, AdamW) of the BERT-style encoder (hidden 256, 4 layers,
   seq 128, batch 8, cross-entropy head) from generate_artifacts in fp32 and with
   ``mixed_precision="bf16"``, against PyTorch eager in fp32 and under
   ``torch.autocast("cpu", dtype=torch.bfloat16)``, all interleaved round by round. Achieved
   TFLOP/s counts the GEMM work of a step as 3x the forward's (bench/onnx_flops.py).
   Targets: bf16 step >= 2x onnxtrain's fp32 step, >= 2.5x torch autocast.
3. **TrainModule** (an unchanged torch loop, AdamW) on the BERT-style encoder and the GPT-style
   decoder (bench/models.py training_loop_case: hidden 256, 4 layers, seq 128, batch 8):
   ``TrainModule(model, mixed_precision="bf16")`` against plain PyTorch fp32, PyTorch under
   ``torch.autocast("cpu", dtype=torch.bfloat16)`` and fp32 TrainModule, steps interleaved, median
   ms per step after the first. Targets: >= 3x torch fp32, >= 2x torch autocast.
4. With ``--curves``: 200 steps of BERT-style, GPT-style and the digits CNN in fp32, bf16 and
   fp16 (dynamic loss scaling) from the same initial weights; the largest relative gap of the
   smoothed (10-step mean) loss curves at every 10th step (target: within 2%), and the updates
   fp16's loss scaler skipped.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_mixed_precision.py [--threads 2] [--curves]
    # about 3 minutes on a quiet machine: fewer rounds and steps, the kernel profile with the
    # Amdahl split, the GPT-style curve only (200 steps)
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_mixed_precision.py --short

Prints a table and one JSON line. Only ratios measured in the same run mean anything on a shared
machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Dict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_training import export_training, interleaved_ms, parameter_names  # noqa: E402
from common import add_torch_argument, import_onnxtrain, run_torch_lanes, torch_description  # noqa: E402

TARGET_VS_FP32 = 2.0
TARGET_VS_AUTOCAST = 2.5
TARGET_CURVE_GAP = 0.02
TARGET_TM_VS_TORCH = 3.0
TARGET_TM_VS_AUTOCAST = 2.0


def gemm_peak(ot, n: int, rounds: int) -> Dict[str, float]:
    """GFLOP/s of an n^3 MatMul in fp32 and bf16 through InferenceSession (median of interleaved
    runs). The bf16 model casts its fp32 input once (n^2 work) and reduces the product to a scalar
    (n^2): both under 0.2% of the n^3 product at n = 2048."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    b = rng.standard_normal((n, n)).astype(np.float32)
    x = rng.standard_normal((n, n)).astype(np.float32)
    sessions = {}
    for name, elem in (("fp32", TensorProto.FLOAT), ("bf16", TensorProto.BFLOAT16)):
        w = numpy_helper.from_array(b, "w")
        nodes = []
        if elem != TensorProto.FLOAT:
            nodes += [helper.make_node("Cast", ["x"], ["xl"], to=elem), helper.make_node("Cast", ["w"], ["wl"], to=elem)]
            a_in, b_in = "xl", "wl"
        else:
            a_in, b_in = "x", "w"
        nodes += [helper.make_node("MatMul", [a_in, b_in], ["y"]),
                  helper.make_node("ReduceMax", ["y"], ["m"], keepdims=0),
                  helper.make_node("Cast", ["m"], ["out"], to=TensorProto.FLOAT)]
        # w is an input too, so nothing folds the product away at load time.
        g = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n]),
                                              helper.make_tensor_value_info("w", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        sessions[name] = ot.InferenceSession(m.SerializeToString())
    del w
    fns = {k: (lambda s=s: s.run(None, {"x": x, "w": b})) for k, s in sessions.items()}
    ms = interleaved_ms(fns, rounds, 2, budget_s=30.0)
    # the bf16 run also casts w (n^2) each call; it stays far below the product's cost
    return {k: 2 * n ** 3 / (v["best"] * 1e-3) / 1e9 for k, v in ms.items()} | \
        {f"{k}_median": 2 * n ** 3 / (v["median"] * 1e-3) / 1e9 for k, v in ms.items()}


def build_model(name: str, seed: int = 0):
    import torch
    from torch import nn

    import models

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if name == "bert":
        model = models.BertClassifier(models.BertConfig(), num_classes=2)
        x, t = torch.randint(0, 8192, (8, 128), generator=g), torch.randint(0, 2, (8,), generator=g)
    elif name == "gpt":
        cfg = models.BertConfig(vocab_size=512, hidden=128, layers=2, heads=4, ffn=512, max_len=64)
        class ClassesSecond(nn.Module):  # [B, S, V] -> [B, V, S]: the layout CrossEntropy takes
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, ids):
                return self.inner(ids).transpose(1, 2)

        model = ClassesSecond(models.GPTDecoder(cfg))
        x = torch.randint(0, 512, (8, 64), generator=g)
        t = torch.roll(x, -1, dims=1)
    elif name == "digits":
        model = models.DigitsCNN()
        from sklearn.datasets import load_digits
        d = load_digits()
        x = torch.tensor(d.images[:256, None] / 16.0, dtype=torch.float32)
        t = torch.tensor(d.target[:256], dtype=torch.int64)
    else:
        raise KeyError(name)
    module = models.WithCrossEntropy(model)
    module.train()
    return module, model, x, t


class Trainer:
    def __init__(self, ot, model, x, target, workdir: str, mode):
        from onnxtrain import artifacts
        from onnxtrain.api import CheckpointState, Module, Optimizer
        data = export_training(model, (x,), ["x"], ["logits"])
        paths = artifacts.generate_artifacts(data, requires_grad=parameter_names(model),
                                             loss=artifacts.LossType.CrossEntropyLoss,
                                             optimizer=artifacts.AdamW(lr=1e-3), artifact_directory=workdir,
                                             mixed_precision=mode)
        self.state = CheckpointState.load_checkpoint(paths[3])
        # One Dropout seed for every mode, so curves differ by precision alone.
        self.state.properties["onnxtrain.random_seed"] = 20261123
        self.module = Module(paths[0], self.state, paths[1])
        self.optimizer = Optimizer(paths[2], self.module)
        self.feeds = (x.numpy(), target.numpy())
        self.onnx = data
        self.paths = paths

    def kernel_ms(self, ot, runs: int) -> Dict[str, float]:
        """Kernel ms per op type of the training graph (forward and backward; the optimizer step is
        not in it), each node's fastest of ``runs`` runs, through an InferenceSession with
        profiling over the same feeds. Minima per node, not totals: on a loaded machine a node's
        slow runs are other processes' time, and a parallel region waiting on a descheduled
        thread multiplies a small kernel's time."""
        import onnx
        options = ot.SessionOptions()
        options.enable_profiling = True
        session = ot.InferenceSession(self.paths[0], options)
        names = [i.name for i in onnx.load(self.paths[0], load_external_data=False).graph.input]
        feeds = dict(zip(names[:2], self.feeds))
        for name in names[2:]:
            feeds[name] = self.state.parameters[name].data
        session.run(None, feeds)  # the recording run
        before = {e["node"]: e["total_us"] for e in session.profile()}
        best: Dict[str, float] = {}
        op_of: Dict[str, str] = {}
        for _ in range(runs):
            session.run(None, feeds)
            for e in session.profile():
                us = e["total_us"] - before.get(e["node"], 0.0)
                before[e["node"]] = e["total_us"]
                best[e["node"]] = min(best.get(e["node"], float("inf")), us)
                op_of[e["node"]] = e["op_type"]
        by_op: Dict[str, float] = {}
        for node, us in best.items():
            by_op[op_of[node]] = by_op.get(op_of[node], 0.0) + us / 1e3
        return dict(sorted(by_op.items(), key=lambda kv: -kv[1]))

    def step(self) -> float:
        loss = self.module(*self.feeds)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(loss)


class TorchTrainer:
    def __init__(self, module, x, target, autocast: bool):
        import torch
        self.module, self.x, self.target, self.autocast = module, x, target, autocast
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)

    def step(self) -> float:
        import torch
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.module(self.x, self.target)
        loss.backward()
        self.optimizer.step()
        return float(loss)


def step_flops(ot, onnx_bytes: bytes) -> int:
    """3x the forward's GEMM FLOPs; shapes from onnxtrain's own inference (onnx's stops at the
    attention reshapes of a training export)."""
    import onnx

    from onnx_flops import count_flops
    annotated = ot._C.infer_shapes(onnx_bytes)
    return 3 * count_flops(onnx.load_from_string(annotated))["total"]


def bench_step(ot, args, workdir: str) -> dict:
    import copy

    module, model, x, t = build_model("bert")
    fp32 = Trainer(ot, model, x, t, os.path.join(workdir, "fp32"), None)
    bf16 = Trainer(ot, model, x, t, os.path.join(workdir, "bf16"), "bf16")
    torch32 = TorchTrainer(copy.deepcopy(module), x, t, autocast=False)
    torch_ac = TorchTrainer(copy.deepcopy(module), x, t, autocast=True)
    flops = step_flops(ot, fp32.onnx)
    first = {"onnxtrain fp32": fp32.step(), "onnxtrain bf16": bf16.step(), "torch fp32": torch32.step(),
             "torch autocast bf16": torch_ac.step()}
    ms = interleaved_ms({"onnxtrain fp32": fp32.step, "onnxtrain bf16": bf16.step, "torch fp32": torch32.step,
                         "torch autocast bf16": torch_ac.step}, args.rounds, args.per_round, args.budget)
    return {"first_loss": first, "step_ms": ms, "step_gflop": flops / 1e9,
            "tflops": {k: flops / (v["best"] * 1e-3) / 1e12 for k, v in ms.items()}}


def train_module_steps(ot, args) -> dict:
    """Per model: median ms per step of the same torch loop (cross-entropy over the last dim,
    AdamW) as plain torch fp32, torch autocast bf16, TrainModule fp32 and TrainModule bf16, steps
    interleaved; the first step (export and build) is left out."""
    import copy
    import time

    import torch

    from models import training_loop_case
    from onnxtrain.torch import TrainModule

    def variant(module, autocast: bool):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        times, losses = [], []

        def step(x, y):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = module(x)
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append((time.perf_counter() - start) * 1e3)
            losses.append(loss.item())
        return step, times, losses

    out = {}
    for name in args.tm_models.split(","):
        model, batches = training_loop_case(name, args.tm_steps)
        runs = {"torch fp32": variant(copy.deepcopy(model), False),
                "torch autocast bf16": variant(copy.deepcopy(model), True),
                "TrainModule fp32": variant(TrainModule(copy.deepcopy(model)), False),
                "TrainModule bf16": variant(TrainModule(copy.deepcopy(model), mixed_precision="bf16"), False)}
        for x, y in batches:
            for step, _, _ in runs.values():
                step(x, y)
        ms = {k: float(np.median(t[1:])) for k, (_, t, _) in runs.items()}
        losses = {k: l for k, (_, _, l) in runs.items()}
        out[name] = {"step_ms": ms, "steps": args.tm_steps,
                     "bf16_vs_torch_fp32": ms["torch fp32"] / ms["TrainModule bf16"],
                     "bf16_vs_torch_autocast": ms["torch autocast bf16"] / ms["TrainModule bf16"],
                     "bf16_vs_trainmodule_fp32": ms["TrainModule fp32"] / ms["TrainModule bf16"],
                     "max_loss_rel_diff_bf16_vs_fp32": max(abs(a - b) / abs(b) for a, b in
                                                           zip(losses["TrainModule bf16"], losses["torch fp32"]))}
        print(f"  TrainModule {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()), flush=True)
    return out


GEMM_OPS = ("FusedMatMul", "MatMul", "Gemm")


def amdahl(profile: Dict[str, Dict[str, float]]) -> dict:
    """Where the bf16 step's time goes against fp32's: GEMMs against everything else, from the
    per-node kernel minima of both training graphs. ``ceiling_rest_free`` is the step ratio if
    everything but the GEMMs took no time in bf16; ``ceiling_rest_halved`` if it ran 2x faster
    than in fp32 (half the bytes of a memory-bound kernel)."""
    split = {}
    for mode, ops in profile.items():
        gemm = sum(v for k, v in ops.items() if k in GEMM_OPS)
        split[mode] = {"gemm_ms": gemm, "rest_ms": sum(ops.values()) - gemm}
    f, b = split["fp32"], split["bf16"]
    total32 = f["gemm_ms"] + f["rest_ms"]
    return {"split": split, "gemm_share_fp32": f["gemm_ms"] / total32,
            "gemm_ratio": f["gemm_ms"] / b["gemm_ms"], "rest_ratio": f["rest_ms"] / b["rest_ms"],
            "kernel_step_ratio": total32 / (b["gemm_ms"] + b["rest_ms"]),
            "ceiling_rest_free": total32 / b["gemm_ms"],
            "ceiling_rest_halved": total32 / (b["gemm_ms"] + f["rest_ms"] / 2)}


def curves(ot, args, workdir: str) -> dict:
    """Per model and low mode: the largest relative gap to fp32 of the smoothed curves, first and
    last losses, and (fp16) the updates the loss scaler skipped and its final scale."""
    out = {}
    for name in args.curve_models.split(","):
        module, model, x, t = build_model(name)
        losses, scaler = {}, {}
        low_modes = tuple(args.curve_modes.split(","))
        for mode in (None,) + low_modes:
            tr = Trainer(ot, model, x, t, os.path.join(workdir, f"curve_{name}_{mode}"), mode)
            losses[mode or "fp32"] = np.array([tr.step() for _ in range(args.steps)])
            print(f"  {name} {mode or 'fp32'}: loss every 10th step {np.round(losses[mode or 'fp32'][::10], 4).tolist()}",
                  flush=True)
            if mode == "fp16":
                scaler = {"skipped": tr.state.properties["onnxtrain.skipped_steps"],
                          "loss_scale": tr.state.properties["onnxtrain.loss_scale"]}
        smooth = {k: np.convolve(v, np.ones(10) / 10, mode="valid") for k, v in losses.items()}
        idx = np.arange(0, len(smooth["fp32"]), 10)
        out[name] = {"fp32_first_last": [float(losses["fp32"][0]), float(losses["fp32"][-1])], "fp16_scaler": scaler}
        for mode in low_modes:
            gap = np.abs(smooth[mode][idx] - smooth["fp32"][idx]) / np.abs(smooth["fp32"][idx])
            out[name][mode] = {"max_rel_gap": float(gap.max()),
                               "first_last": [float(losses[mode][0]), float(losses[mode][-1])]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n", type=int, default=2048, help="GEMM peak size")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--per-round", type=int, default=2)
    p.add_argument("--budget", type=float, default=120.0, help="seconds for the train-step timing at most")
    p.add_argument("--curves", action="store_true", help="also the 200-step loss curves (minutes)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--curve-models", default="bert,gpt,digits", help="comma-separated: bert, gpt, digits")
    p.add_argument("--curve-modes", default="bf16,fp16", help="low precisions whose curves run beside fp32")
    p.add_argument("--tm-models", default="bert,gpt", help="TrainModule models (bench/models.py training_loop_case)")
    p.add_argument("--tm-steps", type=int, default=12, help="TrainModule steps per variant (the first is not timed)")
    p.add_argument("--short", action="store_true",
                   help="about 3 minutes: 3 rounds, 8 TrainModule steps, the profile, the GPT-style bf16 curve")
    p.add_argument("--profile", action="store_true",
                   help="also the kernel time per op type of the fp32 and bf16 training graphs, and the Amdahl split")
    p.add_argument("--profile-runs", type=int, default=8)
    add_torch_argument(p)
    args = p.parse_args(argv)
    if not run_torch_lanes(args, argv):
        return 0
    if args.short:
        args.rounds, args.budget, args.tm_steps = 3, 30.0, 8
        args.curves, args.curve_models, args.curve_modes, args.profile = True, "gpt", "bf16", True
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(args.threads)
    ot.set_num_threads(args.threads)
    result = {"cpu": ot.cpu_features(), "threads": args.threads, "torch": torch_description(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}
    result["gemm_gflops"] = gemm_peak(ot, args.n, 5)
    with tempfile.TemporaryDirectory() as workdir:
        result["bert_step"] = bench_step(ot, args, workdir)
        result["train_module"] = train_module_steps(ot, args)
        if args.profile:
            module, model, x, t = build_model("bert")
            result["profile"] = {mode or "fp32": Trainer(ot, model, x, t, os.path.join(workdir, f"profile_{mode}"),
                                                         mode).kernel_ms(ot, args.profile_runs)
                                 for mode in (None, "bf16")}
            result["amdahl"] = amdahl(result["profile"])
        if args.curves:
            result["curves"] = curves(ot, args, workdir)
    st = result["bert_step"]["step_ms"]
    feats = result["cpu"]
    print(f"CPU: {feats.get('model') or feats['vendor']}, oneDNN ISA {feats['onednn_isa']}, avx512_bf16={feats['avx512_bf16']}, "
          f"amx_bf16={feats['amx_bf16']}, bf16 GEMM native={feats['bf16_matmul_native']}; {result['torch']}; {args.threads} threads, "
          f"OMP_WAIT_POLICY={result['omp_wait_policy']}")
    g = result["gemm_gflops"]
    print(f"GEMM {args.n}^3 through MatMul: fp32 {g['fp32']:.0f} GFLOP/s, bf16 {g['bf16']:.0f} GFLOP/s "
          f"(best; medians {g['fp32_median']:.0f} / {g['bf16_median']:.0f}), bf16/fp32 {g['bf16'] / g['fp32']:.2f}x")
    print(f"BERT-style train step ({result['bert_step']['step_gflop']:.1f} GFLOP of GEMMs), ms median (best):")
    for k, v in st.items():
        print(f"  {k:22s} {v['median']:8.1f} ({v['best']:.1f})  {result['bert_step']['tflops'][k]:.3f} TFLOP/s")
    vs32 = st["onnxtrain fp32"]["best"] / st["onnxtrain bf16"]["best"]
    vsac = st["torch autocast bf16"]["best"] / st["onnxtrain bf16"]["best"]
    bf16_peak_frac = result["bert_step"]["tflops"]["onnxtrain bf16"] * 1e3 / g["bf16"]
    print(f"  bf16 vs own fp32: {vs32:.2f}x (target {TARGET_VS_FP32}x); vs torch autocast: {vsac:.2f}x "
          f"(target {TARGET_VS_AUTOCAST}x); bf16 step at {100 * bf16_peak_frac:.0f}% of the bf16 GEMM peak")
    result["ratios"] = {"bf16_vs_fp32": vs32, "bf16_vs_torch_autocast": vsac, "bf16_fraction_of_peak": bf16_peak_frac}
    print(f"TrainModule, the same torch loop (AdamW), median ms per step of {args.tm_steps - 1}:")
    for name, r in result["train_module"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r["step_ms"].items()))
        print(f"  {name}: TrainModule bf16 vs torch fp32 {r['bf16_vs_torch_fp32']:.2f}x (target {TARGET_TM_VS_TORCH}x), "
              f"vs torch autocast {r['bf16_vs_torch_autocast']:.2f}x (target {TARGET_TM_VS_AUTOCAST}x), "
              f"vs TrainModule fp32 {r['bf16_vs_trainmodule_fp32']:.2f}x; loss vs torch fp32 within "
              f"{100 * r['max_loss_rel_diff_bf16_vs_fp32']:.2f}%")
    if "profile" in result:
        prof = result["profile"]
        print(f"BERT-style training graph, kernel ms by op type (each node's fastest of {args.profile_runs} runs):")
        print(f"  {'op type':24s} {'fp32':>8s} {'bf16':>8s}")
        for op in sorted(set(prof["fp32"]) | set(prof["bf16"]), key=lambda k: -prof["fp32"].get(k, prof["bf16"].get(k)))[:16]:
            print(f"  {op:24s} {prof['fp32'].get(op, 0.0):8.2f} {prof['bf16'].get(op, 0.0):8.2f}")
        a = result["amdahl"]
        print(f"  total                    {sum(prof['fp32'].values()):8.2f} {sum(prof['bf16'].values()):8.2f}")
        print(f"Amdahl: GEMMs are {100 * a['gemm_share_fp32']:.0f}% of the fp32 kernel time; in bf16 they run "
              f"{a['gemm_ratio']:.2f}x faster, the rest {a['rest_ratio']:.2f}x; kernel-time step ratio "
              f"{a['kernel_step_ratio']:.2f}x. Ceiling with the rest free in bf16: {a['ceiling_rest_free']:.2f}x; "
              f"with the rest 2x faster than fp32: {a['ceiling_rest_halved']:.2f}x (target {TARGET_VS_FP32}x)")
    if args.curves:
        for name, c in result["curves"].items():
            for mode in args.curve_modes.split(","):
                print(f"  {name}: {args.steps} steps, smoothed {mode} vs fp32 max gap "
                      f"{100 * c[mode]['max_rel_gap']:.2f}% (target {100 * TARGET_CURVE_GAP:.0f}%); loss fp32 "
                      f"{c['fp32_first_last']}, {mode} {c[mode]['first_last']}")
            if c["fp16_scaler"]:
                print(f"  {name}: fp16 loss scaler skipped {c['fp16_scaler']['skipped']} updates, "
                      f"scale now {c['fp16_scaler']['loss_scale']:g}")
    print(json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
