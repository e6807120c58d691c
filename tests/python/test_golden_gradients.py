"""Golden tests: gradients of whole models exported from PyTorch in training mode match
torch.autograd (relative error of each parameter's gradient below 1e-4).

Each model is wrapped with its loss, exported once with torch.onnx.export (training mode, no
constant folding, so parameters stay initializers named as in the state_dict), differentiated by
onnxtrain.autodiff and run by onnxtrain.InferenceSession.
"""
import io
import os
import sys

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain.autodiff import build_gradient_graph

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402  (the shared reference models)


class WithLoss(nn.Module):
    """model(x) followed by cross entropy; logits of any rank are flattened to (N, C)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, target):
        logits = self.model(x)
        return self.loss(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class CNNWithDropout(nn.Module):
    """The reference CNN (Conv + BatchNorm + ReLU blocks) with Dropout(p=0) before its head."""

    def __init__(self):
        super().__init__()
        self.cnn = models.SmallCNN(in_channels=3, widths=(4, 8), num_classes=5)
        self.dropout = nn.Dropout(p=0.0)

    def forward(self, x):
        return self.dropout(self.cnn(x))


def small_cfg(**kw):
    return models.BertConfig(vocab_size=50, hidden=16, layers=2, heads=2, ffn=32, max_len=8, **kw)


def case(name):
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        model, x, classes = models.MLP((12, 16, 16, 5)), torch.randn(4, 12, generator=g), 5
        target = torch.randint(0, classes, (4,), generator=g)
    elif name == "cnn":
        model, x = CNNWithDropout(), torch.randn(2, 3, 8, 8, generator=g)
        target = torch.randint(0, 5, (2,), generator=g)
    elif name == "bert":
        model = nn.Sequential(models.BertEncoder(small_cfg()), nn.Linear(16, 3))
        x, target = torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 3, (2, 8), generator=g)
    elif name == "gpt":
        model = models.GPTDecoder(small_cfg())
        x, target = torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)
    elif name == "lstm":
        model = models.LSTMClassifier(features=6, hidden=8, num_classes=3)
        x, target = torch.randn(5, 2, 6, generator=g), torch.randint(0, 3, (2,), generator=g)
    else:
        raise KeyError(name)
    torch.manual_seed(0)
    return WithLoss(model), x, target


def export_training(module, x, target, opset=17):
    f = io.BytesIO()
    torch.onnx.export(module, (x, target), f, input_names=["x", "target"], output_names=["loss"],
                      opset_version=opset, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    return f.getvalue()


# Opsets 12 and 13 export BatchNormalization's training mode the old way (statistics outputs, no
# training_mode attribute) and ReduceSum/Split/Squeeze with their older signatures.
@pytest.mark.parametrize("name,opset", [(n, 17) for n in ["mlp", "cnn", "bert", "gpt", "lstm"]] +
                         [("cnn", 12), ("cnn", 13), ("bert", 13)])
def test_gradients_match_torch_autograd(name, opset):
    module, x, target = case(name)
    module.train()
    data = export_training(module, x, target, opset)

    loss = module(x, target)
    loss.backward()
    expected = {n: p.grad.detach().numpy() for n, p in module.named_parameters() if p.grad is not None}

    initializers = {i.name for i in onnx.load_from_string(data).graph.initializer}
    wrt = sorted(n for n in expected if n in initializers)
    assert wrt, f"no parameter of {name} is an initializer of the export"
    assert len(wrt) == len(expected), f"parameters missing from the export: {sorted(set(expected) - set(wrt))}"

    grad_model = build_gradient_graph(data, wrt, ["loss"])
    sess = onnxtrain.InferenceSession(grad_model)
    names = ["loss"] + [f"{n}_grad" for n in wrt]
    outs = sess.run(names, {"x": x.numpy(), "target": target.numpy()})
    np.testing.assert_allclose(outs[0], loss.detach().numpy(), rtol=1e-5)
    # Relative to the gradient's own norm, floored at 1e-3 of the model's largest gradient norm:
    # some gradients are zero in exact arithmetic (an attention key bias shifts every score of a
    # row equally, which softmax ignores) and both engines return rounding noise for them.
    floor = 1e-3 * max(np.linalg.norm(g) for g in expected.values())
    for n, got in zip(wrt, outs[1:]):
        want = expected[n]
        assert got.shape == want.shape, n
        err = np.linalg.norm(got - want) / max(np.linalg.norm(want), floor)
        assert err < 1e-4, f"{name}: gradient of '{n}' has relative error {err:.2e}"
