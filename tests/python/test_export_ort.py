"""A model trained by onnxtrain and exported for inferencing runs in ONNX Runtime and gives
onnxtrain's outputs: the export is plain ONNX (no onnxtrain-domain ops, training-mode BatchNorm
and Dropout switched to inference) that another engine accepts.

ONNX Runtime is the `ort` peer (onnxruntime 1.31 from PyPI in its own venv, bench/peers.py); the
`ort_peer` fixture installs it through scripts/setup_peers.sh (idempotent, offline once done). A
peer that cannot be installed fails the test rather than skips it: the check must run wherever
`make test` runs.
"""
import io

import numpy as np
import pytest
import torch

import models  # bench/models.py: the shared reference models
import onnxtrain
import peers
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer


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
def test_trained_export_matches_onnx_runtime(tmp_path, ort_peer, build):
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
    (theirs,) = peers.ort_run(exported, {input_name: x}, str(tmp_path))
    assert theirs.shape == recorded.shape
    np.testing.assert_allclose(recorded, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(planned, theirs, rtol=1e-4, atol=1e-5)
