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
