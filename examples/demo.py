#!/usr/bin/env python3
"""onnxtrain demo: train a small CNN on sklearn's 8x8 digits with onnxtrain's on-device training API.

    make demo            # or: PYTHONPATH=build/python /usr/bin/python3 examples/demo.py

1. Loads the digits (they ship inside sklearn: no download), splits them 80/20 (stratified) and
   writes them to examples/out/digits.npz (x_train, y_train, x_test, y_test: float32 NCHW images in
   [0, 1], int64 labels), for the C++ example to train from, and as raw arrays to
   examples/out/digits_raw/ for the C example.
2. Exports the PyTorch model (bench/models.py DigitsCNN: Conv, BatchNorm, MaxPool, Dropout, Linear)
   to ONNX in training mode, opset 17, with a dynamic batch dimension.
3. Generates the training artifacts with ``onnxtrain.artifacts.generate_artifacts`` (cross-entropy
   loss, AdamW) into examples/out/digits_artifacts/.
4. Trains with ``onnxtrain.api`` (CheckpointState, Module, Optimizer, a cosine LR schedule with
   warmup), evaluating on the held-out split after every epoch.
5. Saves the trained checkpoint (with optimizer state), draws the loss curve
   (examples/out/digits_loss.png), exports the inference model (examples/out/digits_inference.onnx)
   and checks that ``onnxtrain.InferenceSession`` gives the logits ``module.eval()`` gave.

Exits 1 when the held-out accuracy is below 97% and 2 when the exported model disagrees with the
eval graph.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
from common import import_onnxtrain  # noqa: E402

OUT_DIR = os.path.join(REPO_ROOT, "examples", "out")
MIN_ACCURACY = 0.97
# The exported model runs the eval graph's own kernels: anything beyond rounding is a bug.
LOGITS_ATOL = 1e-5


def load_digits_split(seed: int):
    """sklearn's digits as float32 (N, 1, 8, 8) images in [0, 1] and int64 labels, split 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return (np.ascontiguousarray(x_train), y_train), (np.ascontiguousarray(x_test), y_test)


def export_model(path: str, batch: int, seed: int) -> list:
    """Exports DigitsCNN in training mode; returns the names of its parameters (to train)."""
    import torch

    import models
    torch.manual_seed(seed)
    model = models.DigitsCNN()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.export(model, (torch.zeros(batch, 1, 8, 8),), path, ["input"], ["logits"],
                      dynamic_batch=True, training=True)
    return [name for name, _ in model.named_parameters()]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def plot_curves(path: str, losses: list, steps_per_epoch: int, test_acc: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=0.8, label="training loss (step)")
    window = max(1, steps_per_epoch // 2)
    if len(losses) >= window:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color="tab:blue", label=f"training loss ({window}-step mean)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    acc_ax = ax.twinx()
    epochs_end = [steps_per_epoch * (i + 1) for i in range(len(test_acc))]
    acc_ax.plot(epochs_end, [100 * a for a in test_acc], "o-", color="tab:orange", label="held-out accuracy")
    acc_ax.set_ylabel("held-out accuracy (%)")
    acc_ax.set_ylim(min(80.0, 100 * min(test_acc)), 100.5)
    lines = ax.get_legend_handles_labels()
    acc_lines = acc_ax.get_legend_handles_labels()
    ax.legend(lines[0] + acc_lines[0], lines[1] + acc_lines[1], loc="center right")
    ax.set_title("onnxtrain: DigitsCNN on sklearn digits (AdamW, cosine LR)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="0: onnxtrain's default (all cores)")
    parser.add_argument("--out", default=OUT_DIR)
    parser.add_argument("--mixed-precision", default=None, choices=["bf16", "fp16"],
                        help="GEMMs and convolutions in bf16 (or fp16, with a dynamic loss scaler), the rest "
                             "and the checkpoint in fp32 (default: fp32)")
    args = parser.parse_args(argv)

    from tqdm import tqdm

    onnxtrain = import_onnxtrain()
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, CosineLRScheduler, Module, Optimizer
    if args.threads:
        onnxtrain.set_num_threads(args.threads)
    timings = {}
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731

    # 1. Data.
    t0 = time.perf_counter()
    (x_train, y_train), (x_test, y_test) = load_digits_split(args.seed)
    np.savez(out("digits.npz"), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    print(f"digits: {len(x_train)} training and {len(x_test)} held-out images of 1x8x8 -> {out('digits.npz')}")
    # The same splits as raw little-endian arrays for the C example (examples/c/train_digits.c).
    os.makedirs(out("digits_raw"), exist_ok=True)
    for name, array in (("x_train.f32", x_train), ("y_train.i64", y_train), ("x_test.f32", x_test),
                        ("y_test.i64", y_test)):
        array.astype("<f4" if name.endswith(".f32") else "<i8").tofile(out(os.path.join("digits_raw", name)))

    # 2-3. Export and training artifacts.
    model_path = out("digits_cnn.onnx")
    params = export_model(model_path, args.batch, args.seed)
    timings["data + export"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    artifact_dir = out("digits_artifacts")
    training_model, eval_model, optimizer_model, checkpoint = artifacts.generate_artifacts(
        model_path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.AdamW(lr=args.lr), artifact_directory=artifact_dir,
        additional_output_names=["logits"], mixed_precision=args.mixed_precision)
    timings["generate_artifacts"] = time.perf_counter() - t0
    print(f"artifacts for {len(params)} trainable parameters -> {artifact_dir}/")

    # 4. Train.
    t0 = time.perf_counter()
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(training_model, state, eval_model)
    optimizer = Optimizer(optimizer_model, module)
    steps_per_epoch = math.ceil(len(x_train) / args.batch)
    total_steps = args.epochs * steps_per_epoch
    scheduler = CosineLRScheduler(optimizer, warmup_step_count=steps_per_epoch, total_step_count=total_steps,
                                  initial_lr=args.lr)
    print(f"{module.get_parameters_size():,} trainable values; inputs {module.input_names()}, "
          f"outputs {module.output_names()}")

    rng = np.random.default_rng(args.seed)
    losses, test_acc = [], []
    bar = tqdm(total=total_steps, unit="step", mininterval=0.5, dynamic_ncols=True)
    for epoch in range(args.epochs):
        module.train()
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), args.batch):
            idx = order[start:start + args.batch]
            loss, _ = module(x_train[idx], y_train[idx])
            optimizer.step()
            scheduler.step()
            module.lazy_reset_grad()
            losses.append(float(loss))
            bar.update(1)
        module.eval()
        _, logits = module(x_test, y_test)
        test_acc.append(accuracy(logits, y_test))
        bar.set_postfix(epoch=epoch + 1, loss=f"{np.mean(losses[-steps_per_epoch:]):.4f}",
                        lr=f"{optimizer.get_learning_rate():.1e}", test_acc=f"{100 * test_acc[-1]:.1f}%")
    bar.close()
    timings["training"] = time.perf_counter() - t0

    # Final evaluation with the eval graph (inference-mode BatchNorm and Dropout).
    module.eval()
    test_loss, eval_logits = module(x_test, y_test)
    test_accuracy = accuracy(eval_logits, y_test)
    train_accuracy = accuracy(module(x_train, y_train)[1], y_train)

    # 5. Checkpoint, loss curve, inference model.
    t0 = time.perf_counter()
    trained_checkpoint = out("digits_trained.ckpt")
    state.properties["epochs"] = args.epochs
    state.properties["test_accuracy"] = test_accuracy
    CheckpointState.save_checkpoint(state, trained_checkpoint, include_optimizer_state=True)
    plot_curves(out("digits_loss.png"), losses, steps_per_epoch, test_acc)
    inference_path = out("digits_inference.onnx")
    module.export_model_for_inferencing(inference_path, ["logits"])
    session = onnxtrain.InferenceSession(inference_path)
    (session_logits,) = session.run(None, {"input": x_test})
    logits_err = float(np.max(np.abs(session_logits - eval_logits)))
    timings["save + plot + export + check"] = time.perf_counter() - t0

    print(f"\nheld-out accuracy {100 * test_accuracy:.2f}% ({int(round(test_accuracy * len(y_test)))}/{len(y_test)}), "
          f"loss {float(test_loss):.4f}; training accuracy {100 * train_accuracy:.2f}%")
    print(f"{args.epochs} epochs x {steps_per_epoch} steps of batch {args.batch}: "
          f"{1e3 * timings['training'] / total_steps:.2f} ms per step including evaluation")
    print(f"trained checkpoint -> {trained_checkpoint} ({os.path.getsize(trained_checkpoint) / 1e3:.0f} kB)")
    print(f"loss curve -> {out('digits_loss.png')}")
    print(f"inference model -> {inference_path}: inputs {[i.name for i in session.get_inputs()]}, "
          f"max |logits - eval logits| {logits_err:.1e}")
    print("timings: " + ", ".join(f"{k} {v:.2f} s" if v >= 0.1 else f"{k} {1e3 * v:.0f} ms"
                                  for k, v in timings.items()))

    if not logits_err <= LOGITS_ATOL:
        print(f"FAIL: the exported model's logits differ from module.eval()'s by {logits_err:.2e} "
              f"(> {LOGITS_ATOL:g})")
        return 2
    if test_accuracy < MIN_ACCURACY:
        print(f"FAIL: held-out accuracy {100 * test_accuracy:.2f}% is below {100 * MIN_ACCURACY:.0f}%")
        return 1
    print(f"OK: held-out accuracy >= {100 * MIN_ACCURACY:.0f}% and the exported model matches the eval graph")
    return 0


if __name__ == "__main__":
    sys.exit(main())
