"""torch.utils.checkpoint inside a TrainModule-wrapped module: each checkpointed call's activations
are recomputed in the backward (fewer saved bytes), training follows the same losses and
parameters as the same module without checkpoint, and the export that torch 1.13 cannot trace
(the reentrant checkpoint) works."""
import copy
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import onnxtrain
from onnxtrain.torch import TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

from .train_loops import train_torch  # noqa: E402

onnxtrain.set_num_threads(1)

BATCH, SEQ, VOCAB = 2, 8, 40


class Encoder(models.BertEncoder):
    """BertEncoder whose layers run through torch.utils.checkpoint (`mode`: "reentrant",
    "non_reentrant"; None: no checkpoint), with Dropout after each layer."""

    def __init__(self, mode):
        super().__init__(models.BertConfig(vocab_size=VOCAB, hidden=16, layers=2, heads=2, ffn=32, max_len=12))
        self.mode = mode
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, VOCAB)

    def block(self, layer, x):
        return self.drop(layer(x))

    def forward(self, ids):
        x = self.norm(self.tokens(ids) + self.positions[:, : ids.shape[1]])
        for layer in self.layers:
            if self.mode is None:
                x = self.block(layer, x)
            else:
                x = checkpoint(self.block, layer, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_layers_recompute_and_train_alike(mode):
    torch.manual_seed(0)
    base = Encoder(None).train()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
            for _ in range(20)]
    runs = {}
    for m in (None, mode):
        model = copy.deepcopy(base)
        model.mode = m
        wrapped = TrainModule(model)
        torch.manual_seed(7)  # the same Dropout masks
        runs[m] = (train_torch(wrapped, data), model.state_dict(), wrapped.build_stats[0])
    plain, ckpt = runs[None], runs[mode]
    np.testing.assert_allclose(ckpt[0], plain[0], rtol=1e-5)
    for k, v in plain[1].items():
        torch.testing.assert_close(ckpt[1][k], v, rtol=1e-5, atol=1e-7, msg=k)
    assert "torch.utils.checkpoint: 2 regions recomputed" in ckpt[2]["memory_plan"], ckpt[2]["memory_plan"]
    # Each layer keeps its input (and its output, the next one's input) instead of ~20 activations.
    assert ckpt[2]["saved_bytes"] < 0.6 * plain[2]["saved_bytes"], (ckpt[2]["saved_bytes"], plain[2]["saved_bytes"])


def test_checkpoint_is_restored_after_export():
    import torch.utils.checkpoint as cp
    names = ("CheckpointFunction", "_checkpoint_without_reentrant", "_checkpoint_impl")  # 1.13's, 2.x's
    before = {n: getattr(cp, n, None) for n in names}
    model = Encoder("reentrant").train()
    TrainModule(model)(torch.randint(0, VOCAB, (BATCH, SEQ))).sum().backward()
    assert {n: getattr(cp, n, None) for n in names} == before
    # torch itself still checkpoints the plain module.
    x = torch.randn(3, 4, requires_grad=True)
    checkpoint(torch.tanh, x).sum().backward()
    torch.testing.assert_close(x.grad, 1 - torch.tanh(x.detach()) ** 2)
