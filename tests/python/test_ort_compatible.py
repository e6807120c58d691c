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


OPTIMIZERS = {"adamw": artifacts.AdamW, "sgd": artifacts.SGD}  # torch's AdamW (wd 0.01): adam_mode 0
RATES = {"adamw": 2e-3, "sgd": 5e-2}  # set at run time in both engines (ORT's Optimizer starts at 0.001)


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
@pytest.mark.parametrize("name", ["mlp", "digits_cnn", "bert", "gpt", "resnet"])
def test_ort_trains_onnxtrains_ort_compatible_artifacts_as_onnxtrain_does(tmp_path, ort_training_peer, name, optim):
    art = _generate(tmp_path, name, OPTIMIZERS[optim]())
    batches = ort_zoo.batches(name, STEPS)
    report, theirs = _ort_train(tmp_path, art, batches, RATES[optim])
    state, losses, eval_loss = _our_train(art, batches, RATES[optim])
    assert report["lr"] == pytest.approx(1e-3)
    np.testing.assert_allclose(losses, report["losses"], rtol=1e-5)
    _assert_params(state, theirs, [n for n in theirs if state.parameters[n].requires_grad])
    np.testing.assert_allclose(eval_loss, report["eval_loss"], rtol=1e-5)
    # onnxtrain's own artifacts of the model train the same: ORT's form changed no number.
    native_state, native_losses, _ = _our_train(_generate(tmp_path, name, OPTIMIZERS[optim](), False), batches,
                                                   RATES[optim])
    np.testing.assert_allclose(losses, native_losses, rtol=1e-5)
    _assert_params(state, {n: np.asarray(native_state.parameters[n].data) for n in theirs}, theirs)
