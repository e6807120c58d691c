"""A model trained by onnxtrain and exported for inferencing runs in ONNX Runtime and gives
onnxtrain's outputs: the export is plain ONNX (no onnxtrain-domain ops, training-mode BatchNorm
and Dropout switched to inference) that another engine accepts.

ONNX Runtime is npm's onnxruntime-node, run through bench/ort_runner.js; the session fixture
installs it with bench/setup_peers.sh (idempotent, fast once installed). Without node/npm this
test fails rather than skips: the check must run wherever `make test` runs.
"""
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, BENCH)
import models  # noqa: E402  (the shared reference models)


@pytest.fixture(scope="session")
def ort_runner():
    """The command that runs a model in ONNX Runtime, after making sure the peer is installed."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed to check exports against ONNX Runtime "
                    "(scripts/install_deps.sh installs them)")
    proc = subprocess.run(["bash", os.path.join(BENCH, "setup_peers.sh")], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"bench/setup_peers.sh failed (exit {proc.returncode}); ONNX Runtime is needed for this test:\n"
                    f"{proc.stdout}{proc.stderr}")
    return ["node", os.path.join(BENCH, "ort_runner.js")]


def run_ort(runner, model_path, feeds, workdir):
    """Runs the model once in ONNX Runtime (1 thread); returns its outputs in graph order."""
    cmd = runner + ["--model", model_path, "--threads", "1", "--warmup", "1", "--runs", "1",
                    "--save-outputs", os.path.join(workdir, "ort_outputs")]
    for name, value in feeds.items():
        file = os.path.join(workdir, f"{name}.npy")
        np.save(file, value)
        cmd += ["--input", f"{name}={file}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH, timeout=300)
    assert proc.returncode == 0, f"ONNX Runtime failed on {model_path}:\n{proc.stderr}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return [np.load(o["file"]) for o in report["outputs"]]


def digits_cnn():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    make = lambda: (torch.rand(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))  # noqa: E731
    return models.DigitsCNN(), "input", make


def small_bert():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    cfg = models.BertConfig(vocab_size=100, hidden=32, layers=2, heads=2, ffn=64, max_len=16)
    make = lambda: (torch.randint(0, 100, (4, 16), generator=g), torch.randint(0, 3, (4,), generator=g))  # noqa: E731
    return models.BertClassifier(cfg, num_classes=3), "ids", make


@pytest.mark.parametrize("build", [digits_cnn, small_bert], ids=["digits_cnn", "bert"])
def test_trained_export_matches_onnx_runtime(tmp_path, ort_runner, build):
    model, input_name, make_batch = build()
    x, _ = make_batch()
    f = io.BytesIO()
    torch.onnx.export(model, (x,), f, input_names=[input_name], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}})
    params = [n for n, _ in model.named_parameters()]
    paths = artifacts.generate_artifacts(f.getvalue(), requires_grad=params,
                                         loss=artifacts.LossType.CrossEntropyLoss,
                                         optimizer=artifacts.AdamW(lr=1e-2), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    initial = module.get_contiguous_parameters()
    for _ in range(3):
        module(*(t.numpy() for t in make_batch()))
        optimizer.step()
        module.lazy_reset_grad()
    assert not np.allclose(module.get_contiguous_parameters(), initial)  # training moved the weights

    exported = str(tmp_path / "inference.onnx")
    module.export_model_for_inferencing(exported, ["logits"])
    x = make_batch()[0].numpy()
    session = onnxtrain.InferenceSession(exported)
    recorded, planned = (session.run(None, {input_name: x})[0] for _ in range(2))  # first run records the plan
    (theirs,) = run_ort(ort_runner, exported, {input_name: x}, str(tmp_path))
    assert theirs.shape == recorded.shape
    np.testing.assert_allclose(recorded, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(planned, theirs, rtol=1e-4, atol=1e-5)
