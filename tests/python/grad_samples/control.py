"""Samples for the control-flow ops in src/ops/control/. If's gradient flows to the values its
branches read from the enclosing graph (o0, o1, ...), for either value of the condition; a branch
that does not read a value gives it a zero gradient, and an If nested in a branch is
differentiated through."""
import numpy as np
from onnx import TensorProto, helper

from ..gradcheck import Sample

rng = np.random.default_rng(31)
D = TensorProto.DOUBLE


def _vi(name):
    return helper.make_tensor_value_info(name, D, None)


# then: (tanh(o0 * o1), o0 + o1);  else: (exp(o0) * 2, If(o0 sum > 0): o0 * o0 else -o0)  (o1 unused)
_THEN = helper.make_graph([helper.make_node("Mul", ["o0", "o1"], ["m"]), helper.make_node("Tanh", ["m"], ["t0"]),
                           helper.make_node("Add", ["o0", "o1"], ["t1"])], "then", [], [_vi("t0"), _vi("t1")])
_INNER = helper.make_node(
    "If", ["pos"], ["e1"],
    then_branch=helper.make_graph([helper.make_node("Mul", ["o0", "o0"], ["sq"])], "sq", [], [_vi("sq")]),
    else_branch=helper.make_graph([helper.make_node("Neg", ["o0"], ["ng"])], "neg", [], [_vi("ng")]))
_ELSE = helper.make_graph(
    [helper.make_node("Exp", ["o0"], ["ex"]),
     helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", D, [], [2.0])),
     helper.make_node("Mul", ["ex", "two"], ["e0"]),
     helper.make_node("ReduceSum", ["o0"], ["s"], keepdims=0),
     helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", D, [], [0.0])),
     helper.make_node("Greater", ["s", "zero"], ["pos"]), _INNER],
    "else", [], [_vi("e0"), _vi("e1")])


def _sample(cond, o0, name):
    return Sample([np.array(cond)], {"then_branch": _THEN, "else_branch": _ELSE}, wrt=[], outputs=(0, 1),
                  n_outputs=2, outer=[o0, rng.standard_normal((2, 3))], name=name)


SAMPLES = {
    "If": [
        _sample(True, rng.standard_normal((2, 3)), "then branch"),
        _sample(False, np.abs(rng.standard_normal((2, 3))) + 0.1, "else branch, nested If takes then"),
        _sample(False, -np.abs(rng.standard_normal((2, 3))) - 0.1, "else branch, nested If takes else"),
    ],
}


def _loop_body(with_cond):
    """(i, c, v) -> (c', tanh(v * o0 + i), tanh(v * o0 + i) * v); c' = sum(v) < 100 when with_cond."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=D), helper.make_node("Mul", ["v", "o0"], ["vw"]),
             helper.make_node("Add", ["vw", "fi"], ["pre"]), helper.make_node("Tanh", ["pre"], ["v_next"]),
             helper.make_node("Mul", ["v_next", "v"], ["s"])]
    if with_cond:
        nodes += [helper.make_node("ReduceSum", ["v"], ["total"], keepdims=0),
                  helper.make_node("Constant", [], ["limit"], value=helper.make_tensor("limit", D, [], [100.0])),
                  helper.make_node("Less", ["total", "limit"], ["c_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["c_out"]))
    return helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                        helper.make_tensor_value_info("c", TensorProto.BOOL, []), _vi("v")],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _vi("v_next"), _vi("s")])


def _loop_sample(trips, with_cond, name):
    cond = np.array(True) if with_cond else None
    return Sample([np.array(trips, np.int64), cond, rng.standard_normal((2, 3)) * 0.5],
                  {"body": _loop_body(with_cond)}, outputs=(0, 1), n_outputs=2,
                  outer=[rng.standard_normal((2, 3)) * 0.5], name=name)


SAMPLES["Loop"] = [_loop_sample(3, False, "trip count"), _loop_sample(2, True, "trip count and condition"),
                   _loop_sample(0, False, "no iteration")]


def _scan_body():
    """(s, x_t) -> (tanh(s * o0 + x_t), tanh(s * o0 + x_t) * x_t)."""
    return helper.make_graph(
        [helper.make_node("Mul", ["s", "o0"], ["so"]), helper.make_node("Add", ["so", "xt"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["s_next"]), helper.make_node("Mul", ["s_next", "xt"], ["y"])],
        "body", [_vi("s"), _vi("xt")], [_vi("s_next"), _vi("y")])


SAMPLES["Scan"] = [
    Sample([rng.standard_normal(3) * 0.5, rng.standard_normal((4, 3)) * 0.5],
           {"body": _scan_body(), "num_scan_inputs": 1}, outputs=(0, 1), n_outputs=2,
           outer=[rng.standard_normal(3) * 0.5], opset=11, name="axis 0, forwards"),
    Sample([rng.standard_normal(3) * 0.5, rng.standard_normal((3, 4)) * 0.5],
           {"body": _scan_body(), "num_scan_inputs": 1, "scan_input_axes": [1], "scan_input_directions": [1],
            "scan_output_axes": [-1], "scan_output_directions": [1]},
           outputs=(0, 1), n_outputs=2, outer=[rng.standard_normal(3) * 0.5], opset=11,
           name="axis 1, backwards, output axis -1 reversed"),
]
