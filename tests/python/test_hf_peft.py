"""onnxtrain's LoRA and Hugging Face PEFT, in both HF lanes (`make test-hf-lanes`), on a small BERT
classifier exported to ONNX under its own module names: adapters trained in onnxtrain's LoRA
artifacts, exported (adapter_model.safetensors + adapter_config.json), load with
``PeftModel.from_pretrained`` and give onnxtrain's outputs; adapters PEFT saved load into the
artifacts and give PEFT's outputs (a mismatched rank or module set is refused, naming it); a
PEFT-wrapped model trains under TrainModule with gradients on the adapters only, as in eager PyTorch,
and under onnxtrain.hf.Trainer as under transformers' Trainer."""
import io
import json
import os
import shutil

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import onnxtrain  # noqa: E402
from onnxtrain import artifacts  # noqa: E402
from onnxtrain.api import CheckpointState, Module, Optimizer  # noqa: E402
from onnxtrain.torch import TrainModule  # noqa: E402
from onnxtrain.torch._compat import torchscript_exporter  # noqa: E402

onnxtrain.set_num_threads(2)
TARGETS = ["query", "value"]
RANK, ALPHA = 4, 8.0
BATCH, SEQ = 8, 10


def bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, return_dict=False,
                                  initializer_range=0.2)  # logits of order 1, not 0.01
    cfg._attn_implementation = "eager"
    return transformers.BertForSequenceClassification(cfg).eval()


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (BATCH, SEQ), generator=g)
    return ids, (ids[:, 0] % 3).long()


def lora_artifacts(tmp_path):
    """The classifier exported to ONNX (its Linear layers keep their module paths) and LoRA artifacts on it."""
    f = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(bert(), (batch(0)[0],), f, input_names=["input_ids"], output_names=["logits"],
                          opset_version=17, do_constant_folding=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"}},
                          **torchscript_exporter())
    d = str(tmp_path / "artifacts")
    artifacts.generate_artifacts(f.getvalue(), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.AdamW(lr=1e-2), artifact_directory=d,
                                 additional_output_names=["logits"],
                                 lora=artifacts.LoraConfig(rank=RANK, alpha=ALPHA, target=TARGETS, seed=1))
    state = CheckpointState.load_checkpoint(os.path.join(d, "checkpoint"))
    module = Module(os.path.join(d, "training_model.onnx"), state, os.path.join(d, "eval_model.onnx"))
    return state, module


def onnxtrain_logits(module, ids, labels):
    module.eval()
    return module(ids.numpy(), labels.numpy())[1]


def save(peft_model, directory):
    # peft 0.14 writes a model card with Jinja2, which the hf113 peer lacks; the adapter files are what counts.
    peft_model.create_or_update_model_card = lambda *args, **kwargs: None
    peft_model.save_pretrained(str(directory))


def peft_config(**kw):
    return peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, **kw)


def test_exported_adapters_load_in_peft_and_give_the_same_outputs(tmp_path):
    state, module = lora_artifacts(tmp_path)
    optimizer = Optimizer(str(tmp_path / "artifacts" / "optimizer_model.onnx"), module)
    module.train()
    for step in range(5):
        module(*(t.numpy() for t in batch(100 + step)))
        optimizer.step()
        module.lazy_reset_grad()
    module.export_adapters(str(tmp_path / "adapter"))
    config = json.load(open(tmp_path / "adapter" / "adapter_config.json"))
    assert len(config["target_modules"]) == 4 and all(m.endswith(("query", "value")) for m in config["target_modules"])

    tuned = peft.PeftModel.from_pretrained(bert(), str(tmp_path / "adapter")).eval()
    loaded = {n for n, _ in tuned.named_parameters() if "lora_" in n}
    assert len(loaded) == 8, loaded  # A and B of query and value in both layers
    ids, labels = batch(7)
    ours = onnxtrain_logits(module, ids, labels)
    with torch.no_grad():
        theirs = tuned(ids)[0].numpy()
        base = bert()(ids)[0].numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-5)
    assert np.abs(ours - base).max() > 0.05 * np.abs(base).max()  # the adapters trained: outputs moved


def test_peft_adapters_import_into_lora_artifacts(tmp_path):
    torch.manual_seed(3)
    wrapped = peft.get_peft_model(bert(), peft_config(init_lora_weights=False)).eval()  # random A and B
    save(wrapped, tmp_path / "peft")
    state, module = lora_artifacts(tmp_path)
    ids, labels = batch(9)
    before = onnxtrain_logits(module, ids, labels)
    module.import_adapters(str(tmp_path / "peft"))
    with torch.no_grad():
        np.testing.assert_allclose(onnxtrain_logits(module, ids, labels), wrapped(ids)[0].numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(before - onnxtrain_logits(module, ids, labels)).max() > 0.05 * np.abs(before).max()

    # Another rank, another set of modules: refused, naming what differs; the adapters stay as they were.
    imported = onnxtrain_logits(module, ids, labels)
    save(peft.get_peft_model(bert(), peft.LoraConfig(r=2, lora_alpha=ALPHA, target_modules=TARGETS)),
         tmp_path / "rank2")
    with pytest.raises(onnxtrain.Error, match="r is 2, these artifacts need 4"):
        module.import_adapters(str(tmp_path / "rank2"))
    with pytest.raises(onnxtrain.Error, match=r"expected shape \[4, 32\] \(rank 4\), got \[2, 32\]"):
        module.import_adapters(str(tmp_path / "rank2" / "adapter_model.safetensors"))
    save(peft.get_peft_model(bert(), peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["query"])),
         tmp_path / "query")
    with pytest.raises(onnxtrain.Error, match=r"has no 'base_model\.model\.bert\.encoder\.layer\.0\.attention\.self"
                                              r"\.value\.lora_A\.weight'"):
        module.import_adapters(str(tmp_path / "query"))
    # Per-module alphas or ranks (one adapter scaled otherwise): refused, not imported at the wrong scale.
    for key, pattern in [("alpha_pattern", {"value": 2 * ALPHA}), ("rank_pattern", {"value": RANK})]:
        shutil.copytree(tmp_path / "peft", tmp_path / key)
        config_path = tmp_path / key / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config[key] = pattern
        config_path.write_text(json.dumps(config))
        with pytest.raises(onnxtrain.Error, match=f"{key} is .*per-module ranks and alphas are not supported"):
            module.import_adapters(str(tmp_path / key))
    np.testing.assert_array_equal(onnxtrain_logits(module, ids, labels), imported)


def test_a_peft_model_trains_under_train_module_like_eager(tmp_path):
    def wrapped():
        torch.manual_seed(5)
        return peft.get_peft_model(bert(), peft_config(init_lora_weights=False)).train()

    eager, ours_module = wrapped(), wrapped()
    ours = TrainModule(ours_module)
    trainable = [n for n, p in ours_module.named_parameters() if p.requires_grad]
    assert len(trainable) == 8 and all("lora_" in n for n in trainable)
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in (eager, ours_module)]
    losses = {"eager": [], "ours": []}
    ids, labels = batch(200)  # one batch, fitted by the adapters alone (the head stays frozen)
    for step in range(10):
        for name, model, opt in (("eager", eager, opts[0]), ("ours", ours, opts[1])):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(ids)[0], labels)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
        if step == 0:  # only the adapters receive gradients
            assert all((p.grad is not None) == p.requires_grad for p in ours_module.parameters())
    np.testing.assert_allclose(losses["ours"], losses["eager"], rtol=1e-4)
    assert losses["ours"][-1] < 0.8 * losses["ours"][0], losses["ours"]
    for (name, p), q in zip(ours_module.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    assert len(ours.build_stats) == 1


def test_onnxtrain_trainer_trains_a_peft_model_like_transformers_trainer(tmp_path):
    from onnxtrain.hf import Trainer, TrainingArguments

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            ids, labels = batch(300 + i // BATCH)
            return {"input_ids": ids[i % BATCH], "labels": labels[i % BATCH]}

    runs = {}
    for name, cls, args_cls in (("ours", Trainer, TrainingArguments),
                                ("eager", transformers.Trainer, transformers.TrainingArguments)):
        torch.manual_seed(5)
        model = peft.get_peft_model(bert(), peft_config(init_lora_weights=False))
        args = args_cls(str(tmp_path / name), use_cpu=True, report_to=[], per_device_train_batch_size=BATCH,
                        num_train_epochs=2, learning_rate=1e-2, logging_steps=1, save_strategy="no", seed=0,
                        disable_tqdm=True)
        trainer = cls(model=model, args=args, train_dataset=Batches())
        trainer.train()
        runs[name] = trainer
    ours = runs["ours"]
    stepped = [p for group in getattr(ours.optimizer, "optimizer", ours.optimizer).param_groups for p in group["params"]]
    assert len(stepped) == 8 and all(p.requires_grad for p in stepped)  # FusedAdam steps the adapters only
    assert type(getattr(ours.optimizer, "optimizer", ours.optimizer)).__name__ == "FusedAdam"
    assert ours.train_module.build_stats[0]["backward"] and ours.train_module.original_module is ours.model
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (ours, runs["eager"])]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    for (name, p), q in zip(ours.model.named_parameters(), runs["eager"].model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
