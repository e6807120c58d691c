"""The compute optimizer (ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER in TrainModule, `compute_optimizer=` /
`--no-compute-optimizer` for artifacts; on by default): a head on token 0 (Gather) or on the first
or last position (Slice) makes the last layer's FFN and LayerNorm run on those rows only, and
training follows the same losses and parameters as with it off."""
import copy
import ctypes
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.torch import TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

from .build_paths import LIBRARY, ONNXTRAIN  # noqa: E402
from .train_loops import train_artifacts, train_torch  # noqa: E402

onnxtrain.set_num_threads(1)

BATCH, SEQ, HIDDEN, FFN = 4, 10, 16, 32


def cfg():
    return models.BertConfig(vocab_size=40, hidden=HIDDEN, layers=2, heads=2, ffn=FFN, max_len=12)


class PositionHead(nn.Module):
    """The encoder with a Linear head on one position, taken as `pick` says."""

    PICKS = {"gather_first": lambda h: h[:, 0], "gather_last": lambda h: h[:, -1],
             "slice_first": lambda h: h[:, :1].squeeze(1), "slice_last": lambda h: h[:, -1:].sum(1)}

    def __init__(self, pick: str):
        super().__init__()
        self.encoder = models.BertEncoder(cfg())
        self.head = nn.Linear(HIDDEN, 3)
        self.pick = self.PICKS[pick]

    def forward(self, ids):
        return self.head(self.pick(self.encoder(ids)))


def shapes_of(m: onnx.ModelProto):
    """The shapes onnxtrain recorded in the model."""
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(m.graph.value_info) + list(m.graph.output)}


def ffn_rows(m: onnx.ModelProto):
    """Rows per sequence of every MatMul/FusedMatMul output whose width is the FFN's, in graph order."""
    shapes = shapes_of(m)
    return [int(np.prod(shapes[n.output[0]][:-1])) // BATCH for n in m.graph.node
            if n.op_type in ("MatMul", "FusedMatMul") and n.output[0] in shapes and shapes[n.output[0]][-1] == FFN]


def attention_rows(m: onnx.ModelProto):
    """Query rows of every attention Softmax ([B, heads, queries, keys]), in graph order."""
    shapes = shapes_of(m)
    return [shapes[n.output[0]][2] for n in m.graph.node if n.op_type == "Softmax" and n.output[0] in shapes]


class LastTokenDecoder(nn.Module):
    """The GPT-style decoder (causal mask) predicting from its last position only."""

    def __init__(self):
        super().__init__()
        self.decoder = models.GPTDecoder(cfg())

    def forward(self, ids):
        return self.decoder(ids)[:, -1]


def forward_graphs_on_and_off(monkeypatch, base, labels, seed):
    """Trains copies of `base` under TrainModule with the compute optimizer on and off, checks that
    they give the same losses and parameters, and returns the forward graphs {"1": on, "0": off}."""
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randint(0, 40, (BATCH, SEQ), generator=g), torch.randint(0, labels, (BATCH,), generator=g))
            for _ in range(20)]
    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER", flag)
        model = copy.deepcopy(base)
        wrapped = TrainModule(model)
        losses = train_torch(wrapped, data)
        runner = next(iter(wrapped._graphs.values())).runner
        runs[flag] = (losses, model.state_dict(), onnx.load_from_string(runner.forward_model()))
    np.testing.assert_allclose(runs["1"][0], runs["0"][0], rtol=1e-5)
    for k, v in runs["0"][1].items():
        torch.testing.assert_close(runs["1"][1][k], v, rtol=1e-5, atol=1e-6, msg=k)
    return {flag: run[2] for flag, run in runs.items()}


@pytest.mark.parametrize("pick", sorted(PositionHead.PICKS))
def test_train_module_heads_train_alike(monkeypatch, pick):
    torch.manual_seed(0)
    graphs = forward_graphs_on_and_off(monkeypatch, PositionHead(pick).train(), labels=3, seed=3)
    rows = {flag: (ffn_rows(m), attention_rows(m)) for flag, m in graphs.items()}
    # The last layer's FFN up-projection and attention (through the head merge, P V, softmax,
    # Q K^T and the head split) compute one row per sequence instead of SEQ.
    assert rows["0"] == ([SEQ, SEQ], [SEQ, SEQ]), rows["0"]
    assert rows["1"] == ([SEQ, 1], [SEQ, 1]), rows["1"]


def test_train_module_last_token_through_causal_attention(monkeypatch):
    """The selection moves through the causal mask (its rows are selected too) into the attention."""
    torch.manual_seed(0)
    graphs = forward_graphs_on_and_off(monkeypatch, LastTokenDecoder().train(), labels=40, seed=4)
    rows = {flag: attention_rows(m) for flag, m in graphs.items()}
    assert rows["0"] == [SEQ, SEQ] and rows["1"] == [SEQ, 1], rows


@pytest.mark.parametrize("pick", ["gather_first", "slice_last"])
def test_artifacts_heads_train_alike(tmp_path, pick):
    torch.manual_seed(0)
    model = PositionHead(pick).eval()
    ids = torch.randint(0, 40, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    path = models.export(model, (ids,), str(tmp_path / "head.onnx"), ["ids"], ["logits"])
    params = [p.name for p in onnx.load(path).graph.initializer if len(p.dims) > 0]
    g = np.random.default_rng(0)
    data = [(g.integers(0, 40, (BATCH, SEQ)).astype(np.int64), g.integers(0, 3, (BATCH,)).astype(np.int64))
            for _ in range(20)]
    runs = {}
    for on in (True, False):
        d = str(tmp_path / f"on{int(on)}")
        artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=d, compute_optimizer=on)
        losses, module = train_artifacts(d, data)
        module.train(False)
        eval_loss = module(*data[0])
        rows = ffn_rows(onnx.load(os.path.join(d, "training_model.onnx")))
        runs[on] = (losses, eval_loss, rows)
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-5, atol=1e-6)
    # The forward's FFN up-projections (the first two): the last layer's runs on one row.
    assert runs[False][2][:2] == [SEQ, SEQ] and runs[True][2][:2] == [SEQ, 1], (runs[False][2], runs[True][2])
    assert sum(runs[True][2]) < sum(runs[False][2])  # the backward shrinks too


def test_cli_turns_it_off(tmp_path):
    model = PositionHead("gather_first").eval()
    ids = torch.randint(0, 40, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    path = models.export(model, (ids,), str(tmp_path / "head.onnx"), ["ids"], ["logits"])
    rows = {}
    for flags in ([], ["--no-compute-optimizer"]):
        out = tmp_path / ("off" if flags else "on")
        subprocess.run([str(ONNXTRAIN), "artifacts", path, "--out", str(out), "--all", "--loss", "cross_entropy",
                        *flags], check=True, capture_output=True)
        rows[bool(flags)] = ffn_rows(onnx.load(str(out / "training_model.onnx")))[:2]
    assert rows[False] == [SEQ, 1] and rows[True] == [SEQ, SEQ], rows


def test_c_api_turns_it_off(tmp_path):
    """ot_artifact_options_set_compute_optimizer, called through the C ABI as a C program would."""
    model = PositionHead("gather_first").eval()
    ids = torch.randint(0, 40, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    path = models.export(model, (ids,), str(tmp_path / "head.onnx"), ["ids"], ["logits"])
    lib = ctypes.CDLL(str(LIBRARY))
    lib.ot_last_error.restype = ctypes.c_char_p
    floats = [p.name.encode() for p in onnx.load(path).graph.initializer if p.data_type == onnx.TensorProto.FLOAT]
    names = (ctypes.c_char_p * len(floats))(*floats)
    rows = {}
    for enabled in (1, 0):
        options = ctypes.c_void_p()
        out = tmp_path / str(enabled)
        assert lib.ot_artifact_options_create(ctypes.byref(options)) == 0, lib.ot_last_error()
        try:
            assert lib.ot_artifact_options_set_requires_grad(options, names, ctypes.c_size_t(len(names))) == 0
            assert lib.ot_artifact_options_set_loss(options, 4) == 0, lib.ot_last_error()  # OT_LOSS_CROSS_ENTROPY
            assert lib.ot_artifact_options_set_compute_optimizer(options, enabled) == 0, lib.ot_last_error()
            assert lib.ot_generate_artifacts(path.encode(), options, str(out).encode()) == 0, lib.ot_last_error()
        finally:
            lib.ot_artifact_options_release(options)
        rows[enabled] = ffn_rows(onnx.load(str(out / "training_model.onnx")))[:2]
    assert rows[1] == [SEQ, 1] and rows[0] == [SEQ, SEQ], rows
