"""Variable batch and sequence sizes, as users' loops make them: each batch padded to its longest
sequence, a short last batch. TrainModule exports with symbolic batch and sequence dims, checks
once per dim that the export does not depend on its size, and from then on reuses one export and
one set of graphs (export_count says how many exports were made), following eager PyTorch at every
step. With ONNXTRAIN_DYNAMIC_SHAPES=0 each shape exports on its own, as before.
"""
from __future__ import annotations

import copy

import pytest
import torch

import onnxtrain
from onnxtrain.torch import TrainModule

from . import hf_models
from .test_hf_models import RTOL, assert_gradients_close, _grads

onnxtrain.set_num_threads(1)


def padded_batches(name, sizes, seed=3):
    """Batches of `sizes` sequences of random lengths (2 to 12), each padded (right, id 0) to its
    longest, with the attention mask of the padding; causal LMs ignore the padded labels."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for size in sizes:
        lengths = torch.randint(2, 13, (size,), generator=g)
        longest = int(lengths.max())
        ids = torch.zeros(size, longest, dtype=torch.long)
        mask = torch.zeros(size, longest, dtype=torch.long)
        for row, n in enumerate(lengths.tolist()):
            ids[row, :n] = torch.randint(1, hf_models.VOCAB, (n,), generator=g)
            mask[row, :n] = 1
        if name in ("gpt2", "llama"):
            labels = ids.masked_fill(mask == 0, -100)
        else:
            labels = torch.randint(0, 3, (size,), generator=g)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


SIZES = [4, 4, 4, 4, 4, 4, 3]  # an epoch of 27 sequences in batches of 4


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_an_epoch_padded_to_the_longest_per_batch_exports_once_per_dim_and_follows_eager(name):
    model, _ = hf_models.make(name)
    batches = padded_batches(name, SIZES)
    shapes = {tuple(b["input_ids"].shape) for b in batches}
    assert len({s[1] for s in shapes}) >= 3, f"the draw should give several lengths: {shapes}"
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (wrapped, reference)]
    counts = []
    for step, batch in enumerate(batches):
        ours, theirs = wrapped(**batch), reference(**batch)
        ours.loss.backward()
        theirs.loss.backward()
        assert abs(ours.loss.item() - theirs.loss.item()) <= RTOL * abs(theirs.loss.item()), f"step {step}"
        assert_gradients_close(_grads(model), _grads(reference), f"step {step}")
        for opt in opts:
            opt.step()
            opt.zero_grad()
        counts.append(wrapped.export_count)
    # The first batch exports; the first batch of another length exports once more to check the
    # sequence dim, the short last batch once more for the batch dim; nothing else exports.
    first, varied, expected = batches[0]["input_ids"].shape, set(), []
    for batch in batches:
        varied |= {role for role, d in (("batch", 0), ("sequence", 1)) if batch["input_ids"].shape[d] != first[d]}
        expected.append(1 + len(varied))
    assert expected[-1] == 3 and counts == expected, (counts, [tuple(b["input_ids"].shape) for b in batches])
    assert len(wrapped.build_stats) == 1, "one set of graphs serves every shape"


def test_without_dynamic_shapes_each_shape_exports(monkeypatch):
    monkeypatch.setenv("ONNXTRAIN_DYNAMIC_SHAPES", "0")
    model, _ = hf_models.make("bert")
    batches = padded_batches("bert", SIZES)
    wrapped = TrainModule(model)
    for batch in batches:
        wrapped(**batch).loss.backward()
    shapes = {tuple(b["input_ids"].shape) for b in batches}
    assert wrapped.export_count == len(shapes) == len(wrapped.build_stats)
