"""build_gradient_graph: loud failures, seeds, fan-out accumulation."""
import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain.autodiff import build_gradient_graph


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_integer_wrt_and_missing_rule_fail_naming_the_value_and_node():
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    m = model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [x], [y])
    with pytest.raises(onnxtrain.InvalidArgument, match="'x' is int64: only floating-point"):
        build_gradient_graph(m, ["x"], ["y"])
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, [3])
    u = helper.make_tensor_value_info("u", TensorProto.FLOAT, None)
    m = model([helper.make_node("ReluGrad", ["f", "f"], ["u"], name="second", domain="onnxtrain")], [f], [u])
    m.opset_import.append(helper.make_opsetid("onnxtrain", 1))
    with pytest.raises(onnxtrain.NotImplemented, match=r"\[ReluGrad\] node 'second'.*second derivatives"):
        build_gradient_graph(m, ["f"], ["u"])


def test_unique_backward_fails_where_a_value_repeats():
    """Unique's values are a permutation of distinct inputs (a scatter back); with a repeated value
    no derivative exists, and the backward says so at run time."""
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, [5])
    u = helper.make_tensor_value_info("u", TensorProto.FLOAT, None)
    m = model([helper.make_node("Unique", ["f"], ["u"], name="uniq", sorted=1)], [f], [u])
    sess = onnxtrain.InferenceSession(build_gradient_graph(m, ["f"], ["u"]))
    distinct = np.array([3.0, -1.0, 2.5, 0.0, 7.0], np.float32)
    seed = np.arange(1, 6, dtype=np.float32)  # u_grad: the gradient flowing into each sorted value
    grad = sess.run(["f_grad"], {"f": distinct, "u_grad": seed})[0]
    # sorted values -1, 0, 2.5, 3, 7: each input gets the seed at its value's position
    np.testing.assert_array_equal(grad, np.array([4.0, 1.0, 3.0, 2.0, 5.0], np.float32))
    repeated = np.array([3.0, -1.0, 3.0, 0.0, 7.0], np.float32)
    with pytest.raises(onnxtrain.InvalidArgument, match="Unique is differentiable only where its input has no "
                                                        "repeated values: 1 of 4 values repeat"):
        sess.run(["f_grad"], {"f": repeated, "u_grad": seed[:4]})


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


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_gradient_ops_are_written_in_the_models_opset(opset):
    # Axes moved from an attribute to an input: ReduceSum/Squeeze/Unsqueeze in opset 13, the other
    # reductions in 18. What the rules emit must be valid in the model's own opset.
    def axes(op, values):
        since = 13 if op in ("ReduceSum", "Squeeze", "Unsqueeze") else 18
        return ({}, [helper.make_tensor(f"{op}_axes", TensorProto.INT64, [len(values)], values)]) \
            if opset >= since else ({"axes": values}, [])

    sum_attrs, sum_inits = axes("ReduceSum", [1])
    mean_attrs, mean_inits = axes("ReduceMean", [0, 1])
    nodes = [helper.make_node("ReduceSum", ["x"] + [t.name for t in sum_inits], ["s"], keepdims=0, **sum_attrs),
             helper.make_node("ReduceMean", ["s"] + [t.name for t in mean_inits], ["loss"], keepdims=0,
                              **mean_attrs)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    graph = onnx.load_from_string(build_gradient_graph(model(nodes, [x], [loss], sum_inits + mean_inits, opset),
                                                       ["x"], ["loss"]))
    checked = 0
    for node in graph.graph.node:
        if node.domain not in ("", "ai.onnx") or not (node.op_type.startswith("Reduce") or "queeze" in node.op_type):
            continue
        since = 13 if node.op_type in ("ReduceSum", "Squeeze", "Unsqueeze") else 18
        has_input = len(node.input) > 1 and node.input[1] != ""
        has_attribute = any(a.name == "axes" for a in node.attribute)
        assert has_input == (opset >= since and (has_input or has_attribute)), \
            f"{node.op_type} '{node.name}' in an opset-{opset} model: axes input {has_input}, attribute {has_attribute}"
        assert not (has_attribute and opset >= since), f"{node.op_type} '{node.name}': axes attribute at opset {opset}"
        checked += 1
    assert checked > 2, "the backward emitted no op with axes"  # the forward's two plus the backward's
    (grad,) = onnxtrain.InferenceSession(graph.SerializeToString()).run(["x_grad"], {"x": np.ones((2, 3, 4), np.float32)})
    np.testing.assert_allclose(grad, np.full((2, 3, 4), 1 / 8, np.float32))  # mean over 8 sums of 3
