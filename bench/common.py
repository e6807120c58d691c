"""Helpers shared by the benchmark programs and the examples: finding the onnxtrain package,
timing a callable, and summarising timings."""
from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(REPO_ROOT, "bench")


def import_onnxtrain():
    """Imports onnxtrain from $PYTHONPATH (or wherever it is installed) and falls back to the
    repository's default build, ``<repo>/build/python``. Raises ImportError with a hint
    otherwise."""
    try:
        return importlib.import_module("onnxtrain")
    except ImportError as first:
        fallback = os.path.join(REPO_ROOT, "build", "python")
        if os.path.isdir(os.path.join(fallback, "onnxtrain")) and fallback not in sys.path:
            sys.path.insert(0, fallback)
            sys.modules.pop("onnxtrain", None)
            try:
                return importlib.import_module("onnxtrain")
            except ImportError as second:
                raise ImportError(f"onnxtrain in {fallback} does not import: {second}") from second
        raise ImportError(f"onnxtrain is not importable ({first}); build it with `make build` "
                          "or point PYTHONPATH at <build dir>/python") from first


def time_ms(fn: Callable[[], object], warmup: int, runs: int,
            budget_s: Optional[float] = None, gap_s: float = 0.0) -> List[float]:
    """Calls ``fn`` ``warmup`` times untimed, then ``runs`` times; returns each run's wall time in
    milliseconds.

    With ``budget_s``, warmup and timed runs each stop early once they have used that many seconds
    (after at least one call each), so a very slow engine does not stall a whole benchmark. With
    ``gap_s``, each timed call follows that long idle (requests that arrive apart), outside the
    budget.
    """
    start = time.perf_counter()
    for i in range(warmup):
        fn()
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    times: List[float] = []
    for _ in range(runs):
        if gap_s > 0:
            time.sleep(gap_s)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        if budget_s is not None and sum(times) > 1e3 * budget_s:
            break
    return times


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM): what the process holds, and its peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_models(names: Sequence[str], bench_one: Callable[[str], dict]) -> List[dict]:
    """``bench_one(name)`` for each model; a model that fails becomes a row holding its error, so
    one failure does not hide the others."""
    rows = []
    for name in names:
        try:
            rows.append(bench_one(name))
        except Exception as exc:  # noqa: BLE001 (reported in the table)
            rows.append({"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    return rows


def report_rows(rows: Sequence[dict], table_line: Callable[[dict], str], detail_line: Callable[[dict], str],
                json_path: Optional[str] = None) -> None:
    """Prints one table line per row (or its error), then a detail line per good row; writes the
    rows as JSON when ``json_path`` is given."""
    for r in rows:
        print(f"{r['model']:6} ERROR {r['error']}" if "error" in r else table_line(r))
    for r in rows:
        if "error" not in r:
            print(detail_line(r))
    if json_path:
        import json
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=2)


# --------------------------------------------------------------------------------------------------
# Which PyTorch a comparison runs against.
#
# Debian's torch 1.13 links a generic BLAS (OpenBLAS through libblas.so.3), which reaches a fraction
# of this CPU's fp32 GEMM rate; PyTorch 2.x from PyPI (the `torch2` peer) links MKL. A comparison with
# PyTorch runs in one process with onnxtrain (interleaved, same threads), so each torch is its own
# run of the whole benchmark in its own interpreter: `--torch both` (the default) runs the Debian lane
# here and then the torch2 lane in the torch2 peer's interpreter, each printing its own table
# headed by the torch it measured.

TORCH_LANES = ("debian", "torch2")


def add_torch_argument(parser) -> None:
    parser.add_argument("--torch", choices=(*TORCH_LANES, "both"), default="both",
                        help="the PyTorch to compare against: Debian's 1.13 (generic BLAS), PyPI's 2.x "
                             "(the torch2 peer, MKL), or both, one run after the other (default)")


def current_torch_lane() -> str:
    sys.path.insert(0, BENCH_DIR)
    import peers
    return peers.lane_of_interpreter()


def run_torch_lanes(args, argv: Optional[Sequence[str]] = None) -> bool:
    """Puts this benchmark in the lane(s) ``args.torch`` asks for. Returns True when this process
    should run the benchmark now: the lane is this interpreter's (with ``both``, after which the
    other lane runs as a child process), False when a child did all the work. The child gets the
    same arguments with ``--torch`` set to its lane; its exit status becomes this one's failure."""
    sys.path.insert(0, BENCH_DIR)
    import subprocess

    import peers

    argv = list(sys.argv[1:] if argv is None else argv)
    here = peers.lane_of_interpreter()
    wanted = TORCH_LANES if args.torch == "both" else (args.torch,)

    def run_in(lane: str) -> None:
        python = peers.ensure("torch2") if lane == "torch2" else "/usr/bin/python3"
        child_argv = [a for i, a in enumerate(argv) if a != "--torch" and not a.startswith("--torch=")
                      and not (i > 0 and argv[i - 1] == "--torch")]
        # a report file of the other lane gets the lane's name: x.json -> x.torch2.json
        child_argv = [f"{os.path.splitext(a)[0]}.{lane}{os.path.splitext(a)[1]}" if i > 0 and child_argv[i - 1] == "--json" else a
                      for i, a in enumerate(child_argv)]
        env = dict(os.environ)
        build_python = os.path.join(REPO_ROOT, "build", "python")
        if "onnxtrain" not in sys.modules:
            env.setdefault("PYTHONPATH", build_python)
        else:  # the child imports the same onnxtrain build as this process
            onnxtrain_dir = os.path.dirname(os.path.dirname(sys.modules["onnxtrain"].__file__))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (onnxtrain_dir, env.get("PYTHONPATH")) if p)
        print(f"\n=== the {lane} torch lane ({python}) ===", flush=True)
        subprocess.run([python, sys.argv[0], *child_argv, "--torch", lane], env=env, check=True)

    if here not in wanted:  # e.g. `--torch torch2` from Debian's interpreter: the child does it all
        for lane in wanted:
            run_in(lane)
        return False
    if len(wanted) > 1:
        import atexit
        others = [lane for lane in wanted if lane != here]
        atexit.register(lambda: [run_in(lane) for lane in others])
    return True


def torch_description() -> str:
    """The PyTorch this process compares against, with the BLAS library it loaded, e.g.
    "PyTorch 2.15.0+cu132 (MKL)" or "PyTorch 1.13.0a0 (OpenBLAS, libopenblasp-r0.3.21.so)". The BLAS
    is read from the libraries mapped into the process after a matrix product."""
    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)
    import re
    match = re.search(r"\bBLAS_INFO=(\w+)", torch.__config__.show())
    blas = match.group(1) if match else "unknown"
    loaded = set()  # numpy's BLAS shows here too: MKL is linked into libtorch statically
    with open("/proc/self/maps") as maps:
        for line in maps:
            name = os.path.basename(line.split()[-1]) if "/" in line else ""
            if any(key in name.lower() for key in ("openblas", "libmkl", "libblas", "blis")):
                loaded.add(name)
    if blas == "mkl":
        kind = "MKL"
    elif any("openblas" in name for name in loaded):
        kind = "OpenBLAS, " + ", ".join(sorted(n for n in loaded if "openblas" in n))
    else:
        kind = f"BLAS_INFO={blas}" + (f", {', '.join(sorted(loaded))}" if loaded else "")
    return f"PyTorch {torch.__version__} ({kind})"
