"""onnxtrain.torch.TrainModule: an unchanged torch training loop, run by onnxtrain, follows PyTorch.

The reference is always the same module run by PyTorch from a deep copy: same initial weights,
batches and torch optimizer.
"""
import collections
import copy
import os
import re
import sys
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import onnxtrain
from onnxtrain.torch import DebugOptions, LogLevel, TrainModule, TrainModuleError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402  (the shared reference models)

onnxtrain.set_num_threads(1)  # the parity loops are small: threads only add scheduling noise under load


def cross_entropy(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def small_cfg():
    return models.BertConfig(vocab_size=40, hidden=16, layers=2, heads=2, ffn=32, max_len=12)


def model_and_batches(name, steps, seed=0):
    """The model (train mode) and `steps` (input, target) batches."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        model = models.MLP((12, 16, 16, 5))
        batch = lambda: (torch.randn(6, 12, generator=g), torch.randint(0, 5, (6,), generator=g))  # noqa: E731
    elif name == "cnn":
        model = models.SmallCNN(in_channels=3, widths=(4, 8), num_classes=5)
        batch = lambda: (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g))  # noqa: E731
    elif name == "conv_relu":  # Conv straight into ReLU: the inference-only FusedConv must not appear before autodiff
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
        batch = lambda: (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g))  # noqa: E731
    elif name == "bert":
        model = nn.Sequential(models.BertEncoder(small_cfg()), nn.Linear(16, 3))
        batch = lambda: (torch.randint(0, 40, (2, 8), generator=g), torch.randint(0, 3, (2, 8), generator=g))  # noqa: E731
    elif name == "gpt":
        model = models.GPTDecoder(small_cfg())
        batch = lambda: (torch.randint(0, 40, (2, 8), generator=g), torch.randint(0, 40, (2, 8), generator=g))  # noqa: E731
    elif name == "lstm":
        model = models.LSTMClassifier(features=6, hidden=8, num_classes=3)
        batch = lambda: (torch.randn(5, 2, 6, generator=g), torch.randint(0, 3, (2,), generator=g))  # noqa: E731
    else:
        raise KeyError(name)
    return model.train(), [batch() for _ in range(steps)]


def train(model, batches, make_optimizer):
    optimizer = make_optimizer(model.parameters())
    losses = []
    for x, y in batches:
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def assert_close_state(ours, theirs, tol):
    assert ours.keys() == theirs.keys()
    for key, want in theirs.items():
        got = ours[key]
        if not torch.is_floating_point(want):
            assert torch.equal(got, want), key
            continue
        err = (got - want).norm() / max(want.norm(), 1e-6)
        assert err <= tol, f"'{key}': relative difference {err:.2e}"


SGD = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)  # noqa: E731


@pytest.mark.parametrize("name", ["mlp", "cnn", "conv_relu", "bert", "gpt", "lstm"])
def test_fifty_steps_follow_pytorch(name):
    model, batches = model_and_batches(name, 50)
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    ours = train(wrapped, batches, SGD)
    theirs = train(reference, batches, SGD)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= 1e-4 * abs(b), f"{name} step {step}: loss {a} vs {b}"
    # Parameters and buffers (BatchNorm running statistics and batch counts) alike.
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-4)
    assert len(wrapped.build_stats) == 1, "one input schema, one graph"


def test_adamw_and_fused_adam_follow_torch_adamw():
    from onnxtrain.torch import FusedAdam
    model, batches = model_and_batches("mlp", 20)
    reference, fused = copy.deepcopy(model), copy.deepcopy(model)
    theirs = train(reference, batches, lambda p: torch.optim.AdamW(p, lr=1e-2))
    for module, make in [(model, lambda p: torch.optim.AdamW(p, lr=1e-2)), (fused, lambda p: FusedAdam(p, lr=1e-2))]:
        ours = train(TrainModule(module), batches, make)
        assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-4
        assert_close_state(module.state_dict(), reference.state_dict(), 1e-4)


def test_state_dict_moves_between_wrapped_and_plain():
    model, _ = model_and_batches("cnn", 0)
    wrapped = TrainModule(model)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in model.named_parameters()]
    plain, _ = model_and_batches("cnn", 0, seed=1)
    plain.load_state_dict(wrapped.state_dict())
    assert_close_state(plain.state_dict(), model.state_dict(), 0)
    other, _ = model_and_batches("cnn", 0, seed=2)
    wrapped.load_state_dict(other.state_dict())  # into the same Parameters, which the graphs read
    wrapped.eval(), other.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), other(x), rtol=1e-5, atol=1e-6)
    twin = copy.deepcopy(wrapped)  # graphs are not copied; parameters stay shared with its module
    assert list(twin.parameters())[0] is next(twin.original_module.parameters())
    with torch.no_grad():
        torch.testing.assert_close(twin(x), other(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamic", [True, False])
def test_new_batch_size_and_sequence_length(monkeypatch, dynamic):
    """Symbolic batch and sequence dims (the default): one set of graphs for every size, after one
    export per dim that checks the export does not depend on it. Without them (ONNXTRAIN_DYNAMIC_SHAPES=0)
    each shape exports and builds its own."""
    monkeypatch.setenv("ONNXTRAIN_DYNAMIC_SHAPES", "1" if dynamic else "0")
    model, batches = model_and_batches("gpt", 4)
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    batches += [(torch.randint(0, 40, (3, 8), generator=g), torch.randint(0, 40, (3, 8), generator=g)),
                (torch.randint(0, 40, (3, 5), generator=g), torch.randint(0, 40, (3, 5), generator=g)),
                (torch.randint(0, 40, (4, 11), generator=g), torch.randint(0, 40, (4, 11), generator=g))]
    batches += batches[:2] + batches[-3:]  # shapes seen before
    wrapped = TrainModule(model)
    ours, theirs = train(wrapped, batches, SGD), train(reference, batches, SGD)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-4
    assert (wrapped.export_count, len(wrapped.build_stats)) == ((3, 1) if dynamic else (4, 4))
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-4)


@torch.jit.script
def _refine(h: torch.Tensor) -> torch.Tensor:
    scale = h.abs().mean(0)  # made outside the branches, read in them
    if bool(h.sum() > 0):
        return torch.tanh(h * scale) + h
    return h - scale


class WithIf(nn.Module):
    """A scripted branch inside a traced module: the export holds an ONNX If whose branches read
    values of the outer graph (on the input's path, which takes no gradient)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return (self.fc(x) * _refine(x)).pow(2).mean()


def test_a_model_with_an_if_exports_once_for_every_batch_size():
    """The branches' reads of outer values are numbered by the exporter's counter, which moves
    between exports: they are matched by position, so the check export at a second batch size
    finds the same program and later sizes reuse the graphs."""
    torch.manual_seed(0)
    model = WithIf()
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    g = torch.Generator().manual_seed(1)
    for batch in (2, 3, 5, 2, 7):
        x = torch.randn(batch, 4, generator=g)
        ours, theirs = wrapped(x), reference(x)
        torch.testing.assert_close(ours, theirs)
        ours.backward()
        theirs.backward()
    torch.testing.assert_close(model.fc.weight.grad, reference.fc.weight.grad)
    assert (wrapped.export_count, len(wrapped.build_stats)) == (2, 1)


def test_batchnorm_statistics_follow_torch_at_every_batch_size():
    """One graph for batch sizes 4, 6 and 3: BatchNorm's unbiased running variance takes its count
    of values per channel from the input's shape at run time."""
    model, _ = model_and_batches("cnn", 0)
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)) for n in (4, 6, 3, 4)]
    wrapped = TrainModule(model)
    ours, theirs = train(wrapped, batches, SGD), train(reference, batches, SGD)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-4
    assert (wrapped.export_count, len(wrapped.build_stats)) == (2, 1)
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-4)


class BakedLength(nn.Module):
    """A trace that bakes the sequence length in: int() of a size is a constant in the export."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.pos = nn.Parameter(torch.randn(16, 6))
        self.out = nn.Linear(6, 3)

    def forward(self, ids):
        length = int(ids.shape[1])
        return self.out(self.embed(ids) + self.pos[:length]).mean(1)


def test_an_export_that_bakes_a_size_in_exports_per_shape_and_says_why(caplog):
    torch.manual_seed(0)
    model = BakedLength()
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model, debug_options=DebugOptions(log_level=LogLevel.INFO))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 20, (4, n), generator=g), torch.randint(0, 3, (4,), generator=g)) for n in (5, 7, 9, 5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TracerWarning about int() of a size
        ours, theirs = train(wrapped, batches, SGD), train(reference, batches, SGD)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-5
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-5)
    assert wrapped.export_count == 3 and len(wrapped.build_stats) == 3, "one export per length"
    said = [r.getMessage() for r in caplog.records if "different programs" in r.getMessage()]
    assert len(said) == 1 and "BakedLength" in said[0] and "each input shape of this schema exports on its own" in said[0]


class Nested(nn.Module):
    """Dict and tuple inputs, a non-tensor flag, nested outputs with an integer and a constant."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

    def forward(self, batch, pair, scale=1.0, use_b=True):
        x = batch["x"]
        h = self.a(x) * scale + (self.b(pair[0]) if use_b else 0) + pair[1]
        return {"h": h, "more": (h.argmax(-1), [h.sum()]), "tag": "out"}


def test_nested_inputs_and_outputs_and_input_gradients():
    torch.manual_seed(0)
    model = Nested()
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    for use_b, scale in [(True, 2.0), (False, 2.0), (True, 0.5), (True, 2.0)]:
        x, p0, p1 = torch.randn(5, 4, requires_grad=True), torch.randn(5, 4), torch.randn(5, 3, requires_grad=True)
        xr, p1r = x.detach().clone().requires_grad_(), p1.detach().clone().requires_grad_()
        ours = wrapped({"x": x}, (p0, p1), scale=scale, use_b=use_b)
        theirs = reference({"x": xr}, (p0, p1r), scale=scale, use_b=use_b)
        assert ours["tag"] == "out" and isinstance(ours["more"][1], list)
        assert not ours["more"][0].requires_grad and torch.equal(ours["more"][0], theirs["more"][0])
        torch.testing.assert_close(ours["h"], theirs["h"])
        (ours["h"].pow(2).sum() + 3 * ours["more"][1][0]).backward()
        (theirs["h"].pow(2).sum() + 3 * theirs["more"][1][0]).backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(p1.grad, p1r.grad)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    assert len(wrapped.build_stats) == 3  # (use_b, scale) are constants of the schema


class Tagged(dict):
    """A dict subclass whose constructor takes something else than the items."""

    def __init__(self, tag):
        super().__init__()
        self.tag = tag


class DictSubclassOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, inputs):
        h = self.fc(inputs["x"])
        counts = collections.defaultdict(list)
        counts["h"].append(h)
        tagged = Tagged("out")
        tagged["relu"] = h.relu()
        return collections.OrderedDict(counts=counts, tagged=tagged)


def test_dict_subclass_inputs_and_outputs_keep_their_types_and_contents():
    """A defaultdict (constructor: its factory first) and a subclass with another constructor come
    back as themselves, factory and attributes included (they were rebuilt by cls(items))."""
    torch.manual_seed(0)
    model = DictSubclassOutputs()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3)
    inputs = collections.defaultdict(lambda: None, x=x)
    ours, theirs = TrainModule(model)(inputs), reference(inputs)
    assert type(ours) is collections.OrderedDict and list(ours) == ["counts", "tagged"]
    assert type(ours["counts"]) is collections.defaultdict and ours["counts"].default_factory is list
    assert type(ours["tagged"]) is Tagged and ours["tagged"].tag == "out" and list(ours["tagged"]) == ["relu"]
    torch.testing.assert_close(ours["counts"]["h"][0], theirs["counts"]["h"][0])
    torch.testing.assert_close(ours["tagged"]["relu"], theirs["tagged"]["relu"])
    ours["tagged"]["relu"].sum().backward()
    theirs["tagged"]["relu"].sum().backward()
    torch.testing.assert_close(model.fc.weight.grad, reference.fc.weight.grad)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        return h, h, x  # one value twice, an input passed through


def test_repeated_and_passed_through_outputs():
    torch.manual_seed(0)
    model = Twice()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    for m, inp in [(TrainModule(model), x), (reference, xr)]:
        a, b, c = m(inp)
        (2 * a.sum() + b.pow(2).sum() + 3 * c.sum()).backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(model.fc.weight.grad, reference.fc.weight.grad)


def test_eval_no_grad_accumulation_and_retain_graph():
    model, batches = model_and_batches("cnn", 2)
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    (x1, y1), (x2, y2) = batches
    # Two forwards in flight, one backward; then the same graph backward twice.
    for m in (wrapped, reference):
        loss = cross_entropy(m(x1), y1) + cross_entropy(m(x2), y2)
        loss.backward(retain_graph=True)
        loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)
    with torch.no_grad():  # train mode without gradients: forward graph only, statistics still move
        out = wrapped(x1)
        torch.testing.assert_close(out, reference(x1), rtol=1e-4, atol=1e-5)
    assert out.grad_fn is None
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-5)
    wrapped.eval(), reference.eval()
    assert not model.training and not model.features[0].bn.training
    torch.testing.assert_close(wrapped(x1), reference(x1), rtol=1e-4, atol=1e-5)
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-5)  # eval leaves statistics alone
    assert [s["backward"] for s in wrapped.build_stats] == [True, False, True]


def test_submodules_keep_their_own_modes():
    # A frozen BatchNorm (eval) inside a training model: running statistics are read, not updated.
    model, batches = model_and_batches("cnn", 3)
    model.features[1].bn.eval()
    reference = copy.deepcopy(model)
    ours, theirs = train(TrainModule(model), batches, SGD), train(reference, batches, SGD)
    assert model.training and not model.features[1].bn.training and model.features[0].bn.training
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-4
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-4)


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x)) + 1.0)  # every element > 0 before dropout


@pytest.mark.parametrize("memory_level", ["0", "1"])
def test_memory_levels_use_the_forward_dropout_mask(monkeypatch, memory_level):
    monkeypatch.setenv("ONNXTRAIN_MEMORY_LEVEL", memory_level)
    torch.manual_seed(0)
    model = DropoutNet().train()
    x = torch.randn(16, 8, requires_grad=True)
    out = TrainModule(model)(x)
    out.sum().backward()
    kept = out != 0
    assert 0 < kept.sum() < kept.numel()
    # d(sum)/d(pre-dropout) is 2 where kept, 0 where dropped: the backward used the forward's mask.
    w = model.fc.weight.detach()
    pre_grad = 2.0 * kept * (model.fc(x.detach()) > 0)
    torch.testing.assert_close(x.grad, pre_grad.float() @ w)


def test_torch_manual_seed_reproduces_dropout_masks():
    def outputs(seed):
        torch.manual_seed(0)
        model = TrainModule(DropoutNet().train())
        x = torch.randn(16, 8)
        torch.manual_seed(seed)
        return [model(x) for _ in range(3)]

    first, again, other = outputs(1), outputs(1), outputs(2)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1]), "each call draws a new mask"
    assert not torch.equal(first[0], other[0]), "another torch seed, other masks"


def test_recompute_follows_pytorch(monkeypatch):
    monkeypatch.setenv("ONNXTRAIN_MEMORY_LEVEL", "1")
    model, batches = model_and_batches("cnn", 5)
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    ours, theirs = train(wrapped, batches, SGD), train(reference, batches, SGD)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) < 1e-4
    assert_close_state(model.state_dict(), reference.state_dict(), 1e-4)


class WithCummax(nn.Module):  # aten::cummax has no ONNX export in torch 1.13 nor in 2.15
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, y):
        return ((torch.cummax(self.fc(x), 0)[0] - y) ** 2).mean()


class WithCustomOp(nn.Module):  # exports (through custom_erfinv below) an op onnxtrain does not know
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(3) * 0.5)

    def forward(self, x, y):
        return torch.erfinv(self.w).sum() * (x.sum() - y.sum())


@pytest.fixture
def custom_erfinv():
    """aten::erfinv exported as a custom-domain op, as a project with its own ops would."""
    torch.onnx.register_custom_op_symbolic("aten::erfinv", lambda g, x: g.op("mydomain::ErfInv", x), 1)
    yield
    torch.onnx.unregister_custom_op_symbolic("aten::erfinv", 1)


class WithDet(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.eye(3) + 0.1 * torch.randn(3, 3))

    def forward(self, x, y):
        return torch.linalg.det(self.w) * (x.sum() - y.sum())


def test_determinant_trains_as_in_torch():
    """Det's gradient (the cofactor matrix) under TrainModule against torch.autograd."""
    torch.manual_seed(0)
    plain = WithDet()
    inner = copy.deepcopy(plain)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    for m in (plain, TrainModule(inner)):
        m(x, y).backward()
    assert inner.w.grad is not None
    torch.testing.assert_close(inner.w.grad, plain.w.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("module,named", [(WithCummax, "aten::cummax"), (WithCustomOp, "[ErfInv] node")])
def test_failures_raise_by_default_and_warn_once_with_fallback(monkeypatch, custom_erfinv, module, named):
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    with pytest.raises(TrainModuleError, match=named.replace("[", r"\[")):
        TrainModule(module())(x, y)
    monkeypatch.setenv("ONNXTRAIN_FALLBACK", "warn")
    torch.manual_seed(0)
    plain = module()
    wrapped = TrainModule(copy.deepcopy(plain))
    with pytest.warns(RuntimeWarning, match="runs in PyTorch") as caught:
        out = wrapped(x, y)
    assert len(caught) == 1 and named in str(caught[0].message)
    assert named in wrapped.fallback_reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later calls are quiet
        out.backward()
        torch.testing.assert_close(wrapped(x, y), plain(x, y))


def test_a_changed_structure_exports_again():
    """A layer replaced after wrapping (other width, other activation) or added: the next call
    exports again and computes what the changed module computes, forward and backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    wrapped = TrainModule(model)
    x = torch.randn(5, 3)
    wrapped(x).sum().backward()
    changes = [lambda: model.__setitem__(1, nn.Tanh()),           # same parameters, other op
               lambda: model.__setitem__(2, nn.Linear(4, 3)),     # other shapes
               lambda: model.append(nn.Linear(3, 1))]             # a new parameterised layer
    for change in changes:
        change()
        model.zero_grad()
        out = wrapped(x)
        out.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(x)
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        for got, want in zip(grads, (p.grad for p in model.parameters())):
            torch.testing.assert_close(got, want)
    assert len(wrapped.build_stats) == 1  # the old structures' graphs are gone


def test_debug_options_and_environment(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("ONNXTRAIN_SAVE_ONNX_PATH", str(tmp_path))
    model, batches = model_and_batches("mlp", 1)
    wrapped = TrainModule(model, DebugOptions(log_level=LogLevel.INFO, save_onnx=True, onnx_prefix="mlp"))
    with caplog.at_level("INFO", logger="onnxtrain.torch"):
        cross_entropy(wrapped(batches[0][0]), batches[0][1]).backward()
    assert "schema 0: export" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["mlp_0_backward.onnx", "mlp_0_exported.onnx", "mlp_0_forward.onnx"]
    sess = onnxtrain.InferenceSession(str(tmp_path / "mlp_0_forward.onnx"))  # valid models
    assert sess.get_outputs()
    monkeypatch.setenv("ONNXTRAIN_SAVE_ONNX", "1")
    assert DebugOptions().save_onnx and DebugOptions(save_onnx=False).save_onnx is False
    for var, bad in [("ONNXTRAIN_FALLBACK", "maybe"), ("ONNXTRAIN_MEMORY_LEVEL", "3"), ("ONNXTRAIN_OPSET", "x"),
                     ("ONNXTRAIN_LOG_LEVEL", "LOUD")]:
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValueError, match=var):
            TrainModule(nn.Linear(2, 2))
        monkeypatch.delenv(var)


def test_inputs_on_another_device_or_wrong_module_are_clear_errors():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TrainModule(lambda x: x)
    wrapped = TrainModule(nn.Linear(2, 2))
    meta = torch.empty(3, 2, device="meta")
    with pytest.raises(TrainModuleError, match="on the CPU"):
        wrapped(meta)


def _ddp_worker(rank, world, init_file, result_file, steps):
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, batches = model_and_batches("mlp", steps)
        ddp = nn.parallel.DistributedDataParallel(TrainModule(model))
        half = [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in batches]
        train(ddp, half, SGD)
        if rank == 0:
            torch.save(model.state_dict(), result_file)
    finally:
        dist.destroy_process_group()


def test_ddp_two_gloo_processes_match_one_process_on_the_whole_batch():
    steps = 5
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rank0.pt")
        mp.spawn(_ddp_worker, args=(2, os.path.join(tmp, "init"), result, steps), nprocs=2, join=True)
        ddp_state = torch.load(result)
    model, batches = model_and_batches("mlp", steps)
    train(model, batches, SGD)  # PyTorch, one process, whole batches
    assert_close_state(ddp_state, model.state_dict(), 1e-5)


def _block(report: str, what: str):
    """(in the block, of all, bytes) from a memory report's "<what>: K of N in one block of B bytes"."""
    m = re.search(what + r": (\d+) of (\d+) in one block of (\d+) bytes", report)
    assert m, f"no '{what}' block in: {report}"
    return tuple(int(g) for g in m.groups())


def test_saved_values_and_gradients_of_a_step_share_one_block():
    # Allocated one by one, a step's saved values and gradients fragmented the heap step after
    # step (bench/bench_memory.py); they die together, so each step gets one block for each.
    model, batches = model_and_batches("gpt", 3)
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    ours, theirs = train(wrapped, batches, SGD), train(reference, batches, SGD)
    assert ours == pytest.approx(theirs, rel=1e-4)
    report = wrapped.build_stats[0]["memory"]
    blocked, saved, nbytes = _block(report, "saved values")
    # Some saved values are views (of parameters, of reshaped inputs): they never land in the
    # block, and the step after the one that showed it leaves them out.
    assert 0 < blocked < saved and nbytes > 0
    blocked, grads, nbytes = _block(report, "gradients")
    assert blocked == grads == len(list(model.parameters())) and nbytes >= 4 * sum(p.numel() for p in model.parameters())


def _reuses(report: str, what: str):
    """(blocks in the memory of the block before, blocks) from a memory report's "<what>: ..."."""
    m = re.search(what + r": [^;]*, (\d+) of (\d+) in the memory of the block before", report)
    assert m, f"no '{what}' reuse count in: {report}"
    return int(m.group(1)), int(m.group(2))


def test_the_kept_export_holds_no_copy_of_the_parameters_and_buffers():
    # They are bound from torch at every run: a copy in the export TrainModule keeps (to compare
    # later exports, to rebuild) would double the model's memory. BatchNorm's running statistics,
    # inputs of the stripped export, are still updated in place.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Linear(1024, 10)).train()
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(wrapped(x), y).backward()
    nn.functional.cross_entropy(reference(x), y).backward()
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    (graph,) = wrapped._graphs.values()
    assert len(graph.export.data) < state_bytes / 50, (len(graph.export.data), state_bytes)
    for name, want in reference.state_dict().items():
        assert torch.allclose(model.state_dict()[name].float(), want.float(), rtol=1e-5, atol=1e-6), name
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def steps_with_blocks(model, batches, loss_of):
    """Seven steps of one TrainModule of `model` (loss_of(wrapped, x, y) each), two graphs alive at
    once in the middle, each step bit for bit that of a step without blocks (a fresh TrainModule's
    first step); returns the TrainModule's memory report."""
    def step_alone(x, y):  # the first step of a fresh TrainModule: no blocks, no spare taken
        wrapped = TrainModule(copy.deepcopy(model))
        loss = loss_of(wrapped, x, y)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in wrapped.parameters()]

    want = [step_alone(x, y) for x, y in batches]
    wrapped = TrainModule(model)

    def check(loss, k):
        loss.backward()
        assert torch.equal(loss.detach(), want[k][0]), f"batch {k}: loss"
        for (name, p), g in zip(wrapped.named_parameters(), want[k][1]):
            assert torch.equal(p.grad, g), f"batch {k}: the gradient of {name} differs"
        wrapped.zero_grad(set_to_none=True)

    def forward(k):
        return loss_of(wrapped, *batches[k])

    for k in range(3):  # the block's shapes are learnt, then a step takes the block before's memory
        check(forward(k), k)
    first, later = forward(3), forward(4)  # two graphs alive: their blocks are both in use
    check(later, 4)  # its block dies: its memory is the spare now, while the first's block lives
    third = forward(5)  # takes that spare; must not touch the first graph's saved values
    check(first, 3)
    check(third, 5)
    check(forward(6), 6)
    return wrapped.build_stats[0]["memory"]


def test_a_saved_values_block_reuses_the_memory_of_the_dead_one_before_it_and_never_of_a_live_one():
    # The next forward takes the memory of the last saved-values block to die (fresh pages cost
    # more than the step's work on them here): results must be bit for bit those of a step
    # without blocks, and a block that is still alive (a graph not yet backpropagated) must never
    # be handed out.
    model, batches = model_and_batches("gpt", 7)
    report = steps_with_blocks(model, batches, lambda m, x, y: cross_entropy(m(x), y))
    reused, blocks = _reuses(report, "saved values")
    assert blocks == 6 and reused >= 3, report


# A child process per case: its page faults and its peak are its own, and the spare blocks are
# process-wide. It trains `case` for 8 steps (SGD, zero_grad(set_to_none=True), the loss outside
# the module) and prints the minor page faults of the last 5 steps and the memory report:
# - small_outputs: a classifier (8.3 MiB of gradients in one block, 10 logits a row);
# - large_outputs: 8 MiB of outputs, a quarter of its 2 MiB of gradients' block and more;
# - caller_allocates: small_outputs, its loss taking 64 MiB past the process's peak so far and
#   16 MiB more each step (a new peak every step), given back before the backward;
# - unused_output: the loss inside the module, returned beside 40 MiB of outputs it does not use;
# - heap_temporaries: no training; after a TrainModule is made, eight times two 8 MiB tensors alive
#   together then freed (torch AdamW's temporaries of a 2M-value weight: sqrt, then a quotient).
_STEP_FAULTS_CHILD = r"""
import json, resource, sys, torch
from torch import nn
from onnxtrain.torch import TrainModule
case = sys.argv[1]
torch.manual_seed(0)


class LossBesideLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 5120)

    def forward(self, x):
        logits = self.head(x)
        return logits.square().mean(), logits


if case == "heap_temporaries":
    TrainModule(nn.Linear(2, 2))
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = torch.ones(2 << 20)
        b = a.sqrt() / 2
        del a, b
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": faults[3:]}))
    sys.exit(0)
if case == "large_outputs":
    model, x, y = nn.Linear(64, 8192), torch.randn(256, 64), torch.randint(0, 8192, (256,))
elif case == "unused_output":
    model, x, y = LossBesideLogits(), torch.randn(2048, 64), None
else:
    model = nn.Sequential(nn.Linear(256, 8192), nn.ReLU(), nn.Linear(8192, 10))
    x, y = torch.randn(16, 256), torch.randint(0, 10, (16,))
wrapped = TrainModule(model)
optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-3)
faults = []
for step in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = wrapped(x)[0] if y is None else nn.functional.cross_entropy(wrapped(x), y)
    if case == "caller_allocates":  # past the process's peak so far (the first step's build may
        # have set it high), by 64 MiB and 16 MiB more each step; freed before the backward
        resident_kib = int(open("/proc/self/statm").read().split()[1]) * (resource.getpagesize() // 1024)
        headroom_mib = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - resident_kib) >> 10
        loss = loss + torch.ones((headroom_mib + 64 + 16 * step) << 18).sum() * 0
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": faults[3:], "memory": wrapped.build_stats[0]["memory"]}))
"""


def _step_faults(case):
    import json
    import subprocess
    proc = subprocess.run([sys.executable, "-c", _STEP_FAULTS_CHILD, case], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_steady_step_maps_no_fresh_memory_for_its_gradients():
    # The gradients' block, mapped afresh at every step, cost this VM 0-38 ms of page faults a
    # step (the kernel zero-fills, compacts, and the host backs again pages reported free): its
    # memory is held from one backward to the next when the caller's part of the step (the loss
    # over a few logits) cannot peak above the backward.
    result = _step_faults("small_outputs")
    reused, blocks = _reuses(result["memory"], "gradients")
    assert blocks == 7 and reused >= 5, result["memory"]
    # A fresh 8.3 MiB block: 5 huge pages (30 faults here) or 2,100 small ones, every step.
    assert sum(result["faults"]) <= 20, result["faults"]


def test_the_gradients_block_is_not_held_through_a_loss_over_large_outputs():
    # A loss over outputs of an eighth of the block and more (a GPT-style LM head's logits) takes
    # memory in proportion to them between the forward and the backward, where the step then
    # peaks: the block held there would raise the peak by its size.
    result = _step_faults("large_outputs")
    reused, blocks = _reuses(result["memory"], "gradients")
    assert blocks == 7 and reused == 0, result["memory"]


def test_the_gradients_block_is_no_longer_held_once_holding_it_raised_the_peak():
    # A loss that takes more than its outputs tell, past the process's peak at every step (given
    # back before the backward): the first step that held the block peaked higher, and from then
    # on the block is given back. (A fixed amount did not always pass the peak the first step's
    # build had set.)
    result = _step_faults("caller_allocates")
    reused, blocks = _reuses(result["memory"], "gradients")
    assert blocks == 7 and reused <= 2, result["memory"]


def test_an_output_the_loss_does_not_use_costs_its_backward_no_fresh_pages():
    # torch would seed its backward with a fresh zero tensor of its size every step (a Hugging Face
    # GPT-2's 51 MiB of logits beside its loss: 12,600 faults); the stand-in reads the zero page.
    result = _step_faults("unused_output")
    # Per step: the 40 MiB output mapped afresh (20 huge pages) and the seed's reads; torch's own
    # zeros were 10,240 faults a step.
    assert sum(result["faults"]) <= 1000, result["faults"]


def test_the_gradients_of_a_module_whose_second_output_is_unused_are_torchs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh())

    class LossAndLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            logits = self.body(x)
            return logits.square().mean(), logits

    reference, ours = LossAndLogits(), TrainModule(copy.deepcopy(LossAndLogits()))
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(4, 8)
    for module in (reference, ours):
        loss, logits = module(x)
        loss.backward()
    for (name, p), q in zip(reference.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)
    # And with both outputs in the loss: torch's gradient for the second one is taken as given.
    for module in (reference, ours):
        module.zero_grad()
        loss, logits = module(x)
        (loss + logits.sum()).backward()
    for (name, p), q in zip(reference.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_torchs_temporaries_below_32_mib_stay_on_the_heap_once_a_train_module_is_made():
    # glibc's own thresholds moved with what was freed: two 8 MiB temporaries freed together
    # reached the trim threshold they had set, and every pair was faulted in afresh (4,096 faults).
    result = _step_faults("heap_temporaries")
    # One growth of the heap may come at any of the measured iterations (2,048 faults once, seen in
    # the torch2 lane at the second); before, every iteration faulted.
    assert sum(f > 100 for f in result["faults"]) <= 1, result["faults"]
