#!/usr/bin/env python3
"""CNN benchmark: the speed targets of real-world CNNs, against ONNX Runtime and PyTorch eager.

1. **Forward** at batch 1 and batch 16 (target: onnxtrain's time at most 1.0x ONNX Runtime's, the
   `ort` peer's onnxruntime 1.31, same threads) of
   * the corpus' CNNs (tests/corpus/fetch_corpus.sh, cached outside the repository): PP-OCRv4
     detection (3x160x160), PP-OCRv4 recognition (3x48x160), PP-OCR mobile direction classifier
     (3x48x192), all paddle2onnx exports (hard-swish and hard-sigmoid written out, squeeze-excitation
     blocks), and openWakeWord's speech embedding (tf2onnx, 76x32x1);
   * MobileNetV2 (3x96x96) and a ResNet-18-shaped network with BatchNorm (3x32x32), exported from
     torch (bench/models.py).
2. **Train step** (forward, backward, AdamW) of the ResNet and MobileNetV2 at batch 16 with a
   cross-entropy loss: onnxtrain's Module + Optimizer against PyTorch eager with torch.optim.AdamW
   (target: at least 2.5x faster than torch).

Engines alternate round by round, so load on a shared machine hits both; only the ratios of one run
mean anything. ``--short`` (under 3 minutes on a quiet 2-core machine) takes fewer rounds and runs.
``--profile`` prints onnxtrain's kernel time per op type for every forward model (from the
executor's per-node profiler) and ORT's time next to it. ``--gap-ms 20`` times each forward run
after 20 ms idle, as a server sees requests that arrive apart: both engines' thread pools have
gone to sleep and their caches have cooled.

    scripts/setup_peers.sh ort  # once: the ONNX Runtime venv (make bench does it)
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_cnn.py [--short] [--threads 2] [--profile]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH_DIR, REPO_ROOT, add_torch_argument, import_onnxtrain, median,  # noqa: E402
                    run_torch_lanes, time_ms, torch_description)

TARGET_VS_ORT = 1.0    # onnxtrain forward time / ORT's, at most
TARGET_VS_TORCH = 2.5  # torch train-step time / onnxtrain's, at least
BATCHES = (1, 16)
TRAIN_BATCH = 16

OCR = ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models")
OWW = ("openwakeword", "openwakeword/resources/models")
# name: ((wheel of the corpus, folder in it), file, input name, input shape after the batch dim)
CORPUS = {
    "ppocr_det": (OCR, "ch_PP-OCRv4_det_infer.onnx", "x", (3, 160, 160)),
    "ppocr_rec": (OCR, "ch_PP-OCRv4_rec_infer.onnx", "x", (3, 48, 160)),
    "ppocr_cls": (OCR, "ch_ppocr_mobile_v2.0_cls_infer.onnx", "x", (3, 48, 192)),
    "oww_embedding": (OWW, "embedding_model.onnx", "input_1", (76, 32, 1)),
}
TORCH_MODELS = ("mobilenetv2", "resnet")
FORWARD_MODELS = (*CORPUS, *TORCH_MODELS)


def corpus_dir() -> str:
    """The corpus cache (tests/corpus/fetch_corpus.sh fetches it when missing)."""
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "tests", "corpus", "fetch_corpus.sh")],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/corpus/fetch_corpus.sh failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip().splitlines()[-1]


def corpus_file(cache: str, package: str, file: str) -> str:
    """`file` in the unpacked wheel of `package`, at its version pinned in tests/corpus/wheels.txt."""
    with open(os.path.join(REPO_ROOT, "tests", "corpus", "wheels.txt")) as f:
        pins = dict(line.split("#")[0].split()[0].split("==") for line in f if line.split("#")[0].strip())
    return os.path.join(cache, f"{package}-{pins[package]}", file)


def forward_case(name: str, batch: int, out_dir: str, cache: Callable[[], str]) -> Tuple[str, Dict[str, np.ndarray]]:
    """(model path, feeds) of forward model ``name`` at ``batch``."""
    rng = np.random.default_rng(0)
    if name in CORPUS:
        (package, folder), file, input_name, shape = CORPUS[name]
        path = corpus_file(cache(), package, os.path.join(folder, file))
        return path, {input_name: rng.standard_normal((batch, *shape)).astype(np.float32)}
    import models
    spec = models.MODELS[name]
    model, inputs = spec.build(seed=0, batch=batch)
    path = os.path.join(out_dir, f"{name}_b{batch}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.export(model, inputs, path, spec.input_names, spec.output_names)
    return path, {n: t.numpy() for n, t in zip(spec.input_names, inputs)}


def bench_forward(args, ot, workdir: str) -> List[dict]:
    from bench_inference import EngineResult, OnnxtrainEngine, OrtEngine, save_feeds
    ot_engine = OnnxtrainEngine(ot, args.threads, args.budget, args.gap_ms / 1e3)
    ort_engine = OrtEngine(args.threads, workdir, args.budget, args.gap_ms / 1e3)
    if ort_engine.unavailable:
        print(f"warning: ORT unavailable: {ort_engine.unavailable}", file=sys.stderr)
    cached: List[str] = []
    cache = lambda: cached[0] if cached else (cached.append(corpus_dir()) or cached[0])  # noqa: E731
    rows = []
    for name in args.forward:
        for batch in args.batches:
            key = f"{name}_b{batch}"
            print(f"  forward {key} ...", flush=True)
            res = {e: EngineResult() for e in ("onnxtrain", "ORT")}
            try:
                path, feeds = forward_case(name, batch, args.out_dir, cache)
            except Exception as exc:  # noqa: BLE001 (reported in the table)
                rows.append({"model": name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            files = save_feeds(workdir, key, feeds)
            for engine, r in ((ot_engine, res["onnxtrain"]), (ort_engine, res["ORT"])):
                try:
                    engine.prepare(key, path, files)
                except Exception as exc:  # noqa: BLE001
                    r.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            runs, warmup = case_runs(args, ot_engine, key, feeds, res["onnxtrain"])
            for _ in range(args.rounds):
                if res["onnxtrain"].error is None:
                    ot_engine.run(key, feeds, warmup, runs, res["onnxtrain"])
                if res["ORT"].error is None:
                    ort_engine.run(key, warmup, runs, res["ORT"])
            err = float("nan")
            if res["onnxtrain"].ok and res["ORT"].ok:
                err = max(float(np.max(np.abs(a.astype(np.float64) - b)) / (1 + np.max(np.abs(b))))
                          for a, b in zip(res["onnxtrain"].outputs, res["ORT"].outputs))
            best = [min(r.times_ms) if r.ok else float("nan") for r in (res["onnxtrain"], res["ORT"])]
            row = {"model": name, "batch": batch, "ot_ms": res["onnxtrain"].median_ms, "ort_ms": res["ORT"].median_ms,
                   "best_ratio": best[0] / best[1], "rel_err": err, "error": res["onnxtrain"].error or res["ORT"].error}
            if args.profile and res["onnxtrain"].ok:
                row["profile"] = profile_report(ot, path, feeds, args.threads)
            rows.append(row)
            ot_engine.sessions.pop(key, None)
    return rows


def case_runs(args, ot_engine, key: str, feeds: Dict[str, np.ndarray], result) -> Tuple[int, int]:
    """(timed runs, warm-up runs) per engine per round for one case: at least ``--runs``, and as
    many as fill ``--round-ms`` at onnxtrain's speed (capped at 500), so that a sub-millisecond
    batch-1 model gets hundreds of samples rather than ten (its medians swung 0.6-1.8x between runs
    of 10); warm-up a tenth of that, at least ``--warmup``. Both engines get the same counts."""
    if result.error is not None:
        return args.runs, args.warmup
    try:
        probe = ot_engine.sessions[key]
        probe.run(None, feeds)
        estimate = min(time_ms(lambda: probe.run(None, feeds), 0, 3))
    except Exception as exc:  # noqa: BLE001 (reported in the table by the timed runs)
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return args.runs, args.warmup
    runs = max(args.runs, min(500, int(args.round_ms / max(estimate, 1e-3))))
    if args.gap_ms > 0:  # the idle time, not the runs, dominates a round: about a second of it
        runs = max(args.runs, min(runs, int(1000 / args.gap_ms)))
    return runs, max(args.warmup, runs // 10)


def profile_report(ot, path: str, feeds: Dict[str, np.ndarray], threads: int, runs: int = 10) -> str:
    """onnxtrain's kernel time per op type per run, from the executor's per-node profiler, over
    ``runs`` runs after warm-up (the first run also builds the primitives)."""
    options = ot.SessionOptions()
    options.enable_profiling = True
    options.num_threads = threads
    sess = ot.InferenceSession(path, options)
    for _ in range(3):
        sess.run(None, feeds)
    before = {p["node"]: p["total_us"] for p in sess.profile()}
    for _ in range(runs):
        sess.run(None, feeds)
    by_type: Dict[str, List[float]] = {}
    for p in sess.profile():
        entry = by_type.setdefault(p["op_type"], [0, 0.0])
        entry[0] += 1
        entry[1] += (p["total_us"] - before.get(p["node"], 0.0)) / runs / 1e3
    total = sum(ms for _, ms in by_type.values())
    lines = [f"{'op type':24s} {'nodes':>5s} {'ms/run':>8s} {'share':>6s}"]
    for op, (nodes, ms) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        if ms >= 0.01 * total:
            lines.append(f"{op:24s} {nodes:5d} {ms:8.3f} {100 * ms / total:5.1f}%")
    lines.append(f"{'kernels total':24s} {'':5s} {total:8.3f}")
    return "\n".join(lines)


def bench_train(args, ot, workdir: str) -> List[dict]:
    import torch
    import models
    from bench_training import OnnxtrainTrainer, TorchTrainer
    rows = []
    for name in args.train:
        print(f"  train step {name} (batch {TRAIN_BATCH}) ...", flush=True)
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        model = models.MobileNetV2(num_classes=10) if name == "mobilenetv2" else models.SmallResNet()
        image = 96 if name == "mobilenetv2" else 32
        x, target = torch.randn(TRAIN_BATCH, 3, image, image, generator=g), torch.randint(0, 10, (TRAIN_BATCH,), generator=g)
        module = models.WithCrossEntropy(model).train()
        try:
            ours = OnnxtrainTrainer(model, x, target, os.path.join(workdir, f"train_{name}"))
        except Exception as exc:  # noqa: BLE001
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]})
            continue
        theirs = TorchTrainer(module, x, target)
        ot_times, torch_times = [], []
        for _ in range(args.rounds):
            ot.set_num_threads(args.threads)
            ot_times += time_ms(ours.step, args.warmup, args.runs, args.budget)
            torch.set_num_threads(args.threads)
            torch_times += time_ms(theirs.step, args.warmup, args.runs, args.budget)
        rows.append({"model": name, "batch": TRAIN_BATCH, "ot_ms": median(ot_times), "torch_ms": median(torch_times)})
    return rows


def report(forward: List[dict], train: List[dict]) -> None:
    if forward:
        print(f"\nforward (target: onnxtrain / ORT <= {TARGET_VS_ORT})")
        # best: the ratio of the two engines' fastest runs, which load on a shared machine disturbs least
        print(f"{'model':14s} {'batch':>5s} {'onnxtrain ms':>12s} {'ORT ms':>9s} {'ot/ORT':>7s} {'best':>6s} {'rel err':>8s}  verdict")
        for r in forward:
            if r.get("error"):
                print(f"{r['model']:14s} {r['batch']:5d}  ERROR {r['error']}")
                continue
            ratio = r["ot_ms"] / r["ort_ms"]
            print(f"{r['model']:14s} {r['batch']:5d} {r['ot_ms']:12.2f} {r['ort_ms']:9.2f} {ratio:7.2f} {r['best_ratio']:6.2f} "
                  f"{r['rel_err']:8.1e}  "
                  f"{'met' if ratio <= TARGET_VS_ORT else 'NOT met'}")
        for r in forward:
            if r.get("profile"):
                print(f"\n[{r['model']} batch {r['batch']}] onnxtrain {r['ot_ms']:.2f} ms, ORT {r['ort_ms']:.2f} ms; "
                      f"onnxtrain kernels by op type:\n{r['profile'].rstrip()}")
    if train:
        print(f"\ntrain step, batch {TRAIN_BATCH} (target: torch / onnxtrain >= {TARGET_VS_TORCH})")
        print(f"{'model':14s} {'onnxtrain ms':>12s} {'torch ms':>9s} {'torch/ot':>8s}  verdict")
        for r in train:
            if r.get("error"):
                print(f"{r['model']:14s}  ERROR {r['error']}")
                continue
            speedup = r["torch_ms"] / r["ot_ms"]
            print(f"{r['model']:14s} {r['ot_ms']:12.2f} {r['torch_ms']:9.2f} {speedup:8.2f}  "
                  f"{'met' if speedup >= TARGET_VS_TORCH else 'NOT met'}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--short", action="store_true", help="2 rounds x 5 runs (the quick check)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4, --short 2)")
    p.add_argument("--runs", type=int, default=None, help="timed runs per engine per round (default 10, --short 5)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--round-ms", type=float, default=None,
                   help="forward: more runs per round for fast cases, to fill this many ms "
                        "(default 300, --short 150)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per engine per round after which timing stops early (default 3, --short 1.5)")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="forward: idle before each timed run, as between requests that arrive apart (the "
                        "thread pools have gone to sleep); default 0, back to back")
    p.add_argument("--forward", default=",".join(FORWARD_MODELS), help="forward models ('' for none)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--train", default=",".join(TORCH_MODELS), help="train-step models ('' for none)")
    p.add_argument("--profile", action="store_true", help="onnxtrain's kernel time per op type per forward model")
    p.add_argument("--out-dir", default=os.path.join(BENCH_DIR, "out"))
    add_torch_argument(p)
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.short else 4)
    args.runs = args.runs or (5 if args.short else 10)
    args.budget = args.budget or (1.5 if args.short else 3.0)
    args.round_ms = args.round_ms if args.round_ms is not None else (150.0 if args.short else 300.0)
    args.forward = [m for m in args.forward.split(",") if m]
    args.train = [m for m in args.train.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    unknown = [m for m in args.forward if m not in FORWARD_MODELS] + [m for m in args.train if m not in TORCH_MODELS]
    if unknown:
        p.error(f"unknown models: {', '.join(unknown)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.train and not run_torch_lanes(args, argv):  # the train step is timed against PyTorch
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    ot = import_onnxtrain()
    workdir = tempfile.mkdtemp(prefix="cnn_", dir=args.out_dir)
    gap = f", {args.gap_ms:g} ms idle before each" if args.gap_ms else ""
    print(f"onnxtrain CNN benchmark: {args.threads} threads, {args.rounds} rounds x at least {args.runs} runs "
          f"(forward: up to {args.round_ms:g} ms a round{gap}), medians; load average {os.getloadavg()[0]:.1f}; "
          f"{torch_description() if args.train else 'PyTorch not timed'}")
    forward = bench_forward(args, ot, workdir)
    train = bench_train(args, ot, workdir)
    report(forward, train)
    return 0


if __name__ == "__main__":
    sys.exit(main())
