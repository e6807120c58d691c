"""On-device training end to end: artifacts from a PyTorch export, Module/Optimizer against
torch.optim on the same batches, resume from a checkpoint, gradient accumulation, export."""
import io
import os

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, LinearLRScheduler, Module, Optimizer


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def export(model):
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randn(4, 6),), f, input_names=["x"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    return f.getvalue()


def batches(n, batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(n)]


def params_of(model):
    return [n for n, _ in model.named_parameters()]


def build(tmp_path, model, optimizer):
    paths = artifacts.generate_artifacts(export(model), requires_grad=params_of(model),
                                         loss=artifacts.LossType.CrossEntropyLoss, optimizer=optimizer,
                                         artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    return paths, state, module, Optimizer(paths[2], module)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_losses_follow_torch_over_100_steps(tmp_path, kind):
    model = make_mlp()
    if kind == "adamw":
        config = artifacts.AdamW(lr=1e-2)
        reference = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        config = artifacts.SGD(lr=5e-2, momentum=0.9, nesterov=True)
        reference = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9, nesterov=True)
    _, _, module, optimizer = build(tmp_path, model, config)
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(batches(100)):
        ours = float(module(x.numpy(), y.numpy()))
        optimizer.step()
        module.lazy_reset_grad()
        reference.zero_grad()
        theirs = loss_fn(model(x), y)
        theirs.backward()
        reference.step()
        assert ours == pytest.approx(theirs.item(), rel=1e-4), f"step {step}"


def test_mean_reduced_loss_follows_torch(tmp_path):
    # MSE's gradient divides two element counts; a planner bug once changed it from the second step on.
    model = make_mlp()
    paths = artifacts.generate_artifacts(export(model), requires_grad=params_of(model),
                                         loss=artifacts.LossType.MSELoss, optimizer=artifacts.SGD(lr=0.1),
                                         artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    reference = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for step in range(20):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        ours = float(module(x.numpy(), y.numpy()))
        optimizer.step()
        module.lazy_reset_grad()
        reference.zero_grad()
        theirs = ((model(x) - y) ** 2).mean()
        theirs.backward()
        reference.step()
        assert ours == pytest.approx(theirs.item(), rel=1e-4), f"step {step}"


def make_dropout_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


@pytest.mark.parametrize("make_model", [make_mlp, make_dropout_mlp], ids=["mlp", "dropout"])
def test_resume_is_bit_identical(tmp_path, make_model):
    # Dropout masks come from the checkpoint's seed and step count: a resumed run redraws them.
    data = batches(10)

    def train(module, optimizer, steps):
        for x, y in steps:
            module(x.numpy(), y.numpy())
            optimizer.step()
            module.lazy_reset_grad()

    paths, state, module, optimizer = build(tmp_path, make_model(), artifacts.AdamW(lr=1e-2))
    train(module, optimizer, data)
    straight = module.get_contiguous_parameters()

    state = CheckpointState.load_checkpoint(paths[3])  # the same untrained artifacts, from the start
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    train(module, optimizer, data[:4])
    CheckpointState.save_checkpoint(state, tmp_path / "resume.ckpt", include_optimizer_state=True)
    state2 = CheckpointState.load_checkpoint(tmp_path / "resume.ckpt")
    module2 = Module(paths[0], state2, paths[1])
    optimizer2 = Optimizer(paths[2], module2)
    train(module2, optimizer2, data[4:])
    np.testing.assert_array_equal(module2.get_contiguous_parameters(), straight)
    if make_model is make_dropout_mlp:  # and the seed is what drives the masks
        state3 = CheckpointState.load_checkpoint(paths[3])
        state3.properties["onnxtrain.random_seed"] = state3.properties["onnxtrain.random_seed"] + 1
        module3 = Module(paths[0], state3, paths[1])
        train(module3, Optimizer(paths[2], module3), data)
        assert not np.array_equal(module3.get_contiguous_parameters(), straight)


def test_scheduler_resumed_from_a_checkpoint_continues_its_schedule(tmp_path):
    # The schedule reads the optimizer's step count (in the checkpoint), as ONNX Runtime's does: a
    # resumed run neither restarts its warmup nor drifts from an uninterrupted one.
    data = batches(8)

    def train(module, optimizer, scheduler, steps):
        lrs = []
        for x, y in steps:
            lrs.append(optimizer.get_learning_rate())
            module(x.numpy(), y.numpy())
            optimizer.step()
            scheduler.step()
            module.lazy_reset_grad()
        return lrs

    paths, state, module, optimizer = build(tmp_path, make_mlp(), artifacts.AdamW(lr=1e-2))
    straight_lrs = train(module, optimizer, LinearLRScheduler(optimizer, 4, 8, 1e-2), data)
    straight = module.get_contiguous_parameters()
    assert straight_lrs == pytest.approx([1e-2 * m for m in (0, .25, .5, .75, 1, .75, .5, .25)], rel=1e-12)

    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    first_lrs = train(module, optimizer, LinearLRScheduler(optimizer, 4, 8, 1e-2), data[:3])
    CheckpointState.save_checkpoint(state, tmp_path / "resume.ckpt", include_optimizer_state=True)
    state2 = CheckpointState.load_checkpoint(tmp_path / "resume.ckpt")
    module2 = Module(paths[0], state2, paths[1])
    optimizer2 = Optimizer(paths[2], module2)
    resumed = LinearLRScheduler(optimizer2, 4, 8, 1e-2)
    assert optimizer2.get_learning_rate() == pytest.approx(straight_lrs[3], rel=1e-12)
    assert first_lrs + train(module2, optimizer2, resumed, data[3:]) == straight_lrs
    np.testing.assert_array_equal(module2.get_contiguous_parameters(), straight)


def test_gradient_accumulation_matches_one_large_batch(tmp_path):
    (x, y), = batches(1, batch=16)
    _, state, module, _ = build(tmp_path / "big", make_mlp(), artifacts.SGD(lr=0.1))
    module(x.numpy(), y.numpy())
    big = {n: p.grad.copy() for n, p in state.parameters}
    _, state, module, _ = build(tmp_path / "small", make_mlp(), artifacts.SGD(lr=0.1))
    for i in range(4):  # the mean loss of each quarter: accumulated gradients are 4x the batch mean
        module(x[4 * i: 4 * i + 4].numpy(), y[4 * i: 4 * i + 4].numpy())
    for n, p in state.parameters:
        np.testing.assert_allclose(p.grad / 4, big[n], rtol=1e-5, atol=1e-7)


def test_export_for_inferencing_matches_torch_and_the_session(tmp_path):
    model = make_mlp()
    _, _, module, optimizer = build(tmp_path, model, artifacts.AdamW(lr=1e-2))
    scheduler = LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=10, initial_lr=1e-2)
    for x, y in batches(5):
        module(x.numpy(), y.numpy())
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    path = str(tmp_path / "infer.onnx")
    module.export_model_for_inferencing(path, ["logits"])
    exported = onnx.load(path)
    assert [i.name for i in exported.graph.input] == ["x"]
    x = np.random.default_rng(0).standard_normal((7, 6)).astype(np.float32)
    (ours,) = onnxtrain.InferenceSession(path).run(None, {"x": x})
    module.eval()
    assert module.output_names() == ["loss"]
    # The same weights in torch give the same logits.
    state = module._state
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(state.parameters[n].data))
        np.testing.assert_allclose(ours, model(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_bad_inputs_and_corrupt_checkpoints_leave_state_untouched(tmp_path):
    paths, state, module, _ = build(tmp_path, make_mlp(), artifacts.AdamW())
    before = module.get_contiguous_parameters(False).copy()
    with pytest.raises(onnxtrain.InvalidArgument, match="expected 2 inputs"):
        module(np.zeros((4, 6), np.float32))
    with pytest.raises(onnxtrain.InvalidArgument, match="should be float32"):
        module(np.zeros((4, 6), np.float64), np.zeros(4, np.int64))
    with pytest.raises(onnxtrain.InvalidArgument, match="should have shape"):
        module(np.zeros((4, 5), np.float32), np.zeros(4, np.int64))
    np.testing.assert_array_equal(module.get_contiguous_parameters(False), before)
    data = open(paths[3], "rb").read()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(data[:-7])
    with pytest.raises(onnxtrain.Error, match="bad.ckpt"):
        CheckpointState.load_checkpoint(bad)
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    bad.write_bytes(bytes(flipped))
    with pytest.raises(onnxtrain.Error, match="bad.ckpt"):
        CheckpointState.load_checkpoint(bad)
    assert open(paths[3], "rb").read() == data


def test_artifact_generation_reports_bad_parameter_lists(tmp_path):
    model = make_mlp()
    data = export(model)
    with pytest.raises(onnxtrain.InvalidArgument, match="'0.weight' is in both"):
        artifacts.generate_artifacts(data, requires_grad=["0.weight"], frozen_params=["0.weight"],
                                     loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    with pytest.raises(onnxtrain.InvalidArgument, match="'nope', which is not an initializer"):
        artifacts.generate_artifacts(data, requires_grad=["nope"], loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=tmp_path)
    assert not os.path.exists(tmp_path / "training_model.onnx")


def test_models_older_than_opset_12_get_the_loss_ops_from_onnxtrain(tmp_path):
    # SoftmaxCrossEntropyLoss is ai.onnx from opset 12: an opset-11 model trains the same.
    model, data = make_mlp(), batches(5)
    losses = {}
    for opset in (11, 17):
        f = io.BytesIO()
        torch.onnx.export(model, (torch.randn(4, 6),), f, input_names=["x"], output_names=["logits"],
                          opset_version=opset, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
        paths = artifacts.generate_artifacts(f.getvalue(), requires_grad=params_of(model),
                                             loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.SGD(lr=0.1),
                                             artifact_directory=tmp_path / str(opset))
        state = CheckpointState.load_checkpoint(paths[3])
        module = Module(paths[0], state, paths[1])
        optimizer = Optimizer(paths[2], module)
        losses[opset] = []
        for x, y in data:
            losses[opset].append(float(module(x.numpy(), y.numpy())))
            optimizer.step()
            module.lazy_reset_grad()
    np.testing.assert_allclose(losses[11], losses[17], rtol=1e-6)
    assert losses[17][-1] < losses[17][0]



def test_a_model_output_of_unknown_rank_still_gets_a_scalar_loss(tmp_path):
    # Silero VAD's output comes out of an If whose branches differ, so its rank is unknown: the
    # mean-reduced loss over it is still a scalar, seeded with 1 (no loss_grad input to feed).
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.array([2.0], np.float32), "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "unknown_rank", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    paths = artifacts.generate_artifacts(model.SerializeToString(), requires_grad=["w"],
                                         loss=artifacts.LossType.MSELoss, optimizer=artifacts.SGD(lr=0.1),
                                         artifact_directory=tmp_path)
    assert [i.name for i in onnx.load(paths[0]).graph.input] == ["x", "target", "w"]
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    xs, target = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    assert float(module(xs, target)) == pytest.approx(4.0)  # mean((2 * 1 - 0)^2)
    np.testing.assert_allclose(state.parameters["w"].grad, [4.0])  # d/dw mean((w x)^2) = 2 w x^2


def test_module_device_is_checked_and_cuda_is_loud_without_a_gpu(tmp_path):
    """device="cuda" runs on a GPU (tests/cuda/training_test.cc, on a lent one); this build (no CUDA,
    or no GPU) says why it cannot, and a device name other than cpu/cuda is refused."""
    paths, state, module, _ = build(tmp_path, make_mlp(), artifacts.AdamW())
    with pytest.raises(ValueError, match="'cpu' or 'cuda', got 'tpu'"):
        Module(paths[0], state, paths[1], device="tpu")
    gpu = onnxtrain.gpu_features()
    if gpu["available"]:
        pytest.skip(f"this machine has a GPU ({gpu['description']}): tests/cuda covers device='cuda'")
    assert "CUDA" in gpu["reason"]
    with pytest.raises(onnxtrain.Error, match="CUDA"):
        Module(paths[0], state, paths[1], device="cuda")
    x, t = batches(1)[0]
    assert np.isfinite(module(x.numpy(), t.numpy()))  # the CPU Module on the same state still trains
