"""onnxtrain.orttrainer: ONNX Runtime's ORTTrainer API over the same engine. An MLP and a
BERT-style classifier train with LAMB and Adam, gradient accumulation 4, a parameter group with
its own lr and weight decay, a warmup schedule and an extra_postprocess hook; the losses equal an
equivalent run written with the on-device API; save_as_onnx runs in onnxtrain and ONNX Runtime
with the same outputs; checkpoints and state dicts round-trip; bad settings fail clearly."""
import copy
import io
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

import onnxtrain
import onnxtrain.distributed
from onnxtrain import _C, artifacts, optim, orttrainer
from onnxtrain.torch import _compat
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.optim import lr_scheduler

import models  # bench/models.py: the shared reference models
import peers

ACCUM, STEPS = 4, 24  # 24 train_step calls: 6 optimizer steps


def mlp():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    batches = [(torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(STEPS)]
    desc = {"inputs": [("x", ["batch", 10]), ("label", ["batch"])],
            "outputs": [("loss", [], True), ("logits", ["batch", 3])]}
    return model, desc, batches, ["2.weight", "2.bias"]


def bert():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    cfg = models.BertConfig(vocab_size=50, hidden=16, layers=1, heads=2, ffn=32, max_len=8)
    model = models.BertClassifier(cfg, num_classes=3)
    batches = [(torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 3, (4,), generator=g))
               for _ in range(STEPS)]
    desc = orttrainer.ModelDescription(
        [orttrainer.IODescription("ids", ["batch", 8], torch.int64, num_classes=50),
         orttrainer.IODescription("label", ["batch"], torch.int64, num_classes=3)],
        [orttrainer.IODescription("loss", [], torch.float32), orttrainer.IODescription("logits", ["batch", 3])])
    return model, desc, batches, ["head.weight", "head.bias"]


def configs(group):
    """(ORTTrainer config, the same as on-device configs: default and group)."""
    return {
        "lamb": (optim.LambConfig(lr=5e-3, lambda_coef=0.01, params=[{"params": group, "lr": 2e-2, "lambda_coef": 0.0}]),
                 _C.optim.OptimizerConfig("lamb", lr=5e-3, weight_decay=0.01, eps=1e-6, max_grad_norm=1.0),
                 lambda f: _C.optim.OptimizerConfig("lamb", lr=2e-2 * f, weight_decay=0.0, eps=1e-6)),
        "adam": (optim.AdamConfig(lr=5e-3, lambda_coef=0.01, params=[{"params": group, "lr": 2e-2}]),
                 _C.optim.OptimizerConfig("adamw", lr=5e-3, weight_decay=0.01, eps=1e-8, max_grad_norm=1.0),
                 lambda f: _C.optim.OptimizerConfig("adamw", lr=2e-2 * f, weight_decay=0.01, eps=1e-8)),
    }


def warmup_linear(step, total=6, warmup=0.3):
    x = step / total
    return x / warmup if x < warmup else max((x - 1.0) / (warmup - 1.0), 0.0)


class WithLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, label):
        logits = self.model(x)
        return nn.functional.cross_entropy(logits, label), logits


def on_device_losses(model, input_name, batches, group, default_cfg, group_cfg, tmp_path):
    """The same training written with export -> generate_artifacts -> Module/Optimizer."""
    f = io.BytesIO()
    x0, y0 = batches[0]
    torch.onnx.export(WithLoss(model), (x0, y0), f, input_names=[input_name, "label"], output_names=["loss", "logits"],
                      opset_version=17, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={input_name: {0: "batch"}, "label": {0: "batch"}, "logits": {0: "batch"}},
                      **_compat.torchscript_exporter())  # the exporter ORTTrainer uses, on torch 1.13 and 2.x
    import onnx
    from onnx import TensorProto, helper
    proto = onnx.load_from_string(f.getvalue())
    for init in proto.graph.initializer:
        init.name = init.name[len("model."):] if init.name.startswith("model.") else init.name
    for node in proto.graph.node:
        node.input[:] = [n[len("model."):] if n.startswith("model.") else n for n in node.input]
    for node in proto.graph.node:  # the artifacts' loss output is named "loss": the model's is renamed
        node.output[:] = ["model_loss" if n == "loss" else n for n in node.output]
    proto.graph.output[0].name = "model_loss"
    ident = helper.make_model(helper.make_graph([helper.make_node("Identity", ["l"], ["o"])], "id",
                                                [helper.make_tensor_value_info("l", TensorProto.FLOAT, None)],
                                                [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    names = [n for n, _ in model.named_parameters()]
    artifacts.generate_artifacts(proto.SerializeToString(), requires_grad=names, loss=ident.SerializeToString(),
                                 optimizer=default_cfg, artifact_directory=str(tmp_path / "ref"),
                                 additional_output_names=["logits"], loss_input_names=["model_loss"])
    state = CheckpointState.load_checkpoint(str(tmp_path / "ref" / "checkpoint"))
    module = Module(str(tmp_path / "ref" / "training_model.onnx"), state, str(tmp_path / "ref" / "eval_model.onnx"))
    opt = Optimizer(str(tmp_path / "ref" / "optimizer_model.onnx"), module)
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(float(module(x.numpy(), y.numpy())[0]))
        if (i + 1) % ACCUM == 0:
            factor = warmup_linear(opt._optimizer.step_count())
            opt.set_learning_rate(default_cfg.lr * factor)
            opt._optimizer.set_param_groups([(group, group_cfg(factor))])
            opt.step()
            module.lazy_reset_grad()
    return losses


@pytest.mark.parametrize("rule", ["lamb", "adam"])
@pytest.mark.parametrize("build", [mlp, bert], ids=["mlp", "bert"])
def test_losses_equal_the_on_device_api(tmp_path, build, rule):
    model, desc, batches, group = build()
    reference_model = copy.deepcopy(model)
    config, default_cfg, group_cfg = configs(group)[rule]
    seen = []

    def postprocess(proto):
        seen.append([i.name for i in proto.graph.input])
        proto.doc_string = "postprocessed"

    options = orttrainer.ORTTrainerOptions({
        "batch": {"gradient_accumulation_steps": ACCUM},
        "lr_scheduler": lr_scheduler.LinearWarmupLRScheduler(total_steps=6, warmup=0.3),
        "debug": {"deterministic_compute": True},
        "_internal_use": {"extra_postprocess": postprocess}})
    trainer = orttrainer.ORTTrainer(model, desc, config, loss_fn=nn.functional.cross_entropy, options=options)
    losses = [float(trainer.train_step(x, y)[0]) for x, y in batches]
    input_name = "x" if build is mlp else "ids"
    assert seen == [[input_name, "label"]], "extra_postprocess runs once, on the exported model"
    expected = on_device_losses(reference_model, input_name, batches, group, default_cfg, group_cfg, tmp_path)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert trainer._optimizer._optimizer.step_count() == STEPS // ACCUM
    # The weights moved, the group with its own (larger) lr more than none.
    state = trainer.state_dict()["model"]["full_precision"]
    start = dict(model.named_parameters())
    assert np.abs(state[group[0]] - start[group[0]].detach().numpy()).max() > 1e-3


def test_save_as_onnx_runs_in_onnxtrain_and_onnx_runtime(tmp_path, ort_peer):
    model, desc, batches, group = bert()
    trainer = orttrainer.ORTTrainer(model, desc, optim.LambConfig(lr=1e-2), loss_fn=nn.functional.cross_entropy)
    for x, y in batches[:8]:
        trainer.train_step(x, y)
    path = str(tmp_path / "trained.onnx")
    trainer.save_as_onnx(path)
    ids, label = batches[0]
    expected = trainer.eval_step(ids, label)[1].numpy()
    sess = onnxtrain.InferenceSession(path)
    assert [i.name for i in sess.get_inputs()] == ["ids"]
    ours = sess.run(None, {"ids": ids.numpy()})[0]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    theirs = peers.ort_run(path, {"ids": ids.numpy()}, str(tmp_path))[0]
    np.testing.assert_allclose(theirs, expected, rtol=1e-4, atol=1e-5)
    # Trained: not the untrained torch model's outputs.
    assert np.abs(expected - model(ids).detach().numpy()).max() > 1e-3


def test_checkpoint_and_state_dict_round_trip(tmp_path):
    model, desc, batches, _ = mlp()
    twin = copy.deepcopy(model)
    options = {"batch": {"gradient_accumulation_steps": 2}, "utils": {"frozen_weights": ["0.bias"]}}
    a = orttrainer.ORTTrainer(model, desc, optim.AdamConfig(lr=1e-2), nn.functional.cross_entropy, options)
    for x, y in batches[:6]:
        a.train_step(x, y)
    a.save_checkpoint(str(tmp_path / "ckpt"), {"epoch": 3, "note": "half"})
    b = orttrainer.ORTTrainer(twin, desc, optim.AdamConfig(lr=1e-2), nn.functional.cross_entropy, options)
    assert b.load_checkpoint(str(tmp_path / "ckpt")) == {"epoch": 3, "note": "half"}
    rest_a = [float(a.train_step(x, y)[0]) for x, y in batches[6:12]]
    rest_b = [float(b.train_step(x, y)[0]) for x, y in batches[6:12]]
    assert rest_a == rest_b, "a resumed trainer continues bit for bit (moments, step count, accumulation phase)"
    sd = a.state_dict()
    frozen = sd["model"]["full_precision"]["0.bias"]
    np.testing.assert_array_equal(frozen, dict(model.named_parameters())["0.bias"].detach().numpy())
    b.load_state_dict(a.state_dict(pytorch_format=True))
    for name, value in b.state_dict()["model"]["full_precision"].items():
        np.testing.assert_array_equal(value, sd["model"]["full_precision"][name])
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({"2.bias": np.zeros(3, np.float32)})


def test_bad_settings_fail_clearly():
    model, desc, batches, _ = mlp()
    with pytest.raises(ValueError, match="unknown option 'batch.accumulation'"):
        orttrainer.ORTTrainerOptions({"batch": {"accumulation": 2}})
    with pytest.raises(NotImplementedError, match="mixed_precision"):
        orttrainer.ORTTrainerOptions({"mixed_precision": {"enabled": True}})
    with pytest.raises(ValueError, match="exactly one output must be the loss"):
        orttrainer.ORTTrainer(model, {"inputs": [("x", [8, 10])], "outputs": [("y", [8, 3])]}, optim.SGDConfig())
    with pytest.raises(ValueError, match="not one of"):
        optim.LambConfig(params=[{"params": ["2.bias"], "momentum": 0.9}])
    with pytest.raises(NotImplementedError, match="trust ratio"):
        optim.LambConfig(ratio_max=10.0)
    trainer = orttrainer.ORTTrainer(model, desc, optim.SGDConfig(params=[{"params": ["nope"], "lr": 1.0}]),
                                    nn.functional.cross_entropy)
    with pytest.raises(ValueError, match="'nope', which is not a trainable parameter"):
        trainer.train_step(*batches[0])
    with pytest.raises(RuntimeError, match="run one first"):
        orttrainer.ORTTrainer(model, desc, optim.SGDConfig(), nn.functional.cross_entropy).save_as_onnx("x.onnx")


def test_setup_with_mpi_outside_mpirun():
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("running under mpirun")
    assert orttrainer.setup_with_mpi() == (0, 1, 0)


def test_two_ranks_with_setup_with_mpi_equal_one_process(tmp_path):
    from .test_distributed import MPIRUN, env
    import shutil
    import subprocess
    if shutil.which("mpirun") is None or not onnxtrain.distributed.mpi_built():
        pytest.skip("needs Open MPI and an onnxtrain built with MPI")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "orttrainer_worker.py")
    cmd = MPIRUN + ["-np", "2", "/usr/bin/python3", worker, str(tmp_path / "two.npz")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    from .orttrainer_worker import train
    one = train(*orttrainer.setup_with_mpi())  # this process: rank 0 of 1, whole batches
    two = np.load(tmp_path / "two.npz")
    assert sorted(one) == sorted(two.files) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for k in one:
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-7)
