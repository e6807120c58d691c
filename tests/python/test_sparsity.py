"""Label and padding sparsity in TrainModule (src/passes/sparsity.h): with 70% of labels ignored,
or 50% of tokens padding, 20 SGD steps give the losses and parameters of the dense computation;
dense-enough batches leave the graphs as they were; bad settings are errors that say so."""
import copy
import os
import sys

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain import _C, artifacts
from onnxtrain.torch import TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

onnxtrain.set_num_threads(1)

CFG = models.BertConfig(vocab_size=48, hidden=16, layers=2, heads=2, ffn=32, max_len=12, pad_id=0)
STEPS = 20


class MaskedLM(nn.Module):
    """The encoder with a vocabulary head on every token (a masked-LM loss's shape)."""

    def __init__(self, cfg):
        super().__init__()
        self.encoder = models.BertEncoder(cfg)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size)

    def forward(self, ids):
        return self.head(self.encoder(ids))


def batches(ignored=0.0, padding=0.0, seed=3, batch=4, seq=12, classes=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        ids = models.padded_ids(CFG, batch, seq, padding, g) if padding else torch.randint(1, CFG.vocab_size, (batch, seq), generator=g)
        if classes:
            out.append((ids, torch.randint(0, classes, (batch,), generator=g)))
            continue
        labels = models.ignore_labels(torch.randint(0, CFG.vocab_size, (batch, seq), generator=g), ignored, g)
        labels[ids == CFG.pad_id] = -100  # padded positions have no label
        out.append((ids, labels))
    return out


class WithLossAndLogits(models.WithCrossEntropy):
    """The loss and the logits both returned: logits something besides the loss reads, which the
    fused output layer (LinearSoftmaxCrossEntropy) cannot take, so the label row pass skips the
    ignored rows instead."""

    def forward(self, x, target):
        logits = self.model(x)
        return self.loss(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)), logits


def train(base, data, monkeypatch, wrapper=models.WithCrossEntropy, eager=False, **env):
    """20 SGD steps through TrainModule with the given settings (eager: in PyTorch itself):
    (losses, state, build stats, forward ops)."""
    for name in ("ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION", "ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION"):
        monkeypatch.setenv(name, env.get(name, "0"))
    model = copy.deepcopy(base)
    wrapped = wrapper(model) if eager else TrainModule(wrapper(model))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for x, y in data:
        loss = wrapped(x, y)
        loss = loss[0] if isinstance(loss, tuple) else loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if eager:
        return losses, model.state_dict(), None, None
    forward = onnx.load_from_string(next(iter(wrapped._graphs.values())).runner.forward_model())
    return losses, model.state_dict(), wrapped.build_stats[0], [n.op_type for n in forward.graph.node]


def assert_same_training(sparse, dense, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(sparse[0], dense[0], rtol=rtol)
    for k, v in dense[1].items():
        torch.testing.assert_close(sparse[1][k], v, rtol=rtol, atol=atol, msg=k)


def assert_same_as_eager(trained, eager):
    """float32 against PyTorch's own kernels: the order of sums differs, so 1e-4."""
    assert_same_training(trained, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gpt", "encoder"])
def test_label_sparsity_trains_as_eager(kind, monkeypatch):
    """70% of labels ignored. The row pass gathers the kept rows above the head (and, in the
    decoder, above the last block's row-wise ops); a head whose logits only the loss reads then
    becomes the fused output layer on those rows. A head whose logits are returned too keeps its
    loss, on the kept rows. Either way, 20 steps give PyTorch's losses and parameters."""
    torch.manual_seed(0)
    base = models.GPTDecoder(CFG) if kind == "gpt" else MaskedLM(CFG)
    data = batches(ignored=0.7)
    on = {"ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION": "1"}
    eager = train(base, data, monkeypatch, eager=True)

    fused = train(base, data, monkeypatch, **on)
    assert fused[2]["label_sparsity"] and "NonZero" in fused[3]
    assert "LinearSoftmaxCrossEntropy" in fused[3] and "SoftmaxCrossEntropyLoss" not in fused[3], fused[3]
    assert_same_as_eager(fused, eager)

    sparse = train(base, data, monkeypatch, wrapper=WithLossAndLogits, **on)
    dense = train(base, data, monkeypatch, wrapper=WithLossAndLogits)
    assert sparse[2]["label_sparsity"] and not dense[2]["label_sparsity"]
    # The kept rows: NonZero of the labels' mask, and the loss's operands gathered by it.
    assert "LinearSoftmaxCrossEntropy" not in sparse[3] and "NonZero" in sparse[3] and "NonZero" not in dense[3]
    assert_same_as_eager(sparse, eager)
    assert_same_as_eager(dense, eager)


def test_padding_sparsity_trains_as_dense_encoder(monkeypatch):
    """BertClassifier (padded keys masked, head on token 0) with half its tokens padding."""
    torch.manual_seed(0)
    base = models.BertClassifier(CFG, num_classes=3)
    data = batches(padding=0.5, classes=3)
    sparse = train(base, data, monkeypatch, ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION="1")
    dense = train(base, data, monkeypatch)
    assert sparse[2]["padding_sparsity"] == {"module.model.encoder.tokens.weight": 0}
    assert dense[2]["padding_sparsity"] == {}
    assert "GatherGrad" in sparse[3] and "GatherGrad" not in dense[3]  # the forward restores padded shapes
    assert_same_training(sparse, dense)


def test_padding_and_label_sparsity_train_as_dense_gpt(monkeypatch):
    """The causal decoder, half its tokens padding at the ends of rows (their labels ignored), its
    logits returned too (so the row pass, not the fused output layer, takes the loss)."""
    torch.manual_seed(0)
    base = models.GPTDecoder(CFG)
    data = batches(padding=0.5)
    both = {"ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION": "1", "ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION": "1"}
    sparse = train(base, data, monkeypatch, wrapper=WithLossAndLogits, **both)
    dense = train(base, data, monkeypatch, wrapper=WithLossAndLogits)
    assert sparse[2]["label_sparsity"] and sparse[2]["padding_sparsity"] == {"module.model.tokens.weight": 0}
    assert_same_training(sparse, dense)
    assert_same_as_eager(sparse, train(base, data, monkeypatch, wrapper=WithLossAndLogits, eager=True))


def test_dense_batches_leave_graphs_untouched(monkeypatch):
    torch.manual_seed(0)
    base = models.GPTDecoder(CFG)
    data = batches()[:2]  # every label kept, no padding: above the 90% threshold
    on = {"ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION": "1", "ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION": "1"}
    stats, ops = train(base, data, monkeypatch, **on)[2:]
    assert not stats["label_sparsity"] and stats["padding_sparsity"] == {}
    assert ops == train(base, data, monkeypatch)[3]


def test_print_input_density(monkeypatch, capsys):
    monkeypatch.setenv("ONNXTRAIN_PRINT_INPUT_DENSITY", "1")
    torch.manual_seed(0)
    ids = torch.full((2, 10), 5)
    ids[:, 6:] = 0  # 60% tokens kept
    labels = torch.full((2, 10), 7)
    labels[:, 3:] = -100  # 30% labels kept
    TrainModule(models.WithCrossEntropy(models.GPTDecoder(CFG)))(ids, labels)
    out = capsys.readouterr().out
    assert "step 0: label density (input 1, ignore_index -100) 30.0%" in out
    assert "padding density (input 0, 'model.tokens.weight' padding_idx 0) 60.0%" in out


@pytest.mark.parametrize("name,value", [("ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION", "2"),
                                        ("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "yes"),
                                        ("ORTMODULE_PRINT_INPUT_DENSITY", "3")])
def test_bad_settings_are_errors(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        TrainModule(nn.Linear(2, 2))


def test_ortmodule_aliases(monkeypatch):
    monkeypatch.setenv("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "0")
    monkeypatch.setenv("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "1")
    s = TrainModule(nn.Linear(2, 2))._settings
    assert not s.label_sparsity and s.embedding_sparsity
    monkeypatch.setenv("ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION", "1")  # the ONNXTRAIN_ name wins
    assert TrainModule(nn.Linear(2, 2))._settings.label_sparsity


def test_padding_index_for_a_table_the_model_lacks_is_an_error(tmp_path):
    model = models.GPTDecoder(CFG).eval()
    path = models.export(model, (torch.randint(1, CFG.vocab_size, (2, 6)),), str(tmp_path / "gpt.onnx"), ["ids"], ["logits"])
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(onnxtrain.Error, match="'no.such.table', which is not the table of any embedding lookup"):
        _C.torch_bridge.Runner(data, "gpt", [], [], padding_index={"no.such.table": 0})


# ---- on-device artifacts: generate_artifacts(label_sparsity=True), --label-sparsity, C setter ----

class ClassesSecond(nn.Module):
    """The decoder's logits [B, S, V] as [B, V, S]: the layout the artifacts' CrossEntropy takes."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(ids).transpose(1, 2)


class TokenRows(nn.Module):
    """The decoder's logits as token rows [B*S, V] (labels [B*S])."""

    def __init__(self, inner, vocab):
        super().__init__()
        self.inner, self.vocab = inner, vocab

    def forward(self, ids):
        return self.inner(ids).reshape(-1, self.vocab)


def export_decoder(tmp_path, layout):
    """A small GPT decoder exported with symbolic batch and sequence; (path, trainable names)."""
    torch.manual_seed(0)
    inner = models.GPTDecoder(CFG)
    model = (ClassesSecond(inner) if layout == "classes_second" else TokenRows(inner, CFG.vocab_size)).eval()
    path = str(tmp_path / f"{layout}.onnx")
    logits_axes = {0: "batch", 2: "seq"} if layout == "classes_second" else {0: "tokens"}
    legacy = {"dynamo": False} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
    with torch.no_grad():
        torch.onnx.export(model, (torch.randint(1, CFG.vocab_size, (2, 8)),), path, input_names=["ids"],
                          output_names=["logits"], opset_version=17,
                          dynamic_axes={"ids": {0: "batch", 1: "seq"}, "logits": logits_axes}, **legacy)
    params = [p.name for p in onnx.load(path).graph.initializer if p.data_type == onnx.TensorProto.FLOAT and len(p.dims) > 0]
    return path, params


def artifact_batches(layout):
    """(ids, labels) at two shapes through the same artifacts, with 0%, 70% and all-but-one
    labels ignored."""
    g = torch.Generator().manual_seed(5)
    out = []
    for batch, seq in ((3, 12), (2, 7)):
        for ignored in (0.0, 0.7, "all_but_one"):
            ids = torch.randint(1, CFG.vocab_size, (batch, seq), generator=g)
            labels = torch.randint(0, CFG.vocab_size, (batch, seq), generator=g)
            if ignored == "all_but_one":
                keep = labels[1, 2].item()
                labels[:] = -100
                labels[1, 2] = keep
            else:
                labels = models.ignore_labels(labels, ignored, g)
            if layout == "token_rows":
                labels = labels.reshape(-1)
            out.append((ids.numpy(), labels.numpy()))
    return out


def loss_and_gradients(directory, data):
    from onnxtrain.api import CheckpointState, Module
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    module = Module(os.path.join(directory, "training_model.onnx"), state, os.path.join(directory, "eval_model.onnx"))
    out = []
    for x, y in data:
        module.lazy_reset_grad()
        loss = float(module(x, y))
        out.append((loss, {name: p.grad.copy() for name, p in state.parameters.items() if p.requires_grad}))
    return out


def training_ops(directory):
    return [n.op_type for n in onnx.load(os.path.join(directory, "training_model.onnx")).graph.node]


def head_rows_gathered(directory):
    """True when the vocabulary MatMul of the training graph (or the output layer fused with its loss)
    reads rows a Gather selected by NonZero."""
    graph = onnx.load(os.path.join(directory, "training_model.onnx")).graph
    producer = {o: n for n in graph.node for o in n.output}
    for n in graph.node:
        if n.op_type not in ("MatMul", "FusedMatMul", "LinearSoftmaxCrossEntropy") or not n.input[0]:
            continue
        seen, todo = set(), [n.input[0]]
        while todo:  # up through the row-wise ops (LayerNorm) to the Gather of the kept rows
            v = todo.pop()
            p = producer.get(v)
            if p is None or v in seen:
                continue
            seen.add(v)
            if p.op_type == "Gather":
                return True
            if p.op_type in ("LayerNormalization", "Flatten", "Reshape", "Cast"):
                todo.append(p.input[0])
    return False


def forward_products_on_kept_rows(directory):
    """The forward's matrix products (the output layer fused with its loss included) whose rows
    come from the kept-label Gathers: values computed from those Gathers' outputs, followed down
    the forward graph (not into the gradient nodes)."""
    graph = onnx.load(os.path.join(directory, "training_model.onnx")).graph
    kept = set()
    for n in graph.node:  # topological order
        if "/grad" in n.name:
            continue
        if (n.op_type == "Gather" and "kept_labels" in n.name) or any(i in kept for i in n.input):
            kept.update(o for o in n.output if o)
    return [n.name for n in graph.node if "/grad" not in n.name and n.input and n.input[0] in kept
            and n.op_type in ("MatMul", "FusedMatMul", "Gemm", "LinearSoftmaxCrossEntropy")]


@pytest.mark.parametrize("layout", ["classes_second", "token_rows"])
def test_artifacts_label_sparsity_gives_dense_loss_and_gradients(tmp_path, layout):
    path, params = export_decoder(tmp_path, layout)
    runs = {}
    for on in (True, False):
        d = str(tmp_path / f"sparse{int(on)}")
        artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=d, label_sparsity=on)
        ops = training_ops(d)
        assert ("NonZero" in ops) == on and head_rows_gathered(d) == on, (on, ops)
        if on:  # the gather reaches into the last block: its output projection and MLP run on the kept rows
            products = forward_products_on_kept_rows(d)
            assert len(products) == 4 and sum("blocks.1/mlp" in p for p in products) == 2, products
            assert sum("blocks.1/attn/out" in p for p in products) == 1, products
        # the head and its loss are one op in either layout (the logits never exist whole)
        assert "LinearSoftmaxCrossEntropy" in ops and "SoftmaxCrossEntropyLoss" not in ops, ops
        runs[on] = loss_and_gradients(d, artifact_batches(layout))
    torch.manual_seed(0)  # export_decoder's weights, in torch: the dense run is torch's loss and gradients
    inner = models.GPTDecoder(CFG)
    for i, ((x, y), (dense_loss, dense_grads)) in enumerate(zip(artifact_batches(layout), runs[False])):
        inner.zero_grad()
        logits = inner(torch.from_numpy(x))
        want = nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size), torch.from_numpy(y).reshape(-1))
        want.backward()
        np.testing.assert_allclose(dense_loss, want.item(), rtol=1e-5, err_msg=f"batch {i}")
        # the export folded the head's weight into its transpose [H, V], an initializer of its own
        head_t = inner.head.weight.grad.numpy().T
        head = [name for name, g in dense_grads.items() if g.shape == head_t.shape]
        assert len(head) == 1, {name: g.shape for name, g in dense_grads.items()}
        np.testing.assert_allclose(dense_grads[head[0]], head_t, rtol=1e-4, atol=1e-6,
                                   err_msg=f"batch {i}: the head's gradient")
    for i, ((loss, grads), (dense_loss, dense_grads)) in enumerate(zip(runs[True], runs[False])):
        np.testing.assert_allclose(loss, dense_loss, rtol=1e-5, err_msg=f"batch {i}")
        assert grads.keys() == dense_grads.keys()
        for name, g in dense_grads.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-4, atol=1e-6, err_msg=f"batch {i}: {name}")


def test_artifacts_label_sparsity_cli(tmp_path):
    from .build_paths import ONNXTRAIN
    import subprocess
    path, _ = export_decoder(tmp_path, "classes_second")
    for flags in ([], ["--label-sparsity"]):
        out = tmp_path / ("on" if flags else "off")
        subprocess.run([str(ONNXTRAIN), "artifacts", path, "--out", str(out), "--all", "--loss", "cross_entropy",
                        *flags], check=True, capture_output=True)
        assert ("NonZero" in training_ops(str(out))) == bool(flags)
        assert head_rows_gathered(str(out)) == bool(flags)


def test_artifacts_label_sparsity_c_api(tmp_path):
    """ot_artifact_options_set_label_sparsity, called through the C ABI as a C program would."""
    import ctypes
    from .build_paths import LIBRARY
    path, params = export_decoder(tmp_path, "classes_second")
    lib = ctypes.CDLL(str(LIBRARY))
    lib.ot_last_error.restype = ctypes.c_char_p
    names = (ctypes.c_char_p * len(params))(*[p.encode() for p in params])
    for enabled in (1, 0):
        options = ctypes.c_void_p()
        out = tmp_path / str(enabled)
        assert lib.ot_artifact_options_create(ctypes.byref(options)) == 0, lib.ot_last_error()
        try:
            assert lib.ot_artifact_options_set_requires_grad(options, names, ctypes.c_size_t(len(names))) == 0
            assert lib.ot_artifact_options_set_loss(options, 4) == 0, lib.ot_last_error()  # OT_LOSS_CROSS_ENTROPY
            assert lib.ot_artifact_options_set_label_sparsity(options, enabled) == 0, lib.ot_last_error()
            assert lib.ot_generate_artifacts(path.encode(), options, str(out).encode()) == 0, lib.ot_last_error()
        finally:
            lib.ot_artifact_options_release(options)
        assert head_rows_gathered(str(out)) == bool(enabled)
