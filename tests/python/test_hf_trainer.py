"""onnxtrain.hf.Trainer (python/onnxtrain/hf/trainer.py) against transformers' own Trainer, in both HF
lanes (`make test-hf-lanes`): the same run logs the same losses and evaluates the same (fp32, gradient
accumulation, clipping, linear schedule), stepping FusedAdam through TrainModule; a run resumed from
a saved checkpoint ends where the uninterrupted run ends (dropout on, shuffled data); an epoch padded
to the longest sequence of each batch exports twice whatever the lengths (TrainModule's symbolic
sequence dim and its one check); bf16, gradient checkpointing and the memory optimizer reach
TrainModule; an unsupported option is named, or with ONNXTRAIN_FALLBACK=warn the Trainer runs
eagerly after one warning."""
import os
import re
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import onnxtrain  # noqa: E402
from onnxtrain.hf import Trainer, TrainingArguments  # noqa: E402
from onnxtrain.torch import FusedAdam, TrainModule  # noqa: E402

onnxtrain.set_num_threads(2)
SEQ = 12


def bert(dropout=0.0):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=2,
                                  hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    cfg._attn_implementation = "eager"
    return transformers.BertForSequenceClassification(cfg)


class Tokens(torch.utils.data.Dataset):
    """Random ids; the label says whether the first token is in the lower half of the vocabulary."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, 64, (n, SEQ), generator=g)
        self.labels = (self.ids[:, 0] < 33).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


def arguments(tmp_path, name, cls=TrainingArguments, **overrides):
    kw = dict(output_dir=str(tmp_path / name), use_cpu=True, report_to=[], per_device_train_batch_size=8,
              per_device_eval_batch_size=16, num_train_epochs=2, learning_rate=1e-2, weight_decay=0.01,
              max_grad_norm=0.5, logging_steps=1, save_strategy="no", seed=0, gradient_accumulation_steps=2,
              disable_tqdm=True)
    kw.update(overrides)
    return cls(**kw)


def logged_losses(trainer):
    return np.array([h["loss"] for h in trainer.state.log_history if "loss" in h], dtype=np.float64)


def the_optimizer(trainer):
    opt = trainer.optimizer
    return getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer around it (transformers 5)


def test_trainer_matches_transformers_trainer(tmp_path):
    train, held = Tokens(64, 1), Tokens(32, 2)
    ours = Trainer(model=bert(), args=arguments(tmp_path, "ours"), train_dataset=train, eval_dataset=held)
    ours.train()
    ours_eval = ours.evaluate()
    eager = transformers.Trainer(model=bert(), args=arguments(tmp_path, "eager", transformers.TrainingArguments),
                                 train_dataset=train, eval_dataset=held)
    eager.train()
    eager_eval = eager.evaluate()

    assert isinstance(the_optimizer(ours), FusedAdam) and not isinstance(the_optimizer(eager), FusedAdam)
    stats = ours.train_module.build_stats
    assert [s["backward"] for s in stats] == [True, False], stats  # one training graph, one eval graph
    assert ours.model is ours.train_module.original_module  # checkpoints save the Hugging Face model
    ours_losses, eager_losses = logged_losses(ours), logged_losses(eager)
    assert len(ours_losses) == 8 and ours_losses[-2:].sum() < 0.8 * ours_losses[:2].sum(), ours_losses  # it learns
    np.testing.assert_allclose(ours_losses, eager_losses, rtol=1e-4)
    np.testing.assert_allclose(ours_eval["eval_loss"], eager_eval["eval_loss"], rtol=1e-4)
    for (name, p), q in zip(ours.model.named_parameters(), eager.model.parameters()):
        if name.endswith("attention.self.key.bias"):
            continue  # its gradient is 0 in exact arithmetic (softmax ignores it); Adam steps on rounding noise
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-3, atol=1e-5, err_msg=name)


def test_resuming_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """Dropout on (its seeds come from torch's generator, which the checkpoint saves), shuffled
    batches, a checkpoint in the middle of the first epoch."""
    train = Tokens(48, 3)
    overrides = dict(num_train_epochs=3, save_strategy="steps", save_steps=2, gradient_accumulation_steps=1)
    whole = Trainer(model=bert(dropout=0.1), args=arguments(tmp_path, "run", **overrides), train_dataset=train)
    whole.train()
    checkpoint = tmp_path / "run" / "checkpoint-4"
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "rng_state.pth").exists()
    resumed = Trainer(model=bert(dropout=0.1), args=arguments(tmp_path, "resumed", **overrides), train_dataset=train)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    assert resumed.state.global_step == whole.state.global_step == 18
    np.testing.assert_array_equal(logged_losses(resumed), logged_losses(whole))  # the first 4 from the checkpoint
    for (name, p), q in zip(resumed.model.named_parameters(), whole.model.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=name)
    moments = [s["exp_avg"] for s in the_optimizer(resumed).state.values()]
    assert len(moments) == len(list(whole.model.parameters()))


class Sentences(torch.utils.data.Dataset):
    """Token ids of 4 to 16 tokens; the label says whether the first token is in the lower half."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, 17, (n,), generator=g)
        self.rows = [torch.randint(2, 64, (int(k),), generator=g) for k in lengths]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": int(self.rows[i][0] < 33)}


class PadToLongest:
    """The collator: each batch padded (id 0, attention mask 0) to its longest sentence; records the lengths."""

    def __init__(self):
        self.lengths = []

    def __call__(self, features):
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), longest, dtype=torch.long)
        mask = torch.zeros(len(features), longest, dtype=torch.long)
        for r, f in enumerate(features):
            ids[r, :len(f["input_ids"])] = f["input_ids"]
            mask[r, :len(f["input_ids"])] = 1
        self.lengths.append(longest)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


def test_an_epoch_padded_to_the_longest_exports_twice_and_follows_eager(tmp_path):
    data = Sentences(32, 6)
    runs = {}
    for name, cls, args_cls in (("ours", Trainer, TrainingArguments),
                                ("eager", transformers.Trainer, transformers.TrainingArguments)):
        collator = PadToLongest()
        trainer = cls(model=bert(), args=arguments(tmp_path, name, args_cls, num_train_epochs=1,
                                                   gradient_accumulation_steps=1, per_device_train_batch_size=2),
                      train_dataset=data, data_collator=collator)
        trainer.train()
        runs[name] = (trainer, collator.lengths)
    ours, lengths = runs["ours"]
    assert len(lengths) == 16 and len(set(lengths)) >= 6, lengths  # every batch full, padded to 6+ lengths
    # The first export, and one more the first time the sequence dim takes a new size (the check
    # that the export does not depend on it); then every length reuses them.
    assert ours.train_module.export_count == 2 and len(ours.train_module.build_stats) == 1
    np.testing.assert_allclose(logged_losses(ours), logged_losses(runs["eager"][0]), rtol=1e-4)


def test_bf16_and_memory_options_reach_the_train_module(tmp_path):
    train = Tokens(32, 4)
    checkpointing = "activation_checkpointing" if hasattr(transformers.TrainingArguments, "activation_checkpointing") \
        else "gradient_checkpointing"  # transformers 5's name
    runs = {}
    for name, overrides in {"fp32": {}, "bf16": dict(bf16=True), "checkpointing": {checkpointing: True},
                            "level1": dict(memory_opt_level=1)}.items():
        trainer = Trainer(model=bert(), args=arguments(tmp_path, name, num_train_epochs=1, **overrides),
                          train_dataset=train)
        trainer.train()
        runs[name] = (np.concatenate([p.detach().numpy().ravel() for p in trainer.model.parameters()]),
                      trainer.train_module)
    initial = np.concatenate([p.detach().numpy().ravel() for p in bert().parameters()])
    assert runs["bf16"][1]._mixed_precision == "bf16" and runs["fp32"][1]._mixed_precision == ""
    # bf16 GEMMs: after 2 steps the parameters are near fp32's, not equal (measured 0.05-0.1 of the update).
    off = np.linalg.norm(runs["bf16"][0] - runs["fp32"][0]) / np.linalg.norm(runs["fp32"][0] - initial)
    assert 0 < off < 0.3, off
    for name in ("checkpointing", "level1"):  # recomputing in the backward is exact
        np.testing.assert_allclose(runs[name][0], runs["fp32"][0], rtol=1e-5, atol=1e-7)
    # The bytes the forward keeps for the backward (the plan's block of saved values): 0.53-0.59 of
    # fp32's with checkpoint regions or level 1 (2026-11-27).
    saved = {name: int(re.search(r"saved values: \d+ of \d+ in one block of (\d+) bytes",
                                 run[1].build_stats[0]["memory"]).group(1)) for name, run in runs.items()}
    assert saved["checkpointing"] < 0.8 * saved["fp32"] and saved["level1"] < 0.8 * saved["fp32"], saved
    assert "plan (level 1)" in runs["level1"][1].build_stats[0]["memory_plan"]


def test_an_unsupported_option_is_named_or_falls_back_once(tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXTRAIN_FALLBACK", raising=False)
    monkeypatch.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)
    with pytest.raises(ValueError, match=r"optim='adafactor': onnxtrain steps with FusedAdam"):
        Trainer(model=bert(), args=arguments(tmp_path, "a", optim="adafactor"), train_dataset=Tokens(16, 5))
    with pytest.raises(ValueError, match=r"fp16=True: .*without a loss scaler.*use bf16=True"):
        Trainer(model=bert(), args=arguments(tmp_path, "a", fp16=True), train_dataset=Tokens(16, 5))
    monkeypatch.setenv("ONNXTRAIN_FALLBACK", "warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(model=bert(), args=arguments(tmp_path, "c", optim="adafactor", num_train_epochs=1),
                          train_dataset=Tokens(16, 5))
        trainer.train()
    ours = [w for w in caught if "ONNXTRAIN_FALLBACK=warn" in str(w.message)]
    assert len(ours) == 1 and "optim='adafactor'" in str(ours[0].message), [str(w.message) for w in caught]
    assert trainer.fallback_reason and trainer._train_module is None
    assert type(the_optimizer(trainer)).__name__ == "Adafactor" and not isinstance(trainer.model_wrapped, TrainModule)

    monkeypatch.delenv("ONNXTRAIN_FALLBACK")
    before = set(os.environ)
    try:
        with pytest.raises(ValueError, match=r"torch_compile=True: .*graph break"):
            Trainer(model=bert(), args=arguments(tmp_path, "b", torch_compile=True), train_dataset=Tokens(16, 5))
    finally:  # TrainingArguments(torch_compile=True) sets ACCELERATE_DYNAMO_* for the whole process
        for leaked in set(os.environ) - before:
            del os.environ[leaked]
