"""Times one ONNX model in ONNX Runtime's CPU engine. Runs in the `ort` peer's interpreter
(bench/peers.py starts it there); imports nothing of onnxtrain.

  python ort_runner.py --model m.onnx --input NAME=file.npy [--input ...] [--threads N]
                       [--warmup W] [--runs R] [--budget-ms B] [--gap-ms G] [--save-outputs DIR]

Prints one JSON object on stdout: {median_ms, min_ms, mean_ms, runs, times_ms, threads,
ort_version, load_ms, outputs: [{name, dims, type, sum, file}]}; with --save-outputs every output is
written as DIR/<index>.npy so the caller can compare it. With --budget-ms, warmup and timed runs
each stop once they have used that long (after at least one run each). With --gap-ms, each timed run
follows G ms idle (requests that arrive apart: the thread pool has gone to sleep), outside the
budget. Errors go to stderr with a nonzero exit status.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--input", action="append", default=[], metavar="NAME=file.npy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--budget-ms", type=float, default=float("inf"))
    p.add_argument("--gap-ms", type=float, default=0.0)
    p.add_argument("--save-outputs", default=None, metavar="DIR")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    feeds = {}
    for spec in args.input:
        name, eq, file = spec.partition("=")
        if not eq or not name:
            p.error(f"--input wants NAME=file.npy, got '{spec}'")
        feeds[name] = np.load(file, allow_pickle=False)
    return args, feeds


def main(argv):
    args, feeds = parse_args(argv)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    t0 = time.perf_counter()
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3

    missing = [i.name for i in session.get_inputs() if i.name not in feeds]
    if missing:
        raise SystemExit(f"ort_runner: no --input for model inputs: {', '.join(missing)}")
    budget_s = args.budget_ms / 1e3
    outputs = session.run(None, feeds)  # also the first warmup run
    warm_start = time.perf_counter()
    for _ in range(1, args.warmup):
        if time.perf_counter() - warm_start >= budget_s:
            break
        outputs = session.run(None, feeds)
    times = []
    for _ in range(args.runs):
        if args.gap_ms > 0:
            time.sleep(args.gap_ms / 1e3)
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
        if sum(times) > args.budget_ms:
            break

    report = []
    if args.save_outputs:
        os.makedirs(args.save_outputs, exist_ok=True)
    for index, (meta, value) in enumerate(zip(session.get_outputs(), outputs)):
        value = np.asarray(value)
        item = {"name": meta.name, "dims": list(value.shape), "type": str(value.dtype),
                "sum": float(value.sum()) if value.dtype.kind in "biuf" else None}
        if args.save_outputs:
            item["file"] = os.path.join(args.save_outputs, f"{index}.npy")
            np.save(item["file"], value)
        report.append(item)
    print(json.dumps({"median_ms": statistics.median(times), "min_ms": min(times),
                      "mean_ms": statistics.fmean(times), "runs": len(times), "times_ms": times,
                      "threads": args.threads, "ort_version": ort.__version__, "load_ms": load_ms,
                      "outputs": report}))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as exc:  # noqa: BLE001 (one line on stderr, nonzero exit: the caller reports it)
        print(f"ort_runner: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
