"""Weights stored as Constant nodes (as paddle2onnx writes them) are parameters when named or when
"all" is asked for: training them matches the same model with the weights as initializers, the
exported inference model keeps the trained values, and shape-like constants are never parameters."""
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer

from .build_paths import ONNXTRAIN

RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 8)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
V = RNG.standard_normal((2, 4, 3)).astype(np.float32)


def const(name, array):
    return helper.make_node("Constant", [], [name], name=name + "_node", value=numpy_helper.from_array(array))


def model(as_constants):
    """y = reshape(relu(x W + b) * 0.5, [-1, 2, 4]) . V  (W, b, V as Constant nodes or initializers)."""
    weights = {"W": W, "b": B, "V": V}
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h0"]),
        helper.make_node("Add", ["h0", "b"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        const("half", np.array(0.5, np.float32)),                      # a scalar: never a parameter
        helper.make_node("Mul", ["h2", "half"], ["h3"]),
        const("shape", np.array([-1, 2, 4], np.int64)),                # a shape: never a parameter
        helper.make_node("Reshape", ["h3", "shape"], ["h4"]),
        helper.make_node("Einsum", ["h4", "V"], ["y"], equation="nij,ijk->nk"),
    ]
    inits = []
    if as_constants:
        nodes = [const(n, a) for n, a in weights.items()] + nodes
    else:
        inits = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString()


def train(tmp_path, data, requires_grad, steps=4):
    paths = artifacts.generate_artifacts(data, requires_grad=requires_grad, loss=artifacts.LossType.MSELoss,
                                         optimizer=artifacts.SGD(lr=0.05), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    losses = []
    for _ in range(steps):
        losses.append(float(module(x, t)))
        optimizer.step()
        module.lazy_reset_grad()
    return module, state, losses, x


def test_all_covers_constant_weights_but_not_scalars_or_shapes():
    assert sorted(onnxtrain._C.all_parameters(model(True))) == ["V", "W", "b"]
    assert sorted(onnxtrain._C.all_parameters(model(False))) == ["V", "W", "b"]


def test_resize_scales_are_never_parameters():
    nodes = [const("K", RNG.standard_normal((2, 1, 3, 3)).astype(np.float32)),
             const("scales", np.array([1, 1, 2, 2], np.float32)),
             helper.make_node("Conv", ["x", "K"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert onnxtrain._C.all_parameters(m.SerializeToString()) == ["K"]


def test_constant_weights_train_like_initializers_and_export_trained_values(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "i").mkdir()
    module_c, state_c, losses_c, x = train(tmp_path / "c", model(True), "all")
    module_i, state_i, losses_i, _ = train(tmp_path / "i", model(False), ["W", "b", "V"])
    np.testing.assert_allclose(losses_c, losses_i, rtol=1e-6)
    assert losses_c[-1] < losses_c[0]
    for name in ["W", "b", "V"]:
        np.testing.assert_allclose(state_c.parameters[name].data, state_i.parameters[name].data, rtol=1e-6)
    assert not np.allclose(state_c.parameters["W"].data, W)  # trained
    path = str(tmp_path / "infer.onnx")
    module_c.export_model_for_inferencing(path, ["y"])
    exported = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    np.testing.assert_array_equal(inits["W"], state_c.parameters["W"].data)
    assert "W" not in [o for n in exported.graph.node for o in n.output]
    (ours,) = onnxtrain.InferenceSession(path).run(None, {"x": x})
    h = np.maximum(x @ state_c.parameters["W"].data + state_c.parameters["b"].data, 0) * 0.5
    expected = np.einsum("nij,ijk->nk", h.reshape(-1, 2, 4), state_c.parameters["V"].data)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_only_some_constants_trained(tmp_path):
    _, state, losses, _ = train(tmp_path, model(True), ["V"], steps=2)
    assert losses[1] < losses[0]
    assert sorted(state.parameters.keys()) >= ["V"]
    assert not np.allclose(state.parameters["V"].data, V)


def test_a_non_float_constant_is_refused_by_name(tmp_path):
    with pytest.raises(onnxtrain.Error, match=r"\[Constant\] node 'shape_node'.*int64 constant"):
        artifacts.generate_artifacts(model(True), requires_grad=["W", "shape"], loss=artifacts.LossType.MSELoss,
                                     artifact_directory=tmp_path)
    with pytest.raises(onnxtrain.InvalidArgument, match="'nope', which is not an initializer or a Constant"):
        artifacts.generate_artifacts(model(True), requires_grad=["nope"], loss=artifacts.LossType.MSELoss,
                                     artifact_directory=tmp_path)


def test_cli_all_trains_constant_weights(tmp_path):
    (tmp_path / "m.onnx").write_bytes(model(True))
    r = subprocess.run([str(ONNXTRAIN), "artifacts", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "a"), "--all",
                        "--loss", "mse"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "trainable: 3 parameters (80 elements)" in r.stdout
    state = CheckpointState.load_checkpoint(str(tmp_path / "a" / "checkpoint"))
    assert {"W", "b", "V"} <= set(state.parameters.keys())


def test_constants_inside_if_branches_are_parameters_read_from_the_top(tmp_path):
    """y = If(flag): (x W_then) else (x W_else), the weights Constant nodes inside the branches (as
    spox writes Silero): 'all' finds both, training updates the taken branch's, the exported model
    keeps them as top-level initializers the branches read."""
    w_then, w_else = RNG.standard_normal((6, 3)).astype(np.float32), RNG.standard_normal((6, 3)).astype(np.float32)
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, ["N", 3])
    then_g = helper.make_graph([const("W_then", w_then), helper.make_node("MatMul", ["x", "W_then"], ["o"])],
                               "then", [], [out])
    else_g = helper.make_graph([const("W_else", w_else), helper.make_node("MatMul", ["x", "W_else"], ["o2"])],
                               "else", [], [helper.make_tensor_value_info("o2", TensorProto.FLOAT, ["N", 3])])
    g = helper.make_graph([const("flag", np.array(True)),
                           helper.make_node("Identity", ["flag"], ["cond"]),
                           helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    assert sorted(onnxtrain._C.all_parameters(data)) == ["W_else", "W_then"]
    module, state, losses, x = train(tmp_path, data, "all")
    assert losses[-1] < losses[0]
    assert not np.allclose(state.parameters["W_then"].data, w_then)
    np.testing.assert_array_equal(state.parameters["W_else"].data, w_else)  # the branch not taken
    path = str(tmp_path / "infer.onnx")
    module.export_model_for_inferencing(path, ["y"])
    inits = {i.name for i in onnx.load(path).graph.initializer}
    assert {"W_then", "W_else"} <= inits
    np.testing.assert_allclose(onnxtrain.InferenceSession(path).run(None, {"x": x})[0],
                               x @ state.parameters["W_then"].data, rtol=1e-5, atol=1e-6)
