"""InferenceSession: the ONNX Runtime-style API and its errors on bad input."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain


def add_relu_model(shape=(2, 3), opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [shape[-1]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["t"], name="add"),
         helper.make_node("Relu", ["t"], ["y"], name="relu")], "g", [x, b], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds(shape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(shape).astype(np.float32),
            "b": rng.standard_normal(shape[-1]).astype(np.float32)}


def test_run_matches_numpy_from_path_bytes_and_proto(tmp_path):
    model = add_relu_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    f = feeds()
    expected = np.maximum(f["x"] + f["b"], 0)
    for source in (str(path), path, model.SerializeToString(), model):
        sess = onnxtrain.InferenceSession(source)
        (y,) = sess.run(None, f)
        np.testing.assert_allclose(y, expected, rtol=0, atol=0)
        assert sess.run(["y"], f)[0].shape == (2, 3)


def test_io_metadata():
    sess = onnxtrain.InferenceSession(add_relu_model())
    ins = sess.get_inputs()
    assert [i.name for i in ins] == ["x", "b"]
    assert ins[0].shape == [2, 3] and ins[0].type == "tensor(float)"
    assert [o.name for o in sess.get_outputs()] == ["y"]


def test_symbolic_dims_are_reported_and_accept_any_size():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    sess = onnxtrain.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert sess.get_inputs()[0].shape == ["batch", 4]
    for n in (1, 7, 3):
        out = sess.run(None, {"x": -np.ones((n, 4), np.float32)})[0]
        assert out.shape == (n, 4) and out.max() == 0


def test_outputs_survive_later_runs():
    sess = onnxtrain.InferenceSession(add_relu_model())
    first = sess.run(None, feeds(seed=1))[0]
    kept = first.copy()
    for seed in range(2, 5):
        sess.run(None, feeds(seed=seed))
    np.testing.assert_array_equal(first, kept)


def test_non_contiguous_inputs_are_accepted():
    sess = onnxtrain.InferenceSession(add_relu_model(shape=(3, 2)))
    x = np.arange(6, dtype=np.float32).reshape(2, 3).T  # a transposed view
    b = np.zeros(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "b": b})[0], np.maximum(x, 0))


def test_memory_report_shows_planning():
    sess = onnxtrain.InferenceSession(add_relu_model(shape=(64, 64)))
    sess.run(None, feeds((64, 64)))
    sess.run(None, feeds((64, 64)))
    report = sess.memory_report()
    assert "0 allocations in the last run" in report, report


# ---- bad input: a clear error naming model, node and op; never a crash -----------------------

def test_garbage_and_truncated_model_files(tmp_path):
    with pytest.raises(onnxtrain.InvalidModel, match="cannot parse"):
        onnxtrain.InferenceSession(b"\x08\x07garbage\xff\xff")
    model = add_relu_model()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1024, np.float32), "w"))
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(onnxtrain.InvalidModel, match="cut.onnx"):
        onnxtrain.InferenceSession(str(path))
    with pytest.raises(onnxtrain.InvalidArgument, match="cannot open"):
        onnxtrain.InferenceSession(str(tmp_path / "missing.onnx"))


def test_initializer_with_wrong_byte_count():
    model = add_relu_model()
    bad = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    bad.raw_data = bad.raw_data[:-2]
    model.graph.initializer.append(bad)
    with pytest.raises(onnxtrain.InvalidModel, match="initializer 'w'.*raw data holds 14 bytes"):
        onnxtrain.InferenceSession(model)


def test_unknown_op_names_op_and_node():
    model = add_relu_model()
    model.graph.node[1].op_type = "FancyRelu"
    with pytest.raises(onnxtrain.NotImplemented, match=r"\[FancyRelu\] node 'relu'.*unknown op"):
        onnxtrain.InferenceSession(model)


def test_undefined_input_is_reported():
    model = add_relu_model()
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(onnxtrain.InvalidModel, match=r"\[Relu\] node 'relu'.*'nowhere'"):
        onnxtrain.InferenceSession(model)


def test_missing_extra_and_mistyped_feeds():
    sess = onnxtrain.InferenceSession(add_relu_model())
    f = feeds()
    with pytest.raises(onnxtrain.InvalidArgument, match="input 'b' is missing"):
        sess.run(None, {"x": f["x"]})
    with pytest.raises(onnxtrain.InvalidArgument, match="feed 'z' is not an input"):
        sess.run(None, {**f, "z": f["b"]})
    with pytest.raises(onnxtrain.InvalidArgument, match="input 'x' should be float32, got float64"):
        sess.run(None, {**f, "x": f["x"].astype(np.float64)})
    with pytest.raises(onnxtrain.InvalidArgument, match="input 'x' should have rank 2"):
        sess.run(None, {**f, "x": f["x"].reshape(-1)})
    with pytest.raises(onnxtrain.InvalidArgument, match=r"input 'x' should have shape \[2, 3\]"):
        sess.run(None, {**f, "x": np.zeros((2, 4), np.float32)})
    with pytest.raises(onnxtrain.InvalidArgument, match="not an output"):
        sess.run(["nope"], f)
    # The session still works after every error.
    np.testing.assert_allclose(sess.run(None, f)[0], np.maximum(f["x"] + f["b"], 0))


def test_kernel_error_names_node():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, None)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, None)
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"], name="adder")], "g", [a, b], [c])
    sess = onnxtrain.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert sess.run(None, {"a": np.ones(3, np.float32), "b": np.ones(1, np.float32)})[0].tolist() == [2, 2, 2]
    with pytest.raises(onnxtrain.InvalidArgument,
                       match=r"\[Add\] node 'adder': shapes \[2, 3\] and \[4\] cannot be broadcast"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)})


@pytest.mark.parametrize("op", ["GatherElements", "ScatterElements"])
def test_elements_indices_are_checked_against_the_data(op):
    """Indices of another rank, or larger than the data outside the axis: an error naming the node."""
    ins = ["data", "idx"] + (["upd"] if op == "ScatterElements" else [])
    graph = helper.make_graph(
        [helper.make_node(op, ins, ["y"], name="picker", axis=1)], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("idx", TensorProto.INT64, None)]
        + ([helper.make_tensor_value_info("upd", TensorProto.FLOAT, None)] if op == "ScatterElements" else []),
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess = onnxtrain.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    data = np.arange(6, dtype=np.float32).reshape(2, 3)

    def run(idx):
        f = {"data": data, "idx": idx}
        if op == "ScatterElements":
            f["upd"] = np.ones(idx.shape, np.float32)
        return sess.run(None, f)[0]

    assert run(np.array([[2], [0]])).shape == ((2, 1) if op == "GatherElements" else (2, 3))
    with pytest.raises(onnxtrain.Error, match=rf"\[{op}\] node 'picker': indices \[2\] should have the rank of data \[2, 3\]"):
        run(np.array([0, 1]))
    with pytest.raises(onnxtrain.Error, match=rf"\[{op}\] node 'picker': indices \[3, 1\] exceed data \[2, 3\] in dim 0"):
        run(np.zeros((3, 1), np.int64))


@pytest.mark.parametrize("x_shape,y_shape", [((3, 50), (3, 50)), ((3, 50), ()), ((), (3, 50)), ((50,), (3, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_where_paths_match_numpy(x_shape, y_shape, dtype):
    # Same shapes and one scalar side have fast loops; the rest broadcasts. Planned runs (the
    # second) compute the output in place over a dying input.
    elem = onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[np.dtype(dtype)]
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Where", ["c", "nx", "y"], ["w"]),
         helper.make_node("Neg", ["w"], ["out"])], "where",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [3, 50]),
         helper.make_tensor_value_info("x", elem, list(x_shape)),
         helper.make_tensor_value_info("y", elem, list(y_shape))],
        [helper.make_tensor_value_info("out", elem, None)])
    sess = onnxtrain.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    rng = np.random.default_rng(0)
    for _ in range(2):
        c = rng.random((3, 50)) > 0.5
        x = rng.integers(1, 9, x_shape).astype(dtype)
        y = rng.integers(1, 9, y_shape).astype(dtype)
        np.testing.assert_array_equal(sess.run(None, {"c": c, "x": x, "y": y})[0], -np.where(c, -x, y))


def test_profiler_times_every_node_per_run():
    model = _mlp_like_model()
    opts = onnxtrain.SessionOptions()
    opts.enable_profiling = True
    sess = onnxtrain.InferenceSession(model.SerializeToString(), opts)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    rows = sess.profile()
    assert [r["op_type"] for r in rows] == [n.op_type for n in onnx.load_from_string(
        onnxtrain._C.optimize_model(model.SerializeToString())).graph.node]
    assert all(r["calls"] == 3 and r["total_us"] > 0 for r in rows)
    report = sess.profile_report()
    assert "FusedMatMul" in report and "3 run(s)" in report
    plain = onnxtrain.InferenceSession(model.SerializeToString())
    plain.run(None, {"x": x})
    assert plain.profile() == [] and "profiling is off" in plain.profile_report()


def _mlp_like_model():
    """x @ W1 + b1 -> Relu -> x @ W2^T (Gemm, transB) with constant weights."""
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((5, 16)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constant_weights_packed_once_stay_correct_across_runs_and_shapes():
    # MatMul/Gemm pack a constant B into oneDNN's layout on the first run and reuse it.
    model = _mlp_like_model()
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    sess = onnxtrain.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(2)
    for batch in (4, 4, 7, 4):
        x = rng.standard_normal((batch, 8)).astype(np.float32)
        want = np.maximum(x @ inits["w1"] + inits["b1"], 0) @ inits["w2"].T
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
