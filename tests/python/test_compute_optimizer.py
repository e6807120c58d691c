"""The compute optimizer in TrainModule (ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER, on by default): a
BERT-style classifier's head on token 0 makes the last layer's FFN and LayerNorm run on one token,
and training follows the same losses and parameters as with it off."""
import copy
import os
import sys

import numpy as np
import onnx
import torch
from torch import nn

import onnxtrain
from onnxtrain.torch import TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

onnxtrain.set_num_threads(1)


def test_classifier_head_gathers_upstream_and_trains_alike(monkeypatch):
    torch.manual_seed(0)
    cfg = models.BertConfig(vocab_size=40, hidden=16, layers=2, heads=2, ffn=32, max_len=12)
    base = models.BertClassifier(cfg, num_classes=3).train()
    g = torch.Generator().manual_seed(3)
    data = [(torch.randint(0, 40, (4, 10), generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(20)]
    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER", flag)
        model = copy.deepcopy(base)
        wrapped = TrainModule(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            loss = nn.functional.cross_entropy(wrapped(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        forward = onnx.load_from_string(next(iter(wrapped._graphs.values())).runner.forward_model())
        gathers = sum(n.op_type == "Gather" for n in forward.graph.node)
        runs[flag] = (losses, model.state_dict(), gathers)
    np.testing.assert_allclose(runs["1"][0], runs["0"][0], rtol=1e-5)
    for k, v in runs["0"][1].items():
        torch.testing.assert_close(runs["1"][1][k], v, rtol=1e-5, atol=1e-6, msg=k)
    # The token-0 Gather is split over the residual sum's operands: more Gathers, fewer rows.
    assert runs["1"][2] > runs["0"][2]
