#!/usr/bin/env python3
"""Fine-tune an int4 language model on a laptop CPU with LoRA adapters, end to end with onnxtrain.

    PYTHONPATH=build/python /usr/bin/python3 examples/lora_finetune.py          # a few minutes on 2 cores

1. Builds a 22M-parameter decoder-only LM (examples/tiny_llm.py) in the layout ONNX Runtime GenAI's
   model builder emits: RMSNorm (SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization),
   RotaryEmbedding, GroupQueryAttention (8 query heads, 2 kv heads), SwiGLU MLP; byte-level tokens.
2. Pre-trains it briefly in fp32 (all weights, AdamW) on licence texts that ship with Debian
   (/usr/share/common-licenses: Apache-2.0, Artistic, BSD, GFDL-1.3, LGPL-2.1, MPL-2.0), or reuses
   examples/out/lora/pretrained.onnx when an earlier run saved it.
3. Quantizes every MatMul to int4 MatMulNBits (block 32) with onnxtrain.quantize and prints the
   per-layer error.
4. Generates LoRA artifacts on the int4 model (rank 8, alpha 16 on q/k/v/o/gate/up/down) and
   fine-tunes them on the GPL-3 text (its last 10% held out), with a progress bar.
5. Prints held-out perplexity and a generated sample before and after, draws the loss curves
   (examples/out/lora/loss.png), exports the adapters (PEFT safetensors) and the adapted model.
6. Runs the same fine-tuning from the command line (onnxtrain quantize / artifacts --lora-* / train).

Exits 1 when fine-tuning does not lower the held-out perplexity.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.join(REPO, "bench"))
from common import import_onnxtrain  # noqa: E402
from tiny_llm import Config, build_model, byte_windows, count_params, init_weights  # noqa: E402

LICENSES = "/usr/share/common-licenses"
PRETRAIN_TEXTS = ["Apache-2.0", "Artistic", "BSD", "GFDL-1.3", "LGPL-2.1", "MPL-2.0"]
FINETUNE_TEXT = "GPL-3"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# The SwiGLU MLP's elementwise intermediates (sigmoid(gate), gate * sigmoid(gate), its product with
# up: three [tokens, intermediate] tensors per layer) are recomputed in the backward rather than
# stashed: a few elementwise ops per layer for about 30% less peak memory (bench/bench_lora.py).
MEMORY_OPT_CONFIG = "Sigmoid+:1:-1,Mul+:1:-1"


def read_text(names):
    return b"\n".join(open(os.path.join(LICENSES, n), "rb").read() for n in names)


def train(ot, art, data, steps, batch, seq, lr, rng, desc, losses):
    from tqdm import tqdm
    from onnxtrain.api import CheckpointState, CosineLRScheduler, Module, Optimizer
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    opt = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    sched = CosineLRScheduler(opt, max(1, steps // 10), steps, lr)
    bar = tqdm(range(steps), desc=desc, unit="step", file=sys.stdout, dynamic_ncols=True,
               mininterval=0.5 if sys.stdout.isatty() else 10.0)
    t0 = time.perf_counter()
    for _ in bar:
        x, y = byte_windows(data, seq, rng, batch)
        loss = first(module(x, y))
        opt.step()
        module.lazy_reset_grad()
        sched.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{loss:.3f}")
    tok_s = steps * batch * seq / (time.perf_counter() - t0)
    return state, module, tok_s


def first(outputs):
    """The loss: a module returns one array, or a list whose first entry is the loss."""
    return float(np.asarray(outputs[0] if isinstance(outputs, list) else outputs).reshape(-1)[0])


def perplexity(module, data, seq):
    """exp(mean next-byte cross-entropy) over non-overlapping windows of the held-out text."""
    arr = np.frombuffer(data, np.uint8).astype(np.int64)
    n = (len(arr) - 1) // seq
    x = arr[:n * seq].reshape(n, seq)
    y = arr[1:n * seq + 1].reshape(n, seq)
    module.eval()
    losses = [first(module(x[i:i + 8], y[i:i + 8])) * len(x[i:i + 8]) for i in range(0, n, 8)]
    module.train()
    return math.exp(sum(losses) / n)


def generate(ot, model_path, prompt, n, seed=0, temperature=0.7):
    sess = ot.InferenceSession(model_path)
    rng = np.random.default_rng(seed)
    ids = list(prompt)
    for _ in range(n):
        logits = sess.run(None, {"input_ids": np.array([ids[-128:]], np.int64)})[0][0, :, -1]
        p = np.exp((logits - logits.max()) / temperature)
        ids.append(int(rng.choice(256, p=p / p.sum())))
    return bytes(ids).decode("utf-8", "replace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pretrain-steps", type=int, default=100)
    ap.add_argument("--lora-steps", type=int, default=60)
    ap.add_argument("--cli-steps", type=int, default=10, help="LoRA steps of the command-line run (0: skip it)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--memory-opt-config", default=MEMORY_OPT_CONFIG,
                    help="recompute plan of the LoRA artifacts ('' stashes every activation)")
    ap.add_argument("--small", action="store_true", help="a 2-layer, 128-wide model (for tests)")
    ap.add_argument("--out", default=os.path.join(REPO, "examples", "out", "lora"))
    ap.add_argument("--retrain", action="store_true", help="pre-train again even when saved weights exist")
    args = ap.parse_args()
    ot = import_onnxtrain()
    from onnxtrain import artifacts
    from onnxtrain.quantize import quantize

    cfg = Config(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352) if args.small else Config()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    pre_text, ft_text = read_text(PRETRAIN_TEXTS), read_text([FINETUNE_TEXT])
    split = int(len(ft_text) * 0.9)
    ft_train, ft_held = ft_text[:split], ft_text[split:]
    print(f"model: {count_params(cfg) / 1e6:.1f}M parameters ({cfg.layers} layers, hidden {cfg.hidden}, "
          f"{cfg.heads} query / {cfg.kv_heads} kv heads, SwiGLU {cfg.intermediate}), byte vocabulary")
    print(f"data: pre-training {len(pre_text)} bytes ({', '.join(PRETRAIN_TEXTS)}); fine-tuning {FINETUNE_TEXT}: "
          f"{len(ft_train)} bytes, {len(ft_held)} held out")

    pre_losses, lora_losses = [], []
    pretrained = os.path.join(args.out, "pretrained.onnx")
    if os.path.exists(pretrained) and not args.retrain and not args.small:
        print(f"pre-trained weights: {pretrained} (saved by an earlier run; --retrain to redo)")
    else:
        weights = init_weights(cfg, seed=0)
        base = build_model(cfg, weights)
        art = os.path.join(args.out, "pretrain_artifacts")
        artifacts.generate_artifacts(base, requires_grad=[n for n in weights],
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=3e-3),
                                     artifact_directory=art)
        state, module, tok_s = train(ot, art, pre_text, args.pretrain_steps, args.batch, args.seq, 3e-3, rng,
                                     "pre-train fp32", pre_losses)
        print(f"pre-training: {tok_s:.0f} tokens/s, final loss {np.mean(pre_losses[-10:]):.3f}")
        module.export_model_for_inferencing(pretrained, ["logits"])

    int4 = os.path.join(args.out, "model_int4.onnx")
    report = quantize(pretrained, int4, bits=4, block_size=32)
    print(report["table"].splitlines()[-1])
    worst = max(report["layers"], key=lambda l: l["relative_error"])
    print(f"  worst layer {worst['node']}: relative error {worst['relative_error']:.4f}")

    art = os.path.join(args.out, "lora_artifacts")
    artifacts.generate_artifacts(int4, loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=2e-3),
                                 artifact_directory=art, lora=artifacts.LoraConfig(rank=8, alpha=16, target=TARGETS),
                                 memory_opt_config=args.memory_opt_config)
    from onnxtrain.api import CheckpointState, Module
    state0 = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    m0 = Module(os.path.join(art, "training_model.onnx"), state0, os.path.join(art, "eval_model.onnx"))
    ppl_before = perplexity(m0, ft_held, args.seq)
    prompt = b"This License "
    sample_before = generate(ot, int4, prompt, 60)
    state, module, tok_s = train(ot, art, ft_train, args.lora_steps, args.batch, args.seq, 2e-3, rng,
                                 "LoRA on int4", lora_losses)
    ppl_after = perplexity(module, ft_held, args.seq)
    adapted = os.path.join(args.out, "model_int4_lora.onnx")
    module.export_model_for_inferencing(adapted, ["logits"], merge_lora=True)  # int4 base: kept as base + adapters
    peft = module.export_adapters(os.path.join(args.out, "adapters"))
    sample_after = generate(ot, adapted, prompt, 60)
    n_adapter = sum(p.data.size for _, p in state.parameters.items())
    print(f"LoRA: {n_adapter} adapter parameters ({100 * n_adapter / count_params(cfg):.2f}% of the model), "
          f"{tok_s:.0f} tokens/s")
    print(f"held-out perplexity ({FINETUNE_TEXT}, last 10%): before {ppl_before:.2f}, after {ppl_after:.2f}")
    print(f"sample before: {sample_before!r}")
    print(f"sample after:  {sample_after!r}")
    print(f"wrote {adapted} and {peft} (PEFT key names)")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, losses, title in ((axes[0], pre_losses, "fp32 pre-training"), (axes[1], lora_losses, "int4 + LoRA")):
        ax.plot(losses)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/byte)")
    fig.tight_layout()
    png = os.path.join(args.out, "loss.png")
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")

    if args.cli_steps:
        cli = os.path.join(REPO, "build", "onnxtrain")
        arr = np.frombuffer(ft_train, np.uint8)
        n = args.cli_steps * args.batch
        starts = rng.integers(0, len(arr) - args.seq - 1, n)
        npz = os.path.join(args.out, "gpl3_windows.npz")
        np.savez(npz, input_ids=np.stack([arr[s:s + args.seq] for s in starts]).astype(np.int64),
                 labels=np.stack([arr[s + 1:s + args.seq + 1] for s in starts]).astype(np.int64))
        cli_art = os.path.join(args.out, "cli_artifacts")
        for cmd in ([cli, "quantize", pretrained, "--bits", "4", "--block-size", "32", "--out", int4],
                    [cli, "artifacts", int4, "--out", cli_art, "--loss", "cross_entropy", "--lr", "2e-3",
                     "--lora-target", ",".join(TARGETS), "--lora-rank", "8", "--lora-alpha", "16"]
                    + (["--memory-opt-config", args.memory_opt_config] if args.memory_opt_config else []),
                    [cli, "train", cli_art, "--data", npz, "--inputs", "input_ids", "--labels", "labels",
                     "--epochs", "1", "--batch-size", str(args.batch)]):
            print("$ " + " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd))
            proc = subprocess.run(cmd, capture_output=True, text=True)
            print("\n".join(proc.stdout.strip().splitlines()[-3:]))
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
    if not ppl_after < ppl_before:
        print("FAIL: fine-tuning did not lower the held-out perplexity", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
