#!/usr/bin/env python3
"""Inference benchmark: onnxtrain against ONNX Runtime (the `ort` peer: onnxruntime 1.31 from PyPI) and PyTorch on CPU.

For each model in bench/models.py (MLP, CNN with BatchNorm, BERT-style encoder) it exports the model
to bench/out/, times one forward pass in each engine with the same thread count, checks onnxtrain's
and ONNX Runtime's outputs against PyTorch, and prints a table with the ratios and the achieved
GFLOP/s (MatMul/Gemm/Conv FLOPs only). It also times a 1024^3 fp32 MatMul model against numpy's
2048^3 GEMM (and torch's and oneDNN's sgemm: see gemm_peak.py), measured in the same run,
as the fp32 peak.

The machine is shared and noisy, so every number is a median over several rounds that interleave
the engines, and only ratios measured in the same run are meaningful. An engine that cannot run a
model (a missing op, a missing peer) gets an error in its cell; the rest of the table still prints.

    scripts/setup_peers.sh ort  # once: the ONNX Runtime venv (make bench does it)
    PYTHONPATH=build/python python3 bench/bench_inference.py [--threads 2] [--models mlp,bert]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from common import BENCH_DIR, add_torch_argument, import_onnxtrain, median, run_torch_lanes, time_ms, torch_description  # noqa: E402

TARGET_ORT_RATIO = 1.2      # onnxtrain time / ORT time should be at most this
TARGET_PEAK_FRACTION = 0.85  # onnxtrain 1024^3 MatMul should reach this fraction of numpy's peak
MATMUL_N = 1024
PEAK_N = 2048


# --------------------------------------------------------------------------------------------------
# Results


@dataclass
class EngineResult:
    """One engine's timings (ms, pooled over rounds) and outputs for one model, or its error."""

    times_ms: List[float] = field(default_factory=list)
    outputs: Optional[List[np.ndarray]] = None
    error: Optional[str] = None
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.times_ms)

    @property
    def median_ms(self) -> float:
        return median(self.times_ms) if self.ok else float("nan")


@dataclass
class ModelResult:
    name: str
    description: str
    flops: int
    engines: Dict[str, EngineResult]
    missing_ops: List[str]
    max_abs_err: Dict[str, float] = field(default_factory=dict)
    memory_report: str = ""


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------------------------------
# Engines


class OnnxtrainEngine:
    """Times a model in onnxtrain.InferenceSession."""

    name = "onnxtrain"

    def __init__(self, onnxtrain_module, threads: int, budget_s: Optional[float] = None, gap_s: float = 0.0):
        self.ot = onnxtrain_module
        self.threads = threads
        self.budget_s = budget_s
        self.gap_s = gap_s  # idle before each timed run (requests that arrive apart)
        self.sessions: Dict[str, object] = {}

    def prepare(self, key: str, path: str, feed_files: Sequence[Tuple[str, str]]) -> None:
        """Probes the model in a child process first (a kernel that crashes the process must not
        take the whole benchmark with it), then creates the session here."""
        self._probe(path, feed_files)
        self.ot.set_num_threads(self.threads)
        self.sessions[key] = self.ot.InferenceSession(path, num_threads=self.threads)

    def _probe(self, path: str, feed_files: Sequence[Tuple[str, str]]) -> None:
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(self.ot.__file__)))
        code = (
            "import sys, numpy as np\n"
            f"sys.path.insert(0, {package_parent!r})\n"
            "import onnxtrain\n"
            f"sess = onnxtrain.InferenceSession({path!r}, num_threads={self.threads})\n"
            f"sess.run(None, {{n: np.load(f) for n, f in {list(feed_files)!r}}})\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode < 0:
            try:
                sig = signal.Signals(-proc.returncode).name
            except ValueError:
                sig = str(-proc.returncode)
            tail = proc.stderr.strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"onnxtrain crashed running the model ({sig}) {tail[0]}".strip())
        # A Python-level error is raised again, with its own message, in the caller's process.

    def run(self, key: str, feeds: Dict[str, np.ndarray], warmup: int, runs: int,
            result: EngineResult) -> None:
        sess = self.sessions[key]
        self.ot.set_num_threads(self.threads)
        result.outputs = sess.run(None, feeds)
        result.times_ms += time_ms(lambda: sess.run(None, feeds), warmup, runs, self.budget_s, self.gap_s)

    def memory_report(self, key: str) -> str:
        sess = self.sessions.get(key)
        return sess.memory_report() if sess is not None else ""

    def missing_ops(self, path: str) -> List[str]:
        """Op types of the model (default domain) that have no registered CPU kernel."""
        import onnx
        model = onnx.load(path, load_external_data=False)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        have = {}
        for op in self.ot.registered_ops():
            if op.get("domain", "") in ("", "ai.onnx") and op.get("cpu", True):
                have.setdefault(op["op_type"], []).append(op["since_version"])
        used = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")})
        return [t for t in used if not any(v <= opset for v in have.get(t, []))]


class OrtEngine:
    """Times a model in ONNX Runtime through bench/ort_runner.py (one process of the `ort` peer per round)."""

    name = "ORT"

    def __init__(self, threads: int, workdir: str, budget_s: Optional[float] = None, gap_s: float = 0.0):
        self.threads = threads
        self.workdir = workdir
        self.budget_s = budget_s
        self.gap_s = gap_s  # idle before each timed run (requests that arrive apart)
        self.inputs: Dict[str, List[Tuple[str, str]]] = {}
        self.models: Dict[str, str] = {}
        self.unavailable = self._check_available()

    @staticmethod
    def _check_available() -> Optional[str]:
        try:
            peers.python("ort")
        except peers.PeerMissing as exc:
            return str(exc)
        return None

    def prepare(self, key: str, path: str, feed_files: Sequence[Tuple[str, str]]) -> None:
        if self.unavailable:
            raise RuntimeError(self.unavailable)
        self.inputs[key] = list(feed_files)
        self.models[key] = path

    def run(self, key: str, warmup: int, runs: int, result: EngineResult) -> None:
        out_dir = os.path.join(self.workdir, f"{key}_ort_outputs")
        cmd = [peers.python("ort"), peers.ORT_RUNNER, "--model", self.models[key],
               "--threads", str(self.threads), "--warmup", str(warmup), "--runs", str(runs),
               "--save-outputs", out_dir]
        if self.budget_s is not None:
            cmd += ["--budget-ms", str(1e3 * self.budget_s)]
        if self.gap_s > 0:
            cmd += ["--gap-ms", str(1e3 * self.gap_s)]
        for name, file in self.inputs[key]:
            cmd += ["--input", f"{name}={file}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH_DIR, timeout=900)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuntimeError(lines[0] if lines else f"ort_runner exited {proc.returncode}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        result.times_ms += report["times_ms"]
        result.outputs = [np.load(o["file"]) for o in report["outputs"]]
        result.extra["ort_version"] = report.get("ort_version")


class TorchEngine:
    """Times the PyTorch module itself (eval mode, no_grad)."""

    name = "torch"

    def __init__(self, threads: int, timed: bool = True, budget_s: Optional[float] = None):
        import torch
        self.torch = torch
        self.threads = threads
        self.budget_s = budget_s
        self.timed = timed  # False: only compute the reference outputs

    def run(self, model, inputs, warmup: int, runs: int, result: EngineResult) -> None:
        torch = self.torch
        torch.set_num_threads(self.threads)
        model.eval()
        with torch.no_grad():
            out = model(*inputs)
            result.outputs = [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]
            if self.timed:
                result.times_ms += time_ms(lambda: model(*inputs), warmup, runs, self.budget_s)
            else:
                result.error = "skipped"


# --------------------------------------------------------------------------------------------------
# Measurement


def _attempt(result: EngineResult, fn, *args) -> None:
    """Runs fn(*args), recording the first error in ``result`` instead of raising."""
    if result.error is not None:
        return
    try:
        fn(*args)
    except Exception as exc:  # an engine failing must not stop the benchmark
        result.error = _short_error(exc)


def _max_abs_err(outputs: Optional[List[np.ndarray]], reference: Optional[List[np.ndarray]]
                 ) -> float:
    if outputs is None or reference is None or len(outputs) != len(reference):
        return float("nan")
    errs = []
    for out, ref in zip(outputs, reference):
        if out.shape != ref.shape:
            return float("inf")
        errs.append(float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64)))))
    return max(errs)


def save_feeds(workdir: str, key: str, feeds: Dict[str, np.ndarray]) -> List[Tuple[str, str]]:
    """Writes every input as .npy under ``workdir``; returns (input name, file) pairs."""
    files = []
    for i, (name, value) in enumerate(feeds.items()):
        file = os.path.join(workdir, f"{key}_input{i}.npy")
        np.save(file, np.ascontiguousarray(value))
        files.append((name, file))
    return files


def bench_model(name: str, args, out_dir: str, workdir: str, ot_engine, ort_engine, torch_engine
                ) -> ModelResult:
    """Exports model ``name``, then times every engine over ``args.rounds`` interleaved rounds."""
    import onnx
    import models
    from onnx_flops import count_flops

    spec = models.MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path, model, inputs = models.export_spec(name, out_dir, seed=0)
    feeds = {n: t.numpy() for n, t in zip(spec.input_names, inputs)}
    flops = count_flops(onnx.load(path))["total"]
    feed_files = save_feeds(workdir, name, feeds)

    results = {e: EngineResult() for e in ("onnxtrain", "ORT", "torch")}
    missing: List[str] = []
    if ot_engine is None:
        results["onnxtrain"].error = "onnxtrain is not importable"
    else:
        missing = ot_engine.missing_ops(path)
        _attempt(results["onnxtrain"], ot_engine.prepare, name, path, feed_files)
    if ort_engine is None:
        results["ORT"].error = "skipped"
    else:
        _attempt(results["ORT"], ort_engine.prepare, name, path, feed_files)

    for _ in range(args.rounds):
        if ot_engine is not None:
            _attempt(results["onnxtrain"], ot_engine.run, name, feeds, args.warmup, args.runs,
                     results["onnxtrain"])
        if ort_engine is not None:
            _attempt(results["ORT"], ort_engine.run, name, args.warmup, args.runs, results["ORT"])
        _attempt(results["torch"], torch_engine.run, model, inputs, args.warmup, args.runs,
                 results["torch"])

    result = ModelResult(name, spec.description, flops, results, missing)
    reference = results["torch"].outputs
    for engine in ("onnxtrain", "ORT"):
        if results[engine].ok:
            result.max_abs_err[engine] = _max_abs_err(results[engine].outputs, reference)
    if ot_engine is not None and results["onnxtrain"].ok:
        try:
            result.memory_report = ot_engine.memory_report(name)
        except Exception as exc:
            result.memory_report = _short_error(exc)
    return result


def gemm_peak(threads: int, sources: Sequence[str], budget_s: float) -> Dict[str, object]:
    """Runs bench/gemm_peak.py (its own process, so BLAS thread settings apply); returns its JSON:
    GFLOP/s per source plus "errors"."""
    cmd = [sys.executable, os.path.join(BENCH_DIR, "gemm_peak.py"), "--threads", str(threads),
           "--n", str(PEAK_N), "--sources", ",".join(sources), "--budget", str(budget_s)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"gemm_peak.py exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def matmul_model(path: str, n: int = MATMUL_N) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Writes an fp32 MatMul model Y = A @ W (A an input, W an n x n initializer) to ``path``;
    returns the feeds and W."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((n, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"], name="matmul")], "matmul",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="onnxtrain-bench")
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return {"A": rng.standard_normal((n, n), dtype=np.float32)}, weight


def bench_matmul(args, out_dir: str, workdir: str, ot_engine, ort_engine) -> Dict[str, object]:
    """The 1024^3 MatMul in onnxtrain (and ORT) against the fp32 GEMM peak (numpy, torch and
    oneDNN's sgemm at 2048^3), interleaved over the rounds."""
    path = os.path.join(out_dir, "matmul.onnx")
    feeds, weight = matmul_model(path)
    feed_files = save_feeds(workdir, "matmul", feeds)
    reference = [feeds["A"].astype(np.float64) @ weight.astype(np.float64)]
    flops = 2 * MATMUL_N ** 3
    results = {"onnxtrain": EngineResult(), "ORT": EngineResult()}
    peaks: Dict[str, List[float]] = {}
    peak_errors: Dict[str, str] = {}
    sources: Sequence[str] = ("numpy", "torch", "onednn")
    if ot_engine is None:
        results["onnxtrain"].error = "onnxtrain is not importable"
    else:
        _attempt(results["onnxtrain"], ot_engine.prepare, "matmul", path, feed_files)
    if ort_engine is None:
        results["ORT"].error = "skipped"
    else:
        _attempt(results["ORT"], ort_engine.prepare, "matmul", path, feed_files)
    for _ in range(args.rounds):
        try:
            measured = gemm_peak(args.threads, sources, args.budget)
            peak_errors.update(measured.pop("errors", {}))
            for source, gflops in measured.items():
                peaks.setdefault(source, []).append(gflops)
        except Exception as exc:
            peak_errors["gemm_peak"] = _short_error(exc)
        # Later rounds skip sources far below the best (a reference BLAS takes seconds per call).
        best = max((median(v) for v in peaks.values()), default=0.0)
        sources = [s for s, v in peaks.items() if median(v) >= 0.25 * best] or sources
        if ot_engine is not None:
            _attempt(results["onnxtrain"], ot_engine.run, "matmul", feeds, args.warmup, args.runs,
                     results["onnxtrain"])
        if ort_engine is not None:
            _attempt(results["ORT"], ort_engine.run, "matmul", args.warmup, args.runs,
                     results["ORT"])
    by_source = {s: median(v) for s, v in peaks.items()}
    peak_source = max(by_source, key=by_source.get) if by_source else None
    errors = {e: _max_abs_err(r.outputs, reference) for e, r in results.items() if r.ok}
    return {"flops": flops, "peak_gflops": by_source.get(peak_source, float("nan")),
            "peak_source": peak_source, "peak_by_source": by_source, "peak_errors": peak_errors,
            "engines": results, "max_abs_err": errors}


# --------------------------------------------------------------------------------------------------
# Report


def _fmt(value: float, spec: str = ".2f", width: int = 0) -> str:
    text = "-" if value is None or not np.isfinite(value) else format(value, spec)
    return text.rjust(width) if width else text


def _ratio(num: float, den: float) -> float:
    return num / den if np.isfinite(num) and np.isfinite(den) and den > 0 else float("nan")


def print_model_table(results: Sequence[ModelResult], peak: float) -> None:
    header = ["model", "GFLOP", "onnxtrain ms", "ORT ms", "torch ms", "ot/ORT", "torch/ot",
              "ot GFLOP/s", "ot %peak", "ORT GFLOP/s", "ot err", "ORT err"]
    rows = []
    for r in results:
        ot, ort, th = (r.engines[e].median_ms for e in ("onnxtrain", "ORT", "torch"))
        ot_gflops = r.flops / ot / 1e6 if np.isfinite(ot) else float("nan")
        ort_gflops = r.flops / ort / 1e6 if np.isfinite(ort) else float("nan")
        rows.append([
            r.name, _fmt(r.flops / 1e9, ".3f"),
            _fmt(ot) if r.engines["onnxtrain"].ok else "ERROR",
            _fmt(ort) if r.engines["ORT"].ok else "ERROR",
            _fmt(th) if r.engines["torch"].ok else "ERROR",
            _fmt(_ratio(ot, ort)), _fmt(_ratio(th, ot)),
            _fmt(ot_gflops, ".1f"), _fmt(100 * _ratio(ot_gflops, peak), ".0f"),
            _fmt(ort_gflops, ".1f"),
            _fmt(r.max_abs_err.get("onnxtrain", float("nan")), ".1e"),
            _fmt(r.max_abs_err.get("ORT", float("nan")), ".1e"),
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(header))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))


def print_details(results: Sequence[ModelResult], tolerance: float) -> None:
    for r in results:
        notes = []
        if r.missing_ops:
            notes.append(f"ops without an onnxtrain kernel: {', '.join(r.missing_ops)}")
        for engine, res in r.engines.items():
            if res.error and res.error != "skipped":
                notes.append(f"{engine} error: {res.error}")
        for engine, err in r.max_abs_err.items():
            if not err <= tolerance:
                notes.append(f"{engine} output differs from torch: max abs err {err:.3g} "
                             f"> {tolerance:g}")
        if r.memory_report:
            notes.append("onnxtrain memory: " + " | ".join(r.memory_report.strip().splitlines()))
        if notes:
            print(f"\n[{r.name}] {r.description}")
            for note in notes:
                print(f"  {note}")


def print_matmul(mm: Dict[str, object], threads: int) -> None:
    peak = mm["peak_gflops"]
    sources = ", ".join(f"{s} {g:.1f}" for s, g in mm["peak_by_source"].items())
    print(f"\nfp32 GEMM peak ({PEAK_N}^3, {threads} threads, same run): "
          f"{_fmt(peak, '.1f')} GFLOP/s from {mm['peak_source']}  "
          f"[by source, GFLOP/s: {sources or 'none'}]")
    for source, error in mm["peak_errors"].items():
        print(f"  peak source {source} failed: {error}")
    numpy_gflops = mm["peak_by_source"].get("numpy", float("nan"))
    if np.isfinite(numpy_gflops) and np.isfinite(peak) and numpy_gflops < 0.25 * peak:
        print("  note: numpy's BLAS is far below the peak (the netlib reference libblas.so.3?); "
              "the peak is the best library measured")
    for engine, res in mm["engines"].items():
        label = f"{engine} MatMul {MATMUL_N}^3"
        if not res.ok:
            print(f"{label}: ERROR {res.error}")
            continue
        gflops = mm["flops"] / res.median_ms / 1e6
        frac = _ratio(gflops, peak)
        verdict = ""
        if engine == "onnxtrain":
            verdict = "  (target >= {:.0f}%: {})".format(
                100 * TARGET_PEAK_FRACTION, "met" if frac >= TARGET_PEAK_FRACTION else "NOT met")
        print(f"{label}: {res.median_ms:.2f} ms, {gflops:.1f} GFLOP/s, "
              f"{_fmt(100 * frac, '.0f')}% of peak, max abs err "
              f"{_fmt(mm['max_abs_err'].get(engine, float('nan')), '.1e')}{verdict}")


def print_verdicts(results: Sequence[ModelResult]) -> None:
    print(f"\ntarget: onnxtrain within {TARGET_ORT_RATIO}x of ORT on every model")
    for r in results:
        ratio = _ratio(r.engines["onnxtrain"].median_ms, r.engines["ORT"].median_ms)
        status = "-" if not np.isfinite(ratio) else ("met" if ratio <= TARGET_ORT_RATIO
                                                    else "NOT met")
        print(f"  {r.name:5s} ot/ORT = {_fmt(ratio)}  {status}")


def write_json(path: str, results: Sequence[ModelResult], mm, args) -> None:
    def engine_json(res: EngineResult):
        return {"median_ms": res.median_ms if res.ok else None, "error": res.error,
                "samples": len(res.times_ms)}
    data = {
        "threads": args.threads, "rounds": args.rounds, "runs": args.runs,
        "models": [{"name": r.name, "flops": r.flops, "missing_ops": r.missing_ops,
                    "max_abs_err": r.max_abs_err, "memory_report": r.memory_report,
                    "engines": {e: engine_json(res) for e, res in r.engines.items()}}
                   for r in results],
    }
    if mm is not None:
        data["matmul"] = {"peak_gflops": mm["peak_gflops"], "peak_source": mm["peak_source"],
                          "peak_by_source": mm["peak_by_source"], "flops": mm["flops"],
                          "engines": {e: engine_json(res) for e, res in mm["engines"].items()}}
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=float)


# --------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for every engine (default: all cores)")
    p.add_argument("--models", default="mlp,cnn,bert,matmul",
                   help="comma-separated subset of mlp,cnn,bert,matmul")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per model")
    p.add_argument("--runs", type=int, default=10, help="timed runs per engine per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per engine per round")
    p.add_argument("--budget", type=float, default=3.0,
                   help="seconds per engine per round after which warmup or timing stops early "
                   "(at least one run each; keeps a very slow engine from stalling the run)")
    p.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch timing")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="max abs error against torch reported as a mismatch")
    p.add_argument("--out-dir", default=os.path.join(BENCH_DIR, "out"))
    p.add_argument("--json", help="also write the results to this JSON file")
    add_torch_argument(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_torch and not run_torch_lanes(args, argv):
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    import models
    unknown = [m for m in wanted if m not in models.MODELS and m != "matmul"]
    if unknown:
        print(f"unknown models: {', '.join(unknown)}", file=sys.stderr)
        return 2

    try:
        ot = import_onnxtrain()
        ot_engine = OnnxtrainEngine(ot, args.threads, args.budget)
        where = os.path.dirname(os.path.dirname(os.path.abspath(ot.__file__)))
    except ImportError as exc:
        print(f"warning: {exc}", file=sys.stderr)
        ot_engine, where = None, "not importable"
    workdir = tempfile.mkdtemp(prefix="run_", dir=args.out_dir)
    ort_engine = None if args.no_ort else OrtEngine(args.threads, workdir, args.budget)
    # torch is always needed for the export and the reference outputs; --no-torch only skips timing.
    torch_engine = TorchEngine(args.threads, timed=not args.no_torch, budget_s=args.budget)

    print(f"onnxtrain inference benchmark: {args.threads} threads, {args.rounds} rounds x "
          f"{args.runs} runs (+{args.warmup} warmup), medians; onnxtrain from {where}; "
          f"{'PyTorch not timed' if args.no_torch else torch_description()}")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores: other work competes "
              "for the CPU, so times are noisy and thread pools that spin (OpenMP) suffer most",
              file=sys.stderr)
    if ort_engine is not None and ort_engine.unavailable:
        print(f"warning: ORT unavailable: {ort_engine.unavailable}", file=sys.stderr)

    results: List[ModelResult] = []
    try:
        for name in (m for m in wanted if m != "matmul"):
            print(f"  running {name} ...", flush=True)
            results.append(bench_model(name, args, args.out_dir, workdir, ot_engine,
                                       ort_engine, torch_engine))
        mm = None
        if "matmul" in wanted:
            print("  running matmul ...", flush=True)
            mm = bench_matmul(args, args.out_dir, workdir, ot_engine, ort_engine)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    peak = mm["peak_gflops"] if mm is not None else float("nan")
    print()
    if results:
        print_model_table(results, peak)
        print("\nms: median forward time; ot/ORT: onnxtrain time over ORT time (target <= "
              f"{TARGET_ORT_RATIO}); torch/ot: speed-up over PyTorch; GFLOP/s counts "
              "MatMul/Gemm/Conv only; %peak: against the fp32 GEMM peak measured below; "
              "err: max abs error vs torch")
        print_details(results, args.tolerance)
    if mm is not None:
        print_matmul(mm, args.threads)
    if results:
        print_verdicts(results)
    if args.json:
        write_json(args.json, results, mm, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
