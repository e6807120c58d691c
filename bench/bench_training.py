#!/usr/bin/env python3
"""Training benchmark: onnxtrain against PyTorch eager (and ONNX Runtime's forward), same threads.

For each model, with a cross-entropy loss (``--models``, default ``bert,cnn,digits``):

* bert   -- the BERT-style encoder of bench/models.py (hidden 256, 4 layers, 4 heads, seq 128,
            batch 8) with a classifier head;
* cnn    -- SmallCNN (conv-bn-relu x3, 3x32x32, batch 32);
* digits -- DigitsCNN, the demo's model (1x8x8, batch 64).

it measures, interleaving the engines round by round so load on the shared machine hits both:

1. **forward + backward** (loss and every parameter's gradient): onnxtrain's gradient graph
   (onnxtrain.autodiff, run by InferenceSession) against ``loss.backward()``, next to ONNX
   Runtime's forward of the same model (the `ort` peer, onnxruntime 1.31; target: the step within 3.5x of it);
2. **full train step** (forward, backward, AdamW update): onnxtrain's Module + Optimizer from
   generate_artifacts against torch.optim.AdamW (target: >= 2.5x faster than torch);
3. **the AdamW update alone** against the memory-bandwidth bound: AdamW reads parameters,
   gradients and both moments and writes parameters and both moments, 28 bytes per fp32 value;
   over the bandwidth measured in the same rounds (the best of copies and in-place scaling of
   256 MiB arrays by numpy and torch, counting bytes read plus written; see BandwidthProbes) that
   is the fastest an update can be (target: within 1.5x of it);
4. **memory**: the peak RSS growth of 3 train steps (and of 3 forward+backward steps), each
   engine in a fresh process, from its RSS after model, inputs and optimizer are set up
   (VmHWM, reset through /proc/self/clear_refs), next to onnxtrain's planned arena.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_training.py [--threads 2] [--models bert,digits]

Only ratios measured in the same run mean anything on a loaded machine; set OMP_WAIT_POLICY=passive
when other jobs share the cores.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Callable, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_torch_argument, import_onnxtrain, median, run_torch_lanes, status_kib, torch_description  # noqa: E402

TARGET_VS_TORCH = 2.5        # torch step time / onnxtrain step time, at least
TARGET_VS_ORT_FORWARD = 3.5  # onnxtrain fwd+bwd / ORT forward, at most
TARGET_VS_BANDWIDTH = 1.5    # onnxtrain AdamW update / bandwidth bound, at most
ADAMW_BYTES_PER_VALUE = 7 * 4  # fp32: read p, g, m, v; write p, m, v
COPY_MIB = 256
MEMORY_STEPS = 3


# --------------------------------------------------------------------------------------------------
# Models


def build(name: str, seed: int = 0):
    """(model with its loss, model, example input, example target) for ``name``."""
    import torch

    import models

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if name == "bert":
        model = models.BertClassifier(models.BertConfig(), num_classes=2)
        x, target = torch.randint(0, 8192, (8, 128), generator=g), torch.randint(0, 2, (8,), generator=g)
    elif name == "cnn":
        model = models.SmallCNN()
        x, target = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    elif name == "digits":
        model = models.DigitsCNN()
        x, target = torch.rand(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)
    else:
        raise KeyError(f"unknown model {name!r} (bert, cnn, digits)")
    module = models.WithCrossEntropy(model)
    module.train()
    return module, model, x, target


def export_training(module, inputs, input_names, output_names) -> bytes:
    """Training-mode export (Dropout and BatchNorm statistics kept), parameters as initializers."""
    import torch

    import models
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on BatchNorm counters and tracing
        torch.onnx.export(module, inputs, f, input_names=input_names, output_names=output_names, opset_version=17,
                          do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                          **models.torchscript_exporter())
    return f.getvalue()


def parameter_names(module) -> List[str]:
    return [n for n, p in module.named_parameters() if p.requires_grad]


class OnnxtrainTrainer:
    """Module + Optimizer from generate_artifacts (cross-entropy, AdamW with torch's defaults)."""

    def __init__(self, model, x, target, workdir: str):
        from onnxtrain import artifacts
        from onnxtrain.api import CheckpointState, Module, Optimizer
        data = export_training(model, (x,), ["x"], ["logits"])
        paths = artifacts.generate_artifacts(data, requires_grad=parameter_names(model),
                                             loss=artifacts.LossType.CrossEntropyLoss,
                                             optimizer=artifacts.AdamW(lr=1e-3), artifact_directory=workdir)
        self.state = CheckpointState.load_checkpoint(paths[3])
        self.module = Module(paths[0], self.state, paths[1])
        self.optimizer = Optimizer(paths[2], self.module)
        self.feeds = (x.numpy(), target.numpy())
        self.num_values = self.module.get_parameters_size()

    def step(self) -> float:
        loss = self.module(*self.feeds)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(loss)


class TorchTrainer:
    """The same step in PyTorch eager: zero_grad, forward, backward, torch.optim.AdamW."""

    def __init__(self, module, x, target):
        import torch
        self.module, self.x, self.target = module, x, target
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        self.num_values = sum(p.numel() for p in module.parameters() if p.requires_grad)

    def forward_backward(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.module(self.x, self.target)
        loss.backward()
        return float(loss)

    def step(self) -> float:
        loss = self.forward_backward()
        self.optimizer.step()
        return loss


# --------------------------------------------------------------------------------------------------
# Timing


def summary(times_ms: List[float]) -> Dict[str, float]:
    """The median and the best (minimum) of a list of times. On a loaded machine contention only
    adds time, so the best is the steadier estimate of an engine's own cost; both are reported."""
    return {"median": median(times_ms), "best": min(times_ms) if times_ms else float("nan")}


def interleaved_ms(fns: Dict[str, Callable[[], object]], rounds: int, per_round: int, budget_s: float,
                   warmup: int = 2) -> Dict[str, Dict[str, float]]:
    """Per function, the median and best ms per call, timed in alternating rounds of ``per_round``
    calls so that load changes on the machine hit every engine alike. Stops after ``budget_s``
    seconds (at least one round)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    for _ in range(rounds):
        for key, fn in fns.items():
            for _ in range(per_round):
                t = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t) * 1e3)
        if time.perf_counter() - start > budget_s:
            break
    return {k: summary(v) for k, v in times.items()}


class BandwidthProbes:
    """Memory-bandwidth probes on arrays far bigger than any cache, each counted as bytes read plus
    bytes written: copies (numpy copyto: one thread, glibc memcpy; torch copy_: all threads) and
    in-place scaling (numpy, torch), the read-modify-write pattern of an optimizer update, which
    needs no write-allocate traffic. The best of them is the bandwidth the bound uses."""

    def __init__(self, threads: int):
        import torch
        n = COPY_MIB << 20
        self.src = np.ones(n // 4, dtype=np.float32)
        self.dst = np.zeros_like(self.src)
        tsrc, tdst = torch.from_numpy(self.src), torch.from_numpy(self.dst)
        self.bytes = 2 * n
        self.fns = {
            "numpy copyto (1 thread)": lambda: np.copyto(self.dst, self.src),
            f"torch copy_ ({threads} threads)": lambda: tdst.copy_(tsrc),
            "numpy in-place scale (1 thread)": lambda: np.multiply(self.dst, 1.0, out=self.dst),
            f"torch in-place mul_ ({threads} threads)": lambda: tdst.mul_(1.0),
        }

    def gbs(self, ms: Dict[str, Dict[str, float]], stat: str) -> Dict[str, float]:
        """GB/s of each probe from its ``stat`` time (as measured by interleaved_ms)."""
        return {k: self.bytes / (ms[k][stat] * 1e-3) / 1e9 for k in self.fns}


def ort_forward_ms(model, x, threads: int, runs: int, workdir: str) -> Dict[str, float]:
    """Median and best ONNX Runtime forward time of the inference export (NaN when ORT is missing)."""
    import torch

    from bench_inference import EngineResult, OrtEngine
    engine = OrtEngine(threads, workdir, budget_s=5.0)
    if engine.unavailable:
        print(f"ONNX Runtime: {engine.unavailable}")
        return summary([])
    path = os.path.join(workdir, "forward.onnx")
    model.eval()
    import models
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=17,
                          **models.torchscript_exporter())
    model.train()
    np.save(os.path.join(workdir, "x.npy"), x.numpy())
    engine.prepare("m", path, [("x", os.path.join(workdir, "x.npy"))])
    result = EngineResult()
    engine.run("m", 3, runs, result)
    return summary(result.times_ms)


# --------------------------------------------------------------------------------------------------
# Memory (each measurement in a fresh process)


def child_memory(engine: str, mode: str, name: str, threads: int) -> float:
    """In this (fresh) process: sets up one engine, then returns the peak RSS growth (MiB) of
    MEMORY_STEPS steps over the RSS right after setup."""
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(threads)
    ot.set_num_threads(threads)
    module, model, x, target = build(name)
    with tempfile.TemporaryDirectory() as workdir:
        if engine == "torch":
            trainer = TorchTrainer(module, x, target)
            step = trainer.step if mode == "step" else trainer.forward_backward
        elif mode == "step":
            step = OnnxtrainTrainer(model, x, target, workdir).step
        else:
            step = grad_session_step(ot, module, x, target, threads)
        del module, model
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = status_kib("VmRSS")
        for _ in range(MEMORY_STEPS):
            step()
        return (status_kib("VmHWM") - before) / 1024.0


def rss_growth_mib(engine: str, mode: str, name: str, threads: int) -> float:
    """child_memory in a fresh interpreter; NaN (with the error printed) when it fails."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-memory", engine, mode, name,
                           "--threads", str(threads)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        print(f"memory measurement {engine}/{mode}/{name} failed: {proc.stderr.strip().splitlines()[-1:]}")
        return float("nan")
    return float(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# The benchmark


def grad_session_step(ot, module, x, target, threads: int) -> Callable[[], object]:
    """A callable running the loss and every gradient through one onnxtrain gradient graph."""
    from onnxtrain.autodiff import build_gradient_graph
    params = parameter_names(module)
    grad_model = build_gradient_graph(export_training(module, (x, target), ["x", "target"], ["loss"]),
                                      params, ["loss"])
    sess = ot.InferenceSession(grad_model, num_threads=threads)
    feeds = {"x": x.numpy(), "target": target.numpy()}
    names = ["loss"] + [f"{p}_grad" for p in params]
    step = lambda: sess.run(names, feeds)  # noqa: E731
    step.session = sess
    return step


def bench(name: str, args, workdir: str, probes: BandwidthProbes) -> dict:
    import torch

    ot = import_onnxtrain()
    torch.set_num_threads(args.threads)
    ot.set_num_threads(args.threads)
    row: dict = {"model": name}

    # 1. forward + backward
    module, model, x, target = build(name)
    ot_fwd_bwd = grad_session_step(ot, module, x, target, args.threads)
    torch_trainer = TorchTrainer(module, x, target)
    row["fwd_bwd_loss_abs_err"] = abs(float(ot_fwd_bwd()[0]) - torch_trainer.forward_backward())
    ms = interleaved_ms({"onnxtrain": ot_fwd_bwd, "torch": torch_trainer.forward_backward},
                        args.rounds, args.per_round, args.budget)
    row["fwd_bwd_ms"] = ms
    row["ort_forward_ms"] = ort_forward_ms(model, x, args.threads, 10, workdir)
    row["memory_report"] = ot_fwd_bwd.session.memory_report()
    del ot_fwd_bwd

    # 2. full train step; both start from the same weights
    module, model, x, target = build(name)
    ot_trainer = OnnxtrainTrainer(model, x, target, os.path.join(workdir, f"{name}_artifacts"))
    torch_trainer = TorchTrainer(module, x, target)
    row["first_step_loss"] = {"onnxtrain": ot_trainer.step(), "torch": torch_trainer.step()}
    row["step_ms"] = interleaved_ms({"onnxtrain": ot_trainer.step, "torch": torch_trainer.step},
                                    args.rounds, args.per_round, args.budget)

    # 3. the AdamW update alone (gradients stay from the last step), interleaved with the
    # bandwidth probes so that the bound sees the same load
    row["num_values"] = ot_trainer.num_values
    assert ot_trainer.num_values == torch_trainer.num_values, "onnxtrain and torch train different parameters"
    ms = interleaved_ms({"onnxtrain": ot_trainer.optimizer.step, "torch": torch_trainer.optimizer.step,
                         **probes.fns}, args.rounds, 3 * args.per_round, args.budget)
    row["adamw_ms"] = {"onnxtrain": ms["onnxtrain"], "torch": ms["torch"]}
    row["bandwidth_gbs"] = {stat: probes.gbs(ms, stat) for stat in ("median", "best")}
    row["adamw_bytes"] = ADAMW_BYTES_PER_VALUE * ot_trainer.num_values
    del ot_trainer, torch_trainer

    # 4. memory, each engine in a fresh process
    if not args.skip_memory:
        row["rss_growth_mib"] = {f"{engine} {mode}": rss_growth_mib(engine, mode, name, args.threads)
                                 for mode in ("fwd_bwd", "step") for engine in ("onnxtrain", "torch")}
    return row


def ms_text(t: Dict[str, float], digits: int = 2) -> str:
    return f"{t['median']:7.{digits}f} ({t['best']:.{digits}f})".rjust(16)


def print_report(rows: List[dict], args) -> None:
    print(f"\n{torch_description()}; {args.threads} threads; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
          f"load average {os.getloadavg()[0]:.1f} (only ratios measured in the same run mean anything)")
    ok = [r for r in rows if "error" not in r]
    for r in rows:
        if "error" in r:
            print(f"{r['model']}: ERROR {r['error']}")

    def ratio(a: Dict[str, float], b: Dict[str, float]) -> str:
        return f"{a['median'] / b['median']:6.2f} {a['best'] / b['best']:6.2f}"

    print("\nms: median (best) of the interleaved runs; ratios: of medians, of bests")
    print(f"\n1. forward + backward (target: onnxtrain <= {TARGET_VS_ORT_FORWARD}x ONNX Runtime's forward; "
          f"ORT runs in its own process, not interleaved)")
    print(f"{'model':7} {'onnxtrain ms':>16} {'torch ms':>16} {'ORT fwd ms':>16} {'torch/ot':>13} {'ot/ORT fwd':>13}")
    for r in ok:
        m, ort = r["fwd_bwd_ms"], r["ort_forward_ms"]
        print(f"{r['model']:7} {ms_text(m['onnxtrain'])} {ms_text(m['torch'])} {ms_text(ort)} "
              f"{ratio(m['torch'], m['onnxtrain'])} {ratio(m['onnxtrain'], ort)}")

    print(f"\n2. train step: forward, backward, AdamW (target: torch/onnxtrain >= {TARGET_VS_TORCH})")
    print(f"{'model':7} {'onnxtrain ms':>16} {'torch ms':>16} {'torch/ot':>13}")
    for r in ok:
        m = r["step_ms"]
        print(f"{r['model']:7} {ms_text(m['onnxtrain'])} {ms_text(m['torch'])} {ratio(m['torch'], m['onnxtrain'])}")

    print(f"\n3. AdamW update alone vs the bandwidth bound: {ADAMW_BYTES_PER_VALUE} B per fp32 value over the best "
          f"probe's GB/s (target: ot/bound <= {TARGET_VS_BANDWIDTH}; state that fits in cache beats the bound)")
    print(f"{'model':7} {'values':>10} {'MB moved':>8} {'GB/s':>5} {'bound ms':>8} {'onnxtrain ms':>16} "
          f"{'torch ms':>16} {'ot/bound':>13} {'torch/ot':>13}")
    for r in ok:
        m = r["adamw_ms"]
        bound = {stat: r["adamw_bytes"] / (max(r["bandwidth_gbs"][stat].values()) * 1e9) * 1e3
                 for stat in ("median", "best")}
        print(f"{r['model']:7} {r['num_values']:10,} {r['adamw_bytes'] / 1e6:8.1f} "
              f"{max(r['bandwidth_gbs']['median'].values()):5.1f} {bound['median']:8.3f} "
              f"{ms_text(m['onnxtrain'], 3)} {ms_text(m['torch'], 3)} {ratio(m['onnxtrain'], bound)} "
              f"{ratio(m['torch'], m['onnxtrain'])}")
    for r in ok:
        print(f"   probes during {r['model']} (median GB/s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["bandwidth_gbs"]["median"].items()))

    print(f"\n4. memory: peak RSS growth over {MEMORY_STEPS} steps after setup (MiB, fresh process each; "
          f"torch's step includes its AdamW moments, allocated on the first step, onnxtrain's at setup)")
    for r in ok:
        growth = r.get("rss_growth_mib")
        text = ", ".join(f"{k} {v:.1f}" for k, v in growth.items()) if growth else "skipped"
        print(f"{r['model']}: {text}; AdamW moments {8 * r['num_values'] / 2**20:.1f}")
        print(f"{'':{len(r['model'])}}  onnxtrain fwd+bwd arena: {r['memory_report']}; "
              f"|fwd+bwd loss - torch| {r['fwd_bwd_loss_abs_err']:.1e}; first step loss "
              f"onnxtrain {r['first_step_loss']['onnxtrain']:.4f}, torch {r['first_step_loss']['torch']:.4f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--models", default="bert,cnn,digits")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=2)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per measurement")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--json")
    add_torch_argument(parser)
    parser.add_argument("--child-memory", nargs=3, metavar=("ENGINE", "MODE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_memory:
        print(child_memory(*args.child_memory, threads=args.threads))
        return 0
    if not run_torch_lanes(args, argv):
        return 0

    probes = BandwidthProbes(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models.split(","):
            try:
                rows.append(bench(name, args, workdir, probes))
            except Exception as exc:  # one failing model must not hide the others
                rows.append({"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    print_report(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "torch": torch_description(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
