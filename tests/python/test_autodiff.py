"""build_gradient_graph: loud failures, seeds, fan-out accumulation."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain.autodiff import build_gradient_graph


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_integer_wrt_and_missing_rule_fail_naming_the_value_and_node():
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    m = model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [x], [y])
    with pytest.raises(onnxtrain.InvalidArgument, match="'x' is int64: only floating-point"):
        build_gradient_graph(m, ["x"], ["y"])
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, [3])
    u = helper.make_tensor_value_info("u", TensorProto.FLOAT, None)
    m = model([helper.make_node("Unique", ["f"], ["u"], name="uniq")], [f], [u])
    with pytest.raises(onnxtrain.NotImplemented, match=r"\[Unique\] node 'uniq'"):
        build_gradient_graph(m, ["f"], ["u"])


def test_fan_out_gradients_are_summed_and_scalar_loss_is_seeded():
    # loss = sum(w * x + w)  ->  dloss/dw = x + 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    w = numpy_helper.from_array(np.array([1, 2, 3, 4], np.float32), "w")
    m = model([helper.make_node("Mul", ["w", "x"], ["t"]), helper.make_node("Add", ["t", "w"], ["s"]),
               helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0)], [x], [loss], [w])
    sess = onnxtrain.InferenceSession(build_gradient_graph(m, ["w"], ["loss"]))
    xv = np.array([0.5, -1, 2, 3], np.float32)
    value, grad = sess.run(["loss", "w_grad"], {"x": xv})
    np.testing.assert_allclose(grad, xv + 1)
    assert value == pytest.approx(float(np.sum(np.arange(1, 5) * xv + np.arange(1, 5))))
