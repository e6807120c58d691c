#!/usr/bin/env python3
"""Measures the machine's fp32 GEMM peak: an n^3 matrix product in every GEMM library at hand.

    python3 bench/gemm_peak.py [--threads N] [--n 2048] [--runs 5]

Prints one JSON object {"numpy": GFLOP/s, "torch": ..., "onednn": ..., "errors": {...}} with the
median over ``runs`` of each source. Thread counts are fixed through the environment before any
BLAS loads, so run it as its own process (bench_inference.py does).

numpy is the reference the design names, but Debian's numpy and torch use whatever libblas.so.3
points at; on a machine with only the netlib reference BLAS they reach a few GFLOP/s. oneDNN's
``dnnl_sgemm`` (the library onnxtrain's GEMMs use) is measured too, through ctypes, so the peak
stays meaningful there.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import sys
import time


def _median_gflops(fn, n: int, runs: int, budget_s: float) -> float:
    start = time.perf_counter()
    fn()  # warmup (JIT, page faults)
    warmup_s = time.perf_counter() - start
    if warmup_s > budget_s:  # a very slow library (reference BLAS): one sample says enough
        return 2 * n ** 3 / warmup_s / 1e9
    times, start = [], time.perf_counter()
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return 2 * n ** 3 / statistics.median(times) / 1e9


def _numpy(a, b, c):
    import numpy as np
    return lambda: np.matmul(a, b, out=c)


def _torch(a, b, c, threads):
    import torch
    torch.set_num_threads(threads)
    ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)
    return lambda: torch.mm(ta, tb, out=tc)


def _onednn(a, b, c):
    name = ctypes.util.find_library("dnnl") or "libdnnl.so.2"
    lib = ctypes.CDLL(name)
    sgemm = lib.dnnl_sgemm  # row-major: C = alpha * op(A) op(B) + beta * C
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, f32, ptr, i64, ptr, i64, f32,
                      ptr, i64]
    sgemm.restype = ctypes.c_int
    m, k = a.shape
    n = b.shape[1]

    def run():
        status = sgemm(b"N", b"N", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0,
                       c.ctypes.data, n)
        if status != 0:
            raise RuntimeError(f"dnnl_sgemm returned status {status}")
    return run


SOURCES = ("numpy", "torch", "onednn")


def measure(threads: int, n: int, runs: int, budget_s: float, sources=SOURCES) -> dict:
    """GFLOP/s per source (median), with an "errors" entry for sources that failed."""
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    result, errors = {}, {}
    makers = {"numpy": lambda: _numpy(a, b, c), "torch": lambda: _torch(a, b, c, threads),
              "onednn": lambda: _onednn(a, b, c)}
    for source in sources:
        make = makers[source]
        try:
            fn = make()
            result[source] = _median_gflops(fn, n, runs, budget_s)
            # a cheap correctness probe, so a mis-called library cannot report a fake peak
            probe = a[:8].astype(np.float64) @ b[:, :8].astype(np.float64)
            if not np.allclose(c[:8, :8], probe, rtol=1e-3, atol=1e-2):
                raise RuntimeError("wrong result")
        except Exception as exc:  # a missing library just drops that source
            result.pop(source, None)
            errors[source] = f"{type(exc).__name__}: {exc}"
    result["errors"] = errors
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="fp32 GEMM peak of the libraries at hand")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--budget", type=float, default=10.0, help="seconds per source at most")
    p.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of "
                   + ",".join(SOURCES))
    args = p.parse_args(argv)
    if "numpy" in sys.modules:
        print("warning: numpy was imported before the thread settings", file=sys.stderr)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    sources = [s for s in args.sources.split(",") if s]
    unknown = set(sources) - set(SOURCES)
    if unknown:
        p.error(f"unknown sources: {', '.join(sorted(unknown))}")
    print(json.dumps(measure(args.threads, args.n, args.runs, args.budget, sources)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
