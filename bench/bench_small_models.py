#!/usr/bin/env python3
"""Per-call time of the corpus' small streaming models, onnxtrain against ONNX Runtime (the `ort`
peer), same thread count: models called once per audio frame, where a call's fixed costs (packing,
waking threads, running subgraphs) matter more than its arithmetic. Target: at most 1.2x ORT's time.

  * openWakeWord wake-word heads "hey jarvis" and "alexa" (Flatten + Gemm layers on a 1x16x96
    embedding window, a few hundred thousand multiply-adds), from openwakeword 0.5.1;
  * Silero VAD v6 (spox export: the model inside nested Ifs, an LSTM) and its PyTorch 2.3 op15
    export, on one 512-sample frame at 16 kHz, from silero-vad 6.2.3.

Each engine runs `--rounds` rounds of `--runs` calls, interleaved (ORT in its own process per round);
the table gives medians over all calls and the best round.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_small_models.py [--threads 1] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from common import REPO_ROOT, import_onnxtrain, median, time_ms  # noqa: E402

TARGET_VS_ORT = 1.2
OWW = ("openwakeword", "openwakeword/resources/models")
VAD = ("silero-vad", "silero_vad/data")


def _window():
    return np.random.default_rng(0).standard_normal((1, 16, 96)).astype(np.float32)


def _frame():
    rng = np.random.default_rng(1)
    return {"input": (rng.standard_normal((1, 512)) * 0.1).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


# name: (package, folder in the wheel, file, feeds)
MODELS = {
    "oww_hey_jarvis": (*OWW, "hey_jarvis_v0.1.onnx", lambda: {"x.1": _window()}),
    "oww_alexa": (*OWW, "alexa_v0.1.onnx", lambda: {"onnx::Flatten_0": _window()}),
    "silero_v6": (*VAD, "silero_vad.onnx", _frame),
    "silero_op15": (*VAD, "silero_vad_16k_op15.onnx", _frame),
}


def corpus_paths() -> dict:
    """Model name -> path in the corpus cache (tests/corpus/fetch_corpus.sh, pins in wheels.txt)."""
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "tests", "corpus", "fetch_corpus.sh")],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"tests/corpus/fetch_corpus.sh failed: {proc.stderr.strip()[-500:]}")
    cache = proc.stdout.strip().splitlines()[-1]
    pins = {}
    with open(os.path.join(REPO_ROOT, "tests", "corpus", "wheels.txt")) as f:
        for line in f:
            spec = line.split("#")[0].split()
            if spec:
                name, version = spec[0].split("==")
                pins[name] = f"{name}-{version}"
    return {m: os.path.join(cache, pins[pkg], folder, file) for m, (pkg, folder, file, _) in MODELS.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    ot = import_onnxtrain()
    ot.set_num_threads(args.threads)
    peers.ensure("ort")
    paths = corpus_paths()
    print(f"small models, per call: {args.threads} thread(s), {args.rounds} rounds x {args.runs} calls, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':16} {'onnxtrain us':>12} {'ORT us':>8} {'ot/ORT':>7} {'best':>6}  verdict")
    for name in args.models.split(","):
        feeds = MODELS[name][3]()
        session = ot.InferenceSession(paths[name])
        ours, theirs, best = [], [], []
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(args.rounds):
                o = time_ms(lambda: session.run(None, feeds), warmup=20, runs=args.runs)
                t = peers.ort_time(paths[name], feeds, workdir, threads=args.threads, warmup=20,
                                   runs=args.runs)["times_ms"]
                ours += o
                theirs += t
                best.append(median(o) / median(t))
        ratio = median(ours) / median(theirs)
        verdict = "met" if ratio <= TARGET_VS_ORT else "NOT met"
        print(f"{name:16} {1e3 * median(ours):12.1f} {1e3 * median(theirs):8.1f} {ratio:7.2f} {min(best):6.2f}  {verdict}")


if __name__ == "__main__":
    main()
