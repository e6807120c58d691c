"""Sequence and optional values: the sequence ops against numpy, sequences and empty optionals as
feeds and outputs, a Loop carrying a sequence, gradients through sequences read by several nodes,
and bad input failing with the node's name."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain import autodiff

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def tensor(name, dtype=F, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def sequence(name, dtype=F):
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(dtype, None)))


def optional_sequence(name, dtype=F):
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(dtype, None))
    return helper.make_value_info(name, helper.make_optional_type_proto(seq))


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def session(data):
    options = onnxtrain.SessionOptions()
    options.check_shape_rules = True
    return onnxtrain.InferenceSession(data, options)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def test_sequence_ops_match_numpy():
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=0),      # [x0:1], [x1:3]
        helper.make_node("SequenceInsert", ["parts", "y", "zero"], ["with_y"]),     # [y, x0:1, x1:3]
        helper.make_node("SequenceErase", ["with_y", "minus_one"], ["erased"]),     # [y, x0:1]
        helper.make_node("SequenceLength", ["erased"], ["n"]),
        helper.make_node("SequenceAt", ["erased", "minus_one"], ["last"]),
        helper.make_node("ConcatFromSequence", ["erased"], ["cat"], axis=0),
        helper.make_node("ConcatFromSequence", ["erased"], ["stacked"], axis=1, new_axis=1),
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
        helper.make_node("SequenceLength", ["empty"], ["n_empty"]),
    ]
    inits = [const("sizes", np.array([1, 2], np.int64)), const("zero", np.array(0, np.int64)),
             const("minus_one", np.array(-1, np.int64))]
    data = model(nodes, [tensor("x", F, [3, 2]), tensor("y", F, [1, 2])],
                 [tensor("n", I64, []), tensor("last", F, None), tensor("cat", F, None), tensor("stacked", F, None),
                  sequence("erased"), tensor("n_empty", I64, [])], inits)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.full((1, 2), -1, np.float32)
    sess = session(data)
    for _ in range(2):  # the second run goes through the plan
        n, last, cat, stacked, erased, n_empty = sess.run(None, {"x": x, "y": y})
        assert n == 2 and n_empty == 0
        np.testing.assert_array_equal(last, x[:1])
        np.testing.assert_array_equal(cat, np.concatenate([y, x[:1]]))
        np.testing.assert_array_equal(stacked, np.stack([y, x[:1]], axis=1))
        assert isinstance(erased, list) and len(erased) == 2
        np.testing.assert_array_equal(erased[0], y)


def test_split_to_sequence_variants():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    cases = [({"axis": 1}, None, [x[:, i:i + 1] for i in range(5)]),
             ({"axis": 1, "keepdims": 0}, None, [x[:, i] for i in range(5)]),
             ({"axis": 1}, np.array(2, np.int64), [x[:, 0:2], x[:, 2:4], x[:, 4:5]])]
    for attrs, split, want in cases:
        inputs, inits = ["x"], []
        if split is not None:
            inputs.append("split")
            inits.append(const("split", split))
        data = model([helper.make_node("SplitToSequence", inputs, ["s"], **attrs)], [tensor("x", F, [2, 5])],
                     [sequence("s")], inits)
        got = session(data).run(None, {"x": x})[0]
        assert len(got) == len(want), attrs
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_sequences_and_empty_optionals_as_feeds_and_outputs():
    data = model([helper.make_node("Identity", ["s"], ["t"]),
                  helper.make_node("OptionalHasElement", ["o"], ["has"])],
                 [sequence("s"), optional_sequence("o")], [sequence("t"), tensor("has", TensorProto.BOOL, [])],
                 opset=18)
    sess = session(data)
    items = [np.ones(2, np.float32), np.zeros((1, 3), np.float32)]
    out, has = sess.run(None, {"s": items, "o": None})
    assert len(out) == 2 and out[1].shape == (1, 3) and not has
    out, has = sess.run(None, {"s": [], "o": items})
    assert out == [] and has


def test_loop_appends_to_a_carried_sequence():
    """Loop 3 times: seq = SequenceInsert(seq, x * i); the final sequence holds x*0, x*1, x*2."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [tensor("i", I64, []), tensor("cond_in", TensorProto.BOOL, []), sequence("seq_in")],
        [tensor("cond_out", TensorProto.BOOL, []), sequence("seq_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"]),
             helper.make_node("Loop", ["M", "", "empty"], ["seq"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["all"], axis=0, new_axis=1)]
    data = model(nodes, [tensor("M", I64, []), tensor("x", F, [2])], [tensor("all", F, None)])
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(session(data).run(None, {"M": np.array(3), "x": x})[0], np.stack([x * 0, x, x * 2]))


def test_gradient_of_a_sequence_read_by_several_nodes():
    """z = sum(At(s, 0) * At(s, 1)) + sum(w * Concat(s)), s = SequenceConstruct(a, b): the gradients of
    s from three readers are summed element by element."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceAt", ["s", "zero"], ["s0"]),
             helper.make_node("SequenceAt", ["s", "one"], ["s1"]),
             helper.make_node("Mul", ["s0", "s1"], ["p"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=0),
             helper.make_node("Mul", ["c", "w"], ["cw"]),
             helper.make_node("ReduceSum", ["p"], ["z0"], keepdims=0),
             helper.make_node("ReduceSum", ["cw"], ["z1"], keepdims=0),
             helper.make_node("Add", ["z0", "z1"], ["z"])]
    D = TensorProto.DOUBLE
    inits = [const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64))]
    data = model(nodes, [tensor("a", D, [2, 3]), tensor("b", D, [2, 3]), tensor("w", D, [4, 3])],
                 [tensor("z", D, [])], inits)
    grad_model = autodiff.build_gradient_graph(data, ["a", "b"], ["z"])
    rng = np.random.default_rng(3)
    a, b, w = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    feeds = {"a": a, "b": b, "w": w}
    sess = onnxtrain.InferenceSession(grad_model)
    if "z_grad" in {i.name for i in sess.get_inputs()}:
        feeds["z_grad"] = np.array(1.0)
    da, db = sess.run(["a_grad", "b_grad"], feeds)
    np.testing.assert_allclose(da, b + w[:2], rtol=1e-12)
    np.testing.assert_allclose(db, a + w[2:], rtol=1e-12)


def test_gradient_through_sequence_edits():
    """s = [b, c, a] by three inserts (at the end, at 0, at -1), then erase position 0 -> [c, a];
    z = sum(w * Concat(s)). Every position form is exercised: a wrong one moves a gradient."""
    D = TensorProto.DOUBLE
    nodes = [helper.make_node("SequenceEmpty", [], ["e"], dtype=D),
             helper.make_node("SequenceInsert", ["e", "a"], ["s1"]),                 # [a]
             helper.make_node("SequenceInsert", ["s1", "b", "zero"], ["s2"]),        # [b, a]
             helper.make_node("SequenceInsert", ["s2", "c", "minus_one"], ["s3"]),   # [b, c, a]
             helper.make_node("SequenceErase", ["s3", "zero"], ["s4"]),              # [c, a]
             helper.make_node("ConcatFromSequence", ["s4"], ["y"], axis=0),
             helper.make_node("Mul", ["y", "w"], ["yw"]),
             helper.make_node("ReduceSum", ["yw"], ["z"], keepdims=0)]
    inits = [const("zero", np.array(0, np.int64)), const("minus_one", np.array(-1, np.int64))]
    data = model(nodes, [tensor(n, D, [2]) for n in "abc"] + [tensor("w", D, [4])], [tensor("z", D, [])], inits)
    grad_model = autodiff.build_gradient_graph(data, ["a", "b", "c"], ["z"])
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(2) for n in "abc"}
    feeds["w"] = rng.standard_normal(4)
    sess = onnxtrain.InferenceSession(grad_model)
    if "z_grad" in {i.name for i in sess.get_inputs()}:
        feeds["z_grad"] = np.array(1.0)
    da, db, dc = sess.run(["a_grad", "b_grad", "c_grad"], feeds)
    np.testing.assert_array_equal(da, feeds["w"][2:])
    np.testing.assert_array_equal(db, np.zeros(2))
    np.testing.assert_array_equal(dc, feeds["w"][:2])


def test_sequence_map_says_it_is_not_differentiated():
    body = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "body",
                             [tensor("x", TensorProto.DOUBLE, [2])], [tensor("y", TensorProto.DOUBLE, [2])])
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s"]),
             helper.make_node("SequenceMap", ["s"], ["m"], name="map", body=body),
             helper.make_node("ConcatFromSequence", ["m"], ["y"], axis=0)]
    data = model(nodes, [tensor("a", TensorProto.DOUBLE, [2])], [tensor("y", TensorProto.DOUBLE, None)])
    with pytest.raises(onnxtrain.Error, match=r"\[SequenceMap\] node 'map': no gradient rule: .*not differentiated"):
        autodiff.build_gradient_graph(data, ["a"], ["y"])


def test_bad_sequence_input_names_the_node():
    at = model([helper.make_node("SequenceAt", ["s", "p"], ["y"], name="the_at")],
               [sequence("s"), tensor("p", I64, [])], [tensor("y", F, None)])
    with pytest.raises(onnxtrain.Error, match=r"\[SequenceAt\] node 'the_at': position 2 is out of range .* 2 tensors"):
        session(at).run(None, {"s": [np.ones(1, np.float32)] * 2, "p": np.array(2)})
    with pytest.raises(onnxtrain.Error, match=r"input 's' should be a sequence, got a tensor"):
        session(at).run(None, {"s": np.ones(1, np.float32), "p": np.array(0)})
    with pytest.raises(onnxtrain.Error, match=r"input 's' should be a sequence of float32, got an element of int64"):
        session(at).run(None, {"s": [np.ones(1, np.int64)], "p": np.array(0)})
    cat = model([helper.make_node("ConcatFromSequence", ["s"], ["y"], name="the_cat", axis=0)],
                [sequence("s")], [tensor("y", F, None)])
    with pytest.raises(onnxtrain.Error, match=r"\[ConcatFromSequence\] node 'the_cat': cannot concatenate an empty"):
        session(cat).run(None, {"s": []})
    with pytest.raises(onnxtrain.Error, match=r"\[ConcatFromSequence\] node 'the_cat': input 1 has shape \[3, 3\], which"):
        session(cat).run(None, {"s": [np.ones((2, 2), np.float32), np.ones((3, 3), np.float32)]})
    get = model([helper.make_node("OptionalGetElement", ["o"], ["y"], name="the_get")], [optional_sequence("o")],
                [sequence("y")], opset=18)
    with pytest.raises(onnxtrain.Error, match=r"\[OptionalGetElement\] node 'the_get': the optional input is empty"):
        session(get).run(None, {"o": None})
    ins = model([helper.make_node("SequenceInsert", ["s", "t"], ["y"], name="the_insert")],
                [sequence("s"), tensor("t", I64, None)], [sequence("y")])
    with pytest.raises(onnxtrain.Error, match=r"\[SequenceInsert\] node 'the_insert': the inserted tensor has dtype int64"):
        session(ins).run(None, {"s": [np.ones(1, np.float32)], "t": np.ones(1, np.int64)})
