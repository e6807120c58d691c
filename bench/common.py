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
            budget_s: Optional[float] = None) -> List[float]:
    """Calls ``fn`` ``warmup`` times untimed, then ``runs`` times; returns each run's wall time in
    milliseconds.

    With ``budget_s``, warmup and timed runs each stop early once they have used that many seconds
    (after at least one call each), so a very slow engine does not stall a whole benchmark.
    """
    start = time.perf_counter()
    for i in range(warmup):
        fn()
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    times: List[float] = []
    start = time.perf_counter()
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
