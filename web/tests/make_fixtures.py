#!/usr/bin/env python3
"""The digits demo's training artifacts and data for the WebAssembly module's tests and demo page.

    PYTHONPATH=build/python /usr/bin/python3 web/tests/make_fixtures.py OUT_DIR [--bert] [--ort]

Writes OUT_DIR/digits_artifacts/ (training, eval and optimizer models, checkpoint: the same export and
generate_artifacts call as examples/demo.py, AdamW at lr 3e-3, logits as an extra output) and
OUT_DIR/digits_raw/ (x_train.f32, y_train.i64, x_test.f32, y_test.i64: little-endian arrays). Runs
on the full build's Python package; skips what is already there and newer than this script.
--ort also writes OUT_DIR/ort_digits_artifacts/ (ONNX Runtime training 1.19.2's own artifacts of a
digits CNN, made in the ort-training peer, with its batches and losses: see ort_digits below).
--bert also writes OUT_DIR/bert_artifacts/ for the benchmark (bench/bench_web.mjs): bench_training's
BERT-style classifier (hidden 256, 4 layers, vocab 8192, batch 8 x 128 tokens), whose ops.txt is
the BERT-style op set.
"""
import os
import sys


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import demo  # noqa: E402  (examples/demo.py: the split and the export)


def fresh(stamp: str) -> bool:
    return os.path.exists(stamp) and os.path.getmtime(stamp) >= os.path.getmtime(os.path.abspath(__file__))


def bert(out: str) -> None:
    stamp = os.path.join(out, "bert.done")
    if fresh(stamp):
        return
    from onnxtrain import artifacts

    import bench_training
    _, model, x, _ = bench_training.build("bert")
    data = bench_training.export_training(model, (x,), ["x"], ["logits"])
    artifacts.generate_artifacts(data, requires_grad=bench_training.parameter_names(model),
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=1e-3),
                                 artifact_directory=os.path.join(out, "bert_artifacts"))
    with open(stamp, "w") as f:
        f.write(f"BERT-style classifier, input x {list(x.shape)}\n")
    print(f"make_fixtures: BERT-style artifacts -> {out}/bert_artifacts")


def main(out: str) -> None:
    artifacts_dir = os.path.join(out, "digits_artifacts")
    stamp = os.path.join(out, "fixtures.done")
    if fresh(stamp):
        return
    from onnxtrain import api, artifacts

    os.makedirs(os.path.join(out, "digits_raw"), exist_ok=True)
    (x_train, y_train), (x_test, y_test) = demo.load_digits_split(seed=0)
    for name, array in (("x_train.f32", x_train), ("y_train.i64", y_train), ("x_test.f32", x_test),
                        ("y_test.i64", y_test)):
        array.astype("<f4" if name.endswith(".f32") else "<i8").tofile(os.path.join(out, "digits_raw", name))
    model_path = os.path.join(out, "digits_cnn.onnx")
    params = demo.export_model(model_path, batch=64, seed=0)
    artifacts.generate_artifacts(model_path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.AdamW(lr=3e-3), artifact_directory=artifacts_dir,
                                 additional_output_names=["logits"])
    # The checkpoint's random seed (the dropout masks of its train steps) is drawn afresh by each
    # generate_artifacts call; fixed here so every checkout trains the same curve. The curves of two
    # builds part after a few dozen steps for some seeds (see web/tests/digits.test.mjs).
    checkpoint = os.path.join(artifacts_dir, "checkpoint")
    state = api.CheckpointState.load_checkpoint(checkpoint)
    state.properties["onnxtrain.random_seed"] = 0
    api.CheckpointState.save_checkpoint(state, checkpoint)
    with open(stamp, "w") as f:
        f.write(f"{len(x_train)} training and {len(x_test)} held-out digits; {len(params)} parameters\n")
    print(f"make_fixtures: digits artifacts and data -> {out}")


def ort_digits(out: str, steps: int = 5) -> None:
    """OUT_DIR/ort_digits_artifacts/: ONNX Runtime training 1.19.2's own artifacts of bench/ort_zoo.py's
    digits CNN (its generate_artifacts in the ort-training peer, AdamW), with the batches
    (ort_digits_raw/x<k>.f32, y<k>.i64) and the losses ORT's Module gave on them (ort_losses.json):
    what an ONNX Runtime Web training app brings to the module."""
    import json
    import numpy as np
    import ort_zoo
    import peers
    art = os.path.join(out, "ort_digits_artifacts")
    stamp = os.path.join(out, "ort_digits.done")
    if fresh(stamp):
        return
    raw = os.path.join(out, "ort_digits_raw")
    os.makedirs(raw, exist_ok=True)
    path, params = ort_zoo.export("digits_cnn", out, size="test")
    batches = ort_zoo.batches("digits_cnn", steps, size="test")
    data = os.path.join(out, "ort_digits_batches.npz")
    np.savez(data, **{f"x{k}": x for k, (x, _) in enumerate(batches)}, **{f"y{k}": y for k, (_, y) in enumerate(batches)})
    for k, (x, y) in enumerate(batches):
        x.astype("<f4").tofile(os.path.join(raw, f"x{k}.f32"))
        y.astype("<i8").tofile(os.path.join(raw, f"y{k}.i64"))
    peers.ensure("ort-training")
    proc = peers.run("ort-training", ["-c", ort_zoo.ORT_SCRIPT, path, json.dumps(params), data, art, "adamw", str(steps)],
                     timeout_s=900)
    if proc.returncode != 0:
        raise RuntimeError(f"ORT's generate_artifacts failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    with open(os.path.join(art, "ort_losses.json"), "w") as f:
        json.dump({"losses": report["losses"], "batch_shape": list(batches[0][0].shape)}, f)
    with open(stamp, "w") as f:
        f.write(f"ONNX Runtime 1.19.2's digits artifacts, {steps} batches and its losses\n")
    print(f"make_fixtures: ONNX Runtime's digits artifacts -> {art}")


if __name__ == "__main__":
    main(sys.argv[1])
    if "--ort" in sys.argv[2:]:
        ort_digits(sys.argv[1])
    if "--bert" in sys.argv[2:]:
        bert(sys.argv[1])
