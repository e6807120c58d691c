"""If, Loop and Scan: subgraphs reading outer-scope values, nesting, a loop exported by PyTorch's
scripting exporter, constant-condition If inlined, and bad models failing with the node's name."""
import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import onnxtrain
from onnxtrain import _C

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def run(data, feeds, check=True):
    options = onnxtrain.SessionOptions()
    options.check_shape_rules = check
    return onnxtrain.InferenceSession(data, options).run(None, feeds)


def branch(name, nodes, outputs, inits=()):
    return helper.make_graph(nodes, name, [], outputs, list(inits))


def if_model():
    """y = If(sum(x) > 0, then: x * w (w outer initializer), else: x - 1 (inner constant))."""
    then_g = branch("then", [helper.make_node("Mul", ["x", "w"], ["t"])], [vi("t", F, [3])])
    else_g = branch("else", [helper.make_node("Sub", ["x", "one"], ["e"])], [vi("e", F, [3])],
                    [numpy_helper.from_array(np.array(1, np.float32), "one")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.float32))),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then_g, else_branch=else_g)]
    w = numpy_helper.from_array(np.array([2, 3, 4], np.float32), "w")
    return model(nodes, [vi("x", F, [3])], [vi("y", F, [3])], [w])


def test_if_takes_the_branch_the_condition_names_and_reads_outer_values():
    data = if_model()
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run(data, {"x": x})[0], x * [2, 3, 4])
    np.testing.assert_array_equal(run(data, {"x": -x})[0], -x - 1)


def loop_model(with_cond):
    """Loop M times (and while cond): acc = acc + x * i; each iteration also emits acc (scan output).
    The body reads x from the outer scope and holds a nested If reading the outer `limit`."""
    inner_then = branch("keep", [helper.make_node("Identity", ["acc_new"], ["k"])], [vi("k", F, None)])
    inner_else = branch("clip", [helper.make_node("Min", ["acc_new", "limit"], ["m"])], [vi("m", F, None)])
    body_nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc_in", "xi"], ["acc_new"]),
        helper.make_node("Less", ["fi", "three"], ["small"]),
        helper.make_node("If", ["small"], ["acc_out"], name="inner_if", then_branch=inner_then,
                         else_branch=inner_else),
        helper.make_node("Identity", ["acc_out"], ["scan"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    body = helper.make_graph(body_nodes, "body", [vi("i", I64, []), vi("cond_in", BOOL, []), vi("acc_in", F, None)],
                             [vi("cond_out", BOOL, []), vi("acc_out", F, None), vi("scan", F, [2])],
                             [numpy_helper.from_array(np.array(3, np.float32), "three")])
    inputs = ["M", "cond" if with_cond else "", "acc0"]
    nodes = [helper.make_node("Loop", inputs, ["acc", "history"], name="the_loop", body=body)]
    ins = [vi("M", I64, []), vi("acc0", F, [2]), vi("x", F, [2]), vi("limit", F, [2])]
    if with_cond:
        ins.append(vi("cond", BOOL, []))
    return model(nodes, ins, [vi("acc", F, [2]), vi("history", F, None)])


def loop_reference(m, acc, x, limit):
    history = []
    for i in range(m):
        acc = acc + x * i
        if not i < 3:
            acc = np.minimum(acc, limit)
        history.append(acc)
    return acc, np.array(history, np.float32).reshape(len(history), 2)


@pytest.mark.parametrize("trips", [0, 1, 5])
def test_loop_with_nested_if_reading_outer_values(trips):
    data = loop_model(with_cond=False)
    acc0, x, limit = np.array([1, -1], np.float32), np.array([0.5, 2], np.float32), np.array([2, 3], np.float32)
    feeds = {"M": np.array(trips, np.int64), "acc0": acc0, "x": x, "limit": limit}
    acc, history = run(data, feeds)
    want_acc, want_history = loop_reference(trips, acc0, x, limit)
    np.testing.assert_allclose(acc, want_acc)
    np.testing.assert_allclose(history, want_history)
    # The same session again (planned once per shape signature): same results.
    sess = onnxtrain.InferenceSession(data)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want_acc)


def test_loop_stops_when_the_condition_is_false():
    data = loop_model(with_cond=True)
    feeds = {"M": np.array(5, np.int64), "acc0": np.zeros(2, np.float32), "x": np.ones(2, np.float32),
             "limit": np.full(2, 100, np.float32), "cond": np.array(False)}
    acc, history = run(data, feeds)
    np.testing.assert_array_equal(acc, np.zeros(2))
    assert history.shape[0] == 0


def scan_model():
    """Cumulative sum along axis 1 of x [2, 4] (reverse), plus each step's slice scaled by outer s."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "xt"], ["sum_out"]), helper.make_node("Mul", ["sum_out", "s"], ["y"])],
        "body", [vi("sum_in", F, [2]), vi("xt", F, [2])], [vi("sum_out", F, [2]), vi("y", F, [2])])
    node = helper.make_node("Scan", ["init", "x"], ["final", "ys"], name="the_scan", body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[-1])
    return model([node], [vi("init", F, [2]), vi("x", F, [2, 4]), vi("s", F, [])],
                 [vi("final", F, [2]), vi("ys", F, [2, 4])])


def test_scan_reverse_along_an_axis_with_outer_reads():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    final, ys = run(scan_model(), {"init": np.zeros(2, np.float32), "x": x, "s": np.array(2, np.float32)})
    steps = np.cumsum(x[:, ::-1], axis=1)  # iteration t reads column 3 - t
    np.testing.assert_allclose(final, steps[:, -1])
    np.testing.assert_allclose(ys, 2 * steps)


class ScriptedGRU(nn.Module):
    """A GRU written as a Python loop; torch.jit.script exports it as an ONNX Loop whose body reads
    the outer x and the weights by name."""

    def __init__(self):
        super().__init__()
        self.wi = nn.Linear(4, 15)
        self.wh = nn.Linear(5, 15)

    def forward(self, x, h):
        for t in range(x.size(0)):
            gi = self.wi(x[t])
            gh = self.wh(h)
            ir, iz, i_n = gi.chunk(3, 1)
            hr, hz, hn = gh.chunk(3, 1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            n = torch.tanh(i_n + r * hn)
            h = (1 - z) * n + z * h
        return h


def test_pytorch_scripted_loop_matches_torch():
    torch.manual_seed(0)
    m = torch.jit.script(ScriptedGRU())
    x, h = torch.randn(3, 2, 4), torch.randn(2, 5)
    f = io.BytesIO()
    torch.onnx.export(m, (x, h), f, input_names=["x", "h"], output_names=["y"], opset_version=13,
                      dynamic_axes={"x": {0: "T"}})
    assert "Loop" in [n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node]
    sess = onnxtrain.InferenceSession(f.getvalue())
    for steps in (3, 6):
        x = torch.randn(steps, 2, 4)
        with torch.no_grad():
            want = m(x, h).numpy()
        np.testing.assert_allclose(sess.run(None, {"x": x.numpy(), "h": h.numpy()})[0], want, rtol=1e-5, atol=1e-6)


def test_gradients_through_the_scripted_loop_match_torch_autograd():
    from onnxtrain import autodiff
    torch.manual_seed(1)
    module = ScriptedGRU()
    scripted = torch.jit.script(module)
    x, h = torch.randn(4, 2, 4), torch.randn(2, 5)
    f = io.BytesIO()
    torch.onnx.export(scripted, (x, h), f, input_names=["x", "h"], output_names=["y"], opset_version=13,
                      dynamic_axes={"x": {0: "T"}}, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)
    params = [n for n, _ in module.named_parameters()]
    wrt = params + ["x", "h"]
    grad_model = autodiff.build_gradient_graph(f.getvalue(), wrt, ["y"])
    sess = onnxtrain.InferenceSession(grad_model)
    for steps in (4, 1):
        xs = torch.randn(steps, 2, 4, requires_grad=True)
        hs = h.clone().requires_grad_(True)
        seed = torch.randn(2, 5)
        module.zero_grad()
        scripted(xs, hs).backward(seed)
        want = [p.grad for p in module.parameters()] + [xs.grad, hs.grad]
        got = sess.run([f"{n}_grad" for n in wrt], {"x": xs.detach().numpy(), "h": h.numpy(), "y_grad": seed.numpy()})
        for name, g, w in zip(wrt, got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{name}, {steps} steps")


def test_if_with_a_constant_condition_is_inlined():
    # The branch not taken holds an op nothing implements: loading works only if the If was inlined.
    then_g = branch("then", [helper.make_node("Mul", ["x", "x"], ["t"])], [vi("t", F, [2])])
    else_g = branch("else", [helper.make_node("NoSuchOp", ["x"], ["e"])], [vi("e", F, [2])])
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("If", ["c"], ["y"], name="const_if", then_branch=then_g, else_branch=else_g)]
    data = model(nodes, [vi("x", F, [2])], [vi("y", F, [2])])
    np.testing.assert_array_equal(run(data, {"x": np.array([3, 4], np.float32)})[0], [9, 16])


def test_inference_folds_constants_inside_branches_and_loop_bodies():
    """A branch whose weight is a Constant node sliced every call (spox's Silero VAD) gets the
    slice as an initializer of the branch; what reads the outer scope or a loop's carried values
    stays; the outputs are the unfolded model's."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    then_g = branch("then", [
        helper.make_node("Constant", [], ["w_full"], value=numpy_helper.from_array(w)),
        helper.make_node("Slice", ["w_full", "starts", "ends", "axes"], ["w_cols"]),  # columns 1..2 of w
        helper.make_node("MatMul", ["x", "w_cols"], ["t"])], [vi("t", F, [2, 2])],
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
         [("starts", [1]), ("ends", [3]), ("axes", [1])]])
    else_g = branch("else", [helper.make_node("Slice", ["x", "zero", "two", "one"], ["x2"]),  # reads the outer x: stays
                             helper.make_node("Mul", ["x2", "zero_f"], ["x0"]),
                             helper.make_node("Add", ["x0", "five"], ["e"])], [vi("e", F, [2, 2])],
                    [numpy_helper.from_array(np.array(v, t), n) for n, v, t in
                     [("zero", [0], np.int64), ("two", [2], np.int64), ("one", [1], np.int64),
                      ("zero_f", 0, np.float32), ("five", 5, np.float32)]])
    body = helper.make_graph([
        helper.make_node("Constant", [], ["step"], value=numpy_helper.from_array(np.array([[1.5]], np.float32))),
        helper.make_node("Mul", ["step", "two_f"], ["inc"]),  # constant in the body: folds
        helper.make_node("Add", ["acc_in", "inc"], ["acc_out"]),  # reads the carried value: stays
        helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", F, [2, 2])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", F, [2, 2])],
        [numpy_helper.from_array(np.array(2, np.float32), "two_f")])
    nodes = [helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trips", "", "y"], ["z"], name="the_loop", body=body)]
    data = model(nodes, [vi("c", TensorProto.BOOL, []), vi("x", F, [2, 3]), vi("trips", TensorProto.INT64, [])],
                 [vi("z", F, [2, 2])])

    optimized = onnx.load_from_string(_C.optimize_model(data))
    subgraphs = {a.name: a.g for n in optimized.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH}
    assert [n.op_type for n in subgraphs["then_branch"].node] == ["MatMul"]
    (w_cols,) = [t for t in subgraphs["then_branch"].initializer if t.name == "w_cols"]
    np.testing.assert_array_equal(numpy_helper.to_array(w_cols), w[:, 1:3])
    assert [n.op_type for n in subgraphs["else_branch"].node] == ["Slice", "Mul", "Add"]
    assert sorted(n.op_type for n in subgraphs["body"].node) == ["Add", "Identity"]
    np.testing.assert_array_equal(numpy_helper.to_array(
        next(t for t in subgraphs["body"].initializer if t.name == "inc")), [[3.0]])

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    options = onnxtrain.SessionOptions()
    options.optimize = False
    for cond in (True, False):
        feeds = {"c": np.array(cond), "x": x, "trips": np.array(3, np.int64)}
        (folded,) = onnxtrain.InferenceSession(data).run(None, feeds)
        (plain,) = onnxtrain.InferenceSession(data, options).run(None, feeds)
        np.testing.assert_array_equal(folded, plain)
        np.testing.assert_array_equal(folded, (x @ w[:, 1:3] if cond else np.full((2, 2), 5, np.float32)) + 9.0)


def test_bad_control_flow_models_name_the_node():
    # A subgraph reading a value nothing defines.
    then_g = branch("then", [helper.make_node("Mul", ["x", "ghost"], ["t"])], [vi("t", F, [2])])
    else_g = branch("else", [helper.make_node("Neg", ["x"], ["e"])], [vi("e", F, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="bad_if", then_branch=then_g, else_branch=else_g)]
    data = model(nodes, [vi("c", BOOL, []), vi("x", F, [2])], [vi("y", F, [2])])
    with pytest.raises(onnxtrain.Error, match=r"\[If\] node 'bad_if'.*'ghost'"):
        onnxtrain.InferenceSession(data)
    # Branches that disagree in their output count, or dtype.
    two = branch("else", [helper.make_node("Neg", ["x"], ["e"]), helper.make_node("Abs", ["x"], ["a"])],
                 [vi("e", F, [2]), vi("a", F, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="count_if", then_branch=else_g, else_branch=two)]
    data = model(nodes, [vi("c", BOOL, []), vi("x", F, [2])], [vi("y", F, [2])])
    with pytest.raises(onnxtrain.Error, match=r"\[If\] node 'count_if'.*give 1 and 2"):
        onnxtrain.InferenceSession(data).run(None, {"c": np.array(True), "x": np.ones(2, np.float32)})
    ints = branch("else", [helper.make_node("Shape", ["x"], ["e"])], [vi("e", I64, [1])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="type_if", then_branch=then_g, else_branch=ints)]
    data = model(nodes, [vi("c", BOOL, []), vi("x", F, [2]), vi("ghost", F, [2])], [vi("y", F, [2])])
    with pytest.raises(onnxtrain.Error, match=r"\[If\] node 'type_if'.*float32 in then_branch but int64"):
        onnxtrain.InferenceSession(data).run(None, {"c": np.array(True), "x": np.ones(2, np.float32),
                                                    "ghost": np.ones(2, np.float32)})
    # A loop with neither a trip count nor a condition.
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Identity", ["v_in"], ["v_out"])], "body",
                             [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, [2])],
                             [vi("c_out", BOOL, []), vi("v_out", F, [2])])
    nodes = [helper.make_node("Loop", ["", "", "x"], ["y"], name="endless", body=body)]
    data = model(nodes, [vi("x", F, [2])], [vi("y", F, [2])])
    with pytest.raises(onnxtrain.Error, match=r"\[Loop\] node 'endless'.*neither a trip count"):
        onnxtrain.InferenceSession(data).run(None, {"x": np.ones(2, np.float32)})


def test_training_through_if(tmp_path):
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer
    # w is read only inside the then-branch: its gradient still flows (no silent zero).
    paths = artifacts.generate_artifacts(if_model(), requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                         optimizer=artifacts.SGD(lr=0.05), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    x, t = np.array([1, 2, 3], np.float32), np.array([1, 1, 1], np.float32)
    losses = []
    for _ in range(3):
        losses.append(float(module(x, t)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[2] < losses[1] < losses[0]
    np.testing.assert_allclose(losses[0], np.mean((x * [2, 3, 4] - t) ** 2), rtol=1e-6)


def test_scan8_scans_each_batch_entry_over_its_own_length():
    body = helper.make_graph([helper.make_node("Add", ["acc", "xt"], ["acc_out"]),
                              helper.make_node("Identity", ["acc_out"], ["y"])], "body",
                             [vi("acc", F, [2]), vi("xt", F, [2])], [vi("acc_out", F, [2]), vi("y", F, [2])])
    node = helper.make_node("Scan", ["lens", "init", "x"], ["final", "ys"], name="scan8", body=body,
                            num_scan_inputs=1, directions=[1])
    data = model([node], [vi("lens", I64, [2]), vi("init", F, [2, 2]), vi("x", F, [2, 3, 2])],
                 [vi("final", F, [2, 2]), vi("ys", F, [2, 3, 2])], opset=8)
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    final, ys = run(data, {"lens": np.array([3, 2], np.int64), "init": np.zeros((2, 2), np.float32), "x": x})
    want = np.zeros((2, 3, 2), np.float32)
    want[0] = np.cumsum(x[0, ::-1], axis=0)          # reversed over all 3 steps
    want[1, :2] = np.cumsum(x[1, 1::-1], axis=0)     # reversed over its 2 steps, then zero padding
    np.testing.assert_array_equal(ys, want)
    np.testing.assert_array_equal(final, [want[0, 2], want[1, 1]])
