"""Fusion passes: the rewritten graph computes what the original computes, and the fusion fires."""
import io
import math

import numpy as np
import onnx
import pytest
import torch

import onnxtrain
from onnxtrain import _C


def export(module, *args):
    f = io.BytesIO()
    torch.onnx.export(module, args, f, opset_version=17, input_names=[f"in{i}" for i in range(len(args))],
                      output_names=["out"])
    return f.getvalue()


def op_types(model_bytes):
    return [n.op_type for n in onnx.load_from_string(model_bytes).graph.node]


def test_erf_gelu_pattern_becomes_one_node_and_matches_torch():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16) * 3
    data = export(module, x)
    assert "Erf" in op_types(data)
    optimized = op_types(_C.optimize_model(data))
    assert "Gelu" in optimized and "Erf" not in optimized, optimized
    (y,) = onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_gelu_fusion_leaves_shared_intermediates_alone():
    # x / sqrt(2) is also an output: fusing would lose it.
    class TwoOutputs(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x), x / 1.4142135623730951

    data = export(TwoOutputs(), torch.randn(3, 5))
    optimized = op_types(_C.optimize_model(data))
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    outs = onnxtrain.InferenceSession(data).run(None, {"in0": x})
    ref = TwoOutputs()(torch.from_numpy(x))
    for got, want in zip(outs, ref):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    assert optimized.count("Div") >= 1


def test_linear_on_3d_input_becomes_fused_matmul_with_bias():
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(), torch.nn.Linear(12, 4)).eval()
    x = torch.randn(2, 5, 8)
    data = export(module, x)

    class KT(torch.nn.Module):  # q @ k^T: the Transpose folds into transB
        def forward(self, q, k):
            return torch.matmul(q, k.transpose(-1, -2))

    qk = export(KT(), torch.randn(2, 3, 4, 6), torch.randn(2, 3, 5, 6))
    for model, args in ((data, (x,)), (qk, (torch.randn(2, 3, 4, 6), torch.randn(2, 3, 5, 6)))):
        optimized = op_types(_C.optimize_model(model))
        assert "FusedMatMul" in optimized and "MatMul" not in optimized and "Transpose" not in optimized, optimized
    (y,) = onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    q, k = torch.randn(2, 3, 4, 6), torch.randn(2, 3, 5, 6)
    (s,) = onnxtrain.InferenceSession(qk).run(None, {"in0": q.numpy(), "in1": k.numpy()})
    np.testing.assert_allclose(s, KT()(q, k).numpy(), rtol=1e-5, atol=1e-5)


def _random_batchnorm(bn, generator):
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=generator)
        bn.bias.normal_(0, 0.5, generator=generator)
        bn.running_mean.normal_(0, 0.5, generator=generator)
        bn.running_var.uniform_(0.5, 2.0, generator=generator)


def _conv_bn_model(conv, bn, tail_nodes, conv_output_is_graph_output=False):
    """Conv -> BatchNormalization -> tail_nodes as ONNX, written by hand: torch's eval export
    folds the BatchNorm into the Conv itself, which would leave nothing for our pass to do."""
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(conv.weight.detach().numpy(), "W")]
    conv_inputs = ["x", "W"]
    if conv.bias is not None:
        inits.append(numpy_helper.from_array(conv.bias.detach().numpy(), "B"))
        conv_inputs.append("B")
    for name, t in [("scale", bn.weight), ("beta", bn.bias), ("mean", bn.running_mean), ("var", bn.running_var)]:
        inits.append(numpy_helper.from_array(t.detach().numpy(), name))
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], strides=list(conv.stride), pads=list(conv.padding) * 2,
                              kernel_shape=list(conv.kernel_size)),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["bn"], epsilon=bn.eps)]
    nodes += tail_nodes
    outputs = [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)]
    if conv_output_is_graph_output:
        outputs.append(helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _activation_node(name):
    from onnx import helper
    if name == "LeakyRelu":
        return [helper.make_node("LeakyRelu", ["bn"], ["out"], alpha=0.2)], torch.nn.LeakyReLU(0.2)
    if name == "Clip":
        lo = onnx.numpy_helper.from_array(np.array(-1.0, np.float32), "lo")
        hi = onnx.numpy_helper.from_array(np.array(2.0, np.float32), "hi")
        return ([helper.make_node("Constant", [], ["lo"], value=lo), helper.make_node("Constant", [], ["hi"], value=hi),
                 helper.make_node("Clip", ["bn", "lo", "hi"], ["out"])], torch.nn.Hardtanh(-1.0, 2.0))
    module = {"Relu": torch.nn.ReLU(), "Sigmoid": torch.nn.Sigmoid(), "Tanh": torch.nn.Tanh()}[name]
    return [helper.make_node(name, ["bn"], ["out"])], module


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip"])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_batchnorm_activation_fold_into_one_fused_conv(activation, bias):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=bias)
    bn = torch.nn.BatchNorm2d(8)
    _random_batchnorm(bn, g)
    nodes, act = _activation_node(activation)
    module = torch.nn.Sequential(conv, bn, act).eval()
    data = _conv_bn_model(conv, bn, nodes)
    optimized = onnx.load_from_string(_C.optimize_model(data))
    assert [n.op_type for n in optimized.graph.node] == ["FusedConv"], [n.op_type for n in optimized.graph.node]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["activation"] == activation.encode()
    x = torch.randn(2, 3, 9, 9, generator=g)
    (y,) = onnxtrain.InferenceSession(data).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_batchnorm_stays_when_the_conv_output_is_also_read_elsewhere():
    conv, bn = torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4)
    _random_batchnorm(bn, torch.Generator().manual_seed(0))
    data = _conv_bn_model(conv, bn, [onnx.helper.make_node("Relu", ["bn"], ["out"])], conv_output_is_graph_output=True)
    assert "BatchNormalization" in op_types(_C.optimize_model(data))
    x = torch.randn(1, 2, 6, 6)
    out, c = onnxtrain.InferenceSession(data).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(c, conv(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out, torch.relu(bn.eval()(conv(x))).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_training_graphs_keep_conv_and_activation_separate():
    # FusedConv has no gradient: autodiff must see Conv and Relu (fuse_for_training leaves them).
    from onnxtrain.autodiff import build_gradient_graph
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU())
    x = torch.randn(1, 2, 5, 5)
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, input_names=["x"], output_names=["y"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    grad = onnx.load_from_string(build_gradient_graph(f.getvalue(), ["0.weight"], ["y"]))
    ops = [n.op_type for n in grad.graph.node]
    assert "Conv" in ops and "ReluGrad" in ops and "FusedConv" not in ops, ops


def _channels_last_attrs(model_bytes):
    """[(op type, input_channels_last, output_channels_last)] of the optimized graph's nodes."""
    out = []
    for n in onnx.load_from_string(_C.optimize_model(model_bytes)).graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        out.append((n.op_type, attrs.get("input_channels_last", 0), attrs.get("output_channels_last", 0)))
    return out


class _ConvStack(torch.nn.Module):
    """conv-bn-relu x3 (channels 3 -> 16 -> 20 -> 32, the middle not a multiple of 16), optionally
    also returning the first block's output or feeding it to a second reader."""

    def __init__(self, tap=None):
        super().__init__()
        widths = [3, 16, 20, 32]
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(a, b, 3, stride=1 + (i > 0), padding=1), torch.nn.BatchNorm2d(b),
                                torch.nn.ReLU()) for i, (a, b) in enumerate(zip(widths, widths[1:])))
        self.tap = tap
        g = torch.Generator().manual_seed(0)
        for block in self.blocks:
            _random_batchnorm(block[1], g)

    def forward(self, x):
        first = self.blocks[0](x)
        y = self.blocks[2](self.blocks[1](first))
        if self.tap == "output":
            return y, first
        if self.tap == "reader":
            return y + first.mean()
        return y


def test_fused_conv_chain_keeps_channels_last_between_convs_and_matches_torch():
    module = _ConvStack().eval()
    x = torch.randn(2, 3, 12, 12)
    data = export(module, x)
    assert _channels_last_attrs(data) == [("FusedConv", 0, 1), ("FusedConv", 1, 1), ("FusedConv", 1, 0)]
    (y,) = onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tap", ["output", "reader"])
def test_fused_conv_output_read_elsewhere_stays_in_onnx_layout(tap):
    module = _ConvStack(tap).eval()
    x = torch.randn(2, 3, 12, 12)
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, opset_version=17, input_names=["in0"])
    data = f.getvalue()
    fused = [a for a in _channels_last_attrs(data) if a[0] == "FusedConv"]
    assert fused == [("FusedConv", 0, 0), ("FusedConv", 0, 1), ("FusedConv", 1, 0)], fused
    outputs = onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})
    expected = module(x)
    for got, want in zip(outputs, expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_channels_last_fused_conv_rejects_float64():
    x, w = np.ones((1, 2, 4, 4)), np.ones((3, 2, 3, 3))
    node = onnx.helper.make_node("FusedConv", ["x", "w"], ["y"], domain="onnxtrain", activation="Relu",
                                 input_channels_last=1)
    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.DOUBLE, a.shape)
                                                 for n, a in (("x", x), ("w", w))],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("onnxtrain", 1)])
    with pytest.raises(Exception, match="input_channels_last / output_channels_last need fp32"):
        onnxtrain.InferenceSession(model.SerializeToString()).run(None, {"x": x, "w": w})


def _unoptimized_and_optimized(data, feeds):
    """Outputs of the model as written (no passes) and as the inference pipeline rewrites it."""
    plain = onnxtrain.SessionOptions()
    plain.optimize = False
    return (onnxtrain.InferenceSession(data, plain).run(None, feeds), onnxtrain.InferenceSession(data).run(None, feeds))


class _ResidualWithSqueeze(torch.nn.Module):
    """A residual block (conv-bn-relu, conv-bn, + identity, relu, max(., leaky), * 0.5) read by two
    convolutions: one feeding a squeeze-excitation branch (ReduceMean, 1x1 convs, sigmoid), one
    whose output is multiplied by that branch's per-channel vector [N, C, 1, 1], then a last conv.
    The residual values may stay channels last; what ReduceMean and the broadcast multiply read
    may not."""

    def __init__(self, c=20):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.to_squeeze, self.to_scale = torch.nn.Conv2d(c, c, 1), torch.nn.Conv2d(c, c, 3, padding=1)
        self.squeeze, self.excite = torch.nn.Conv2d(c, 4, 1), torch.nn.Conv2d(4, c, 1)
        self.head = torch.nn.Conv2d(c, 6, 3)
        for bn in (self.bn1, self.bn2):
            _random_batchnorm(bn, g)

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)
        y = torch.maximum(y, torch.nn.functional.leaky_relu(y, 0.1)) * 0.5
        pooled = self.to_squeeze(y).mean((2, 3), keepdim=True)
        scale = torch.sigmoid(self.excite(torch.relu(self.squeeze(pooled))))
        return self.head(self.to_scale(y) * scale)


def test_residual_and_elementwise_values_stay_channels_last_and_match_the_unoptimized_graph():
    module = _ResidualWithSqueeze().eval()
    x = torch.randn(2, 3, 11, 13)
    data = export(module, x)
    layouts = _channels_last_attrs(data)
    convs = sorted((i, o) for op, i, o in layouts if op in ("FusedConv", "Conv"))
    # stem writes channels last, conv1 and conv2 read and write it (the Add, Relu, Max, LeakyRelu
    # and Mul between them need nothing), to_squeeze and to_scale read it and write ONNX order
    # (ReduceMean and the broadcast multiply read their outputs); squeeze -> excite pass their
    # [N, 4, 1, 1] value channels last too; the head reads the broadcast product: ONNX order.
    assert convs == [(0, 0)] + [(0, 1)] * 2 + [(1, 0)] * 3 + [(1, 1)] * 2, layouts
    plain, optimized = _unoptimized_and_optimized(data, {"in0": x.numpy()})
    np.testing.assert_allclose(optimized[0], plain[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(optimized[0], module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_broadcast_operand_keeps_its_elementwise_partner_in_onnx_order():
    # conv(x) + conv(pool(x)) where the second is [N, C, 1, 1]: were the first kept channels last,
    # the broadcast Add would pair the wrong elements.
    class Broadcast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Conv2d(3, 16, 3), torch.nn.Conv2d(3, 16, 1), torch.nn.Conv2d(16, 4, 1)

        def forward(self, x):
            return self.c(torch.relu(self.a(x) + self.b(torch.nn.functional.adaptive_avg_pool2d(x, 1))))

    module = Broadcast().eval()
    x = torch.randn(1, 3, 9, 9)
    data = export(module, x)
    assert all(i == 0 and o == 0 for _, i, o in _channels_last_attrs(data)), _channels_last_attrs(data)
    plain, optimized = _unoptimized_and_optimized(data, {"in0": x.numpy()})
    np.testing.assert_allclose(optimized[0], plain[0], rtol=1e-5, atol=1e-6)


def _conv_then(tail, opset=13, bias=True, seed=0):
    """x -> Conv(3 -> 8, 3x3, pad 1) -> y, then `tail` (nodes reading y and writing out), by hand;
    scalar constants as Constant nodes: [(name, value)]."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, constants = tail
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B"))
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(np.array(v, np.float32), n))
              for n, v in constants]
    conv = helper.make_node("Conv", ["x", "W", "B"] if bias else ["x", "W"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(consts + [conv] + nodes, "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 7, 6])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _check_against_unoptimized(data, rtol=1e-5, atol=1e-5):
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32) * 2
    plain, optimized = _unoptimized_and_optimized(data, {"x": x})
    np.testing.assert_allclose(optimized[0], plain[0], rtol=rtol, atol=atol)
    return plain[0]


@pytest.mark.parametrize("bias", [True, False])
def test_scalar_affine_after_conv_folds_into_its_weights_and_bias(bias):
    from onnx import helper
    nodes = [helper.make_node("Mul", ["s", "y"], ["a"]), helper.make_node("Add", ["a", "t"], ["b"]),
             helper.make_node("Div", ["b", "d"], ["c"]), helper.make_node("Sub", ["c", "u"], ["out"])]
    data = _conv_then((nodes, [("s", -1.7), ("t", 0.4), ("d", 3.0), ("u", 0.25)]), bias=bias)
    assert [op for op, _, _ in _channels_last_attrs(data)] == ["Conv"], _channels_last_attrs(data)
    _check_against_unoptimized(data)


def test_scalar_affine_stays_where_folding_would_be_wrong():
    from onnx import helper
    # t - y (the conv on the right of Sub), d / y, and a conv output also read by a second node.
    for nodes in ([helper.make_node("Sub", ["t", "y"], ["out"])], [helper.make_node("Div", ["t", "y"], ["out"])],
                  [helper.make_node("Mul", ["y", "t"], ["m"]), helper.make_node("Add", ["m", "y"], ["out"])]):
        data = _conv_then((nodes, [("t", 2.5)]))
        assert len(_channels_last_attrs(data)) == len(nodes) + 1, _channels_last_attrs(data)
        _check_against_unoptimized(data)


def _hard_swish_tail(form):
    from onnx import helper
    if form == "hardsigmoid":
        return [helper.make_node("HardSigmoid", ["y"], ["h"], alpha=1 / 6, beta=0.5),
                helper.make_node("Mul", ["y", "h"], ["out"])], [], 13
    clip = (helper.make_node("Clip", ["a"], ["c"], min=0.0, max=6.0) if form == "clip_attrs" else
            helper.make_node("Clip", ["a", "lo", "hi"], ["c"]))
    last = (helper.make_node("Mul", ["p", "sixth"], ["out"]) if form == "times_sixth" else
            helper.make_node("Div", ["p", "six"], ["out"]))
    return ([helper.make_node("Add", ["y", "three"], ["a"]), clip, helper.make_node("Mul", ["c", "y"], ["p"]), last],
            [("three", 3.0), ("lo", 0.0), ("hi", 6.0), ("six", 6.0), ("sixth", 1 / 6)], 9 if form == "clip_attrs" else 13)


@pytest.mark.parametrize("form", ["clip_div", "clip_attrs", "times_sixth", "hardsigmoid"])
def test_written_out_hard_swish_after_conv_becomes_its_activation(form):
    nodes, constants, opset = _hard_swish_tail(form)
    data = _conv_then((nodes, constants), opset=opset)
    optimized = onnx.load_from_string(_C.optimize_model(data))
    assert [n.op_type for n in optimized.graph.node] == ["FusedConv"], [n.op_type for n in optimized.graph.node]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["activation"] == b"HardSwish"
    out = _check_against_unoptimized(data)
    assert (out < 0).any() and (out == 0).any() and (out > 3).any()  # all three pieces of hard-swish ran


def test_hard_swish_lookalikes_are_left_alone():
    from onnx import helper
    nodes, constants, _ = _hard_swish_tail("clip_div")
    wrong_bound = [n if n.op_type != "Clip" else helper.make_node("Clip", ["a", "lo", "five"], ["c"]) for n in nodes]
    wrong_divisor = nodes[:-1] + [helper.make_node("Div", ["p", "three"], ["out"])]
    for tail in (wrong_bound, wrong_divisor):
        data = _conv_then((tail, constants + [("five", 5.0)]))
        assert "HardSwish" not in str(onnx.load_from_string(_C.optimize_model(data)).graph.node)
        _check_against_unoptimized(data)


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("z_from", ["input", "later_conv"])
def test_residual_add_and_relu_fold_into_the_conv(relu, z_from):
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), n) for n in ("W", "V")]
    inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B"))
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])]
    if z_from == "later_conv":  # Z is computed after the conv: the fused node must move past it
        nodes.append(helper.make_node("Conv", ["x", "V"], ["z"], pads=[1, 1, 1, 1]))
    # The first operand that is a conv's output is folded in: y (before z) for the later conv.
    nodes.append(helper.make_node("Add", ["y", "z"] if z_from == "later_conv" else ["z", "y"], ["sum" if relu else "out"]))
    if relu:
        nodes.append(helper.make_node("Relu", ["sum"], ["out"]))
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 7, 6])]
    if z_from == "input":
        inputs.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, 8, 7, 6]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
                              inits)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    optimized = onnx.load_from_string(_C.optimize_model(data)).graph.node
    fused = [n for n in optimized if n.op_type == "FusedConv" and len(n.input) == 4]
    assert len(fused) == 1 and fused[0].input[3] == "z" and fused[0].output[0] == "out", optimized
    assert not any(n.op_type in ("Add", "Relu") for n in optimized), optimized
    feeds = {"x": rng.standard_normal((2, 3, 7, 6)).astype(np.float32)}
    if z_from == "input":
        feeds["z"] = rng.standard_normal((2, 8, 7, 6)).astype(np.float32) * 3
    plain = onnxtrain.SessionOptions()
    plain.optimize = False
    want = onnxtrain.InferenceSession(data, plain).run(None, feeds)[0]
    fed = {k: v.copy() for k, v in feeds.items()}
    sess = onnxtrain.InferenceSession(data)
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (want == 0).any() == relu  # the Relu was applied after the sum, not skipped
    for k, v in fed.items():  # a fed Z is summed from, never written (the conv sums in place only over its own values)
        np.testing.assert_array_equal(feeds[k], v)


def test_broadcast_summand_stays_an_add():
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "z"], ["out"])],
                              "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 6, 6]),
                                    helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 8, 1, 1])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], [w])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    assert "Add" in op_types(_C.optimize_model(data))
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "z": rng.standard_normal((1, 8, 1, 1)).astype(np.float32)}
    plain = onnxtrain.SessionOptions()
    plain.optimize = False
    np.testing.assert_allclose(onnxtrain.InferenceSession(data).run(None, feeds)[0],
                               onnxtrain.InferenceSession(data, plain).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


class _PooledConvs(torch.nn.Module):
    """conv-relu (3 -> 20 channels, not a multiple of 16), then `pool`, conv-relu, a residual Add
    around a 3x3 average pool (padded: its border windows count fewer taps), conv, global pool,
    linear head."""

    def __init__(self, pool, global_pool):
        super().__init__()
        self.stem, self.mid, self.last = (torch.nn.Conv2d(3, 20, 3, padding=1), torch.nn.Conv2d(20, 24, 3, padding=1),
                                          torch.nn.Conv2d(24, 24, 1))
        self.pool, self.global_pool = pool, global_pool
        self.smooth = torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.head = torch.nn.Linear(24, 5)

    def forward(self, x):
        y = torch.relu(self.mid(self.pool(torch.relu(self.stem(x)))))
        y = self.last(y + self.smooth(y))
        return self.head(torch.flatten(self.global_pool(y), 1))


def _pool_layouts(model_bytes):
    """[(op type, mode)] of the optimized graph's pools."""
    out = []
    for n in onnx.load_from_string(_C.optimize_model(model_bytes)).graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if "Pool" in n.op_type:
            out.append((n.op_type, attrs.get("mode", b"").decode()))
    return out


@pytest.mark.parametrize("pool, mode", [(torch.nn.MaxPool2d(2), "max"),
                                        (torch.nn.MaxPool2d(3, stride=2, padding=1), "max"),
                                        (torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), "average")])
@pytest.mark.parametrize("global_pool, global_mode", [(torch.nn.AdaptiveAvgPool2d(1), "global_average"),
                                                      (torch.nn.AdaptiveMaxPool2d(1), "max")])  # a window of all X
def test_pools_between_convs_run_channels_last_and_match_the_unoptimized_graph(pool, mode, global_pool, global_mode):
    module = _PooledConvs(pool, global_pool).eval()
    x = torch.randn(3, 3, 13, 11)
    data = export(module, x)
    assert _pool_layouts(data) == [("ChannelsLastPool", mode), ("ChannelsLastPool", "average"),
                                   ("ChannelsLastPool", global_mode)], _pool_layouts(data)
    convs = [(i, o) for op, i, o in _channels_last_attrs(data) if op == "FusedConv"]
    assert convs == [(0, 1), (1, 1), (1, 1)], convs  # no reorder between the stem and the global pool
    plain, optimized = _unoptimized_and_optimized(data, {"in0": x.numpy()})
    np.testing.assert_allclose(optimized[0], plain[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(optimized[0], module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d(3, stride=2, ceil_mode=True), torch.nn.MaxPool2d(2, return_indices=True)])
def test_pools_channels_last_cannot_express_stay_in_onnx_order(pool):
    # Ceil mode's last window may reach past the pads; Indices number elements in ONNX's order.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.pool = torch.nn.Conv2d(3, 16, 3), torch.nn.Conv2d(16, 8, 1), pool

        def forward(self, x):
            y = self.pool(torch.relu(self.a(x)))
            if isinstance(y, tuple):
                return self.b(y[0]), y[1]
            return self.b(y)

    module = Net().eval()
    x = torch.randn(2, 3, 12, 10)
    data = export(module, x)
    assert {op for op, _ in _pool_layouts(data)} == {"MaxPool"}, _pool_layouts(data)
    plain, optimized = _unoptimized_and_optimized(data, {"in0": x.numpy()})
    for p, o in zip(plain, optimized):
        np.testing.assert_allclose(o, p, rtol=1e-5, atol=1e-6)


def test_channels_last_pool_rejects_an_unknown_mode_and_float64():
    def model(mode, dtype):
        node = onnx.helper.make_node("ChannelsLastPool", ["x"], ["y"], domain="onnxtrain", mode=mode, kernel_shape=[2, 2])
        graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", dtype, [1, 2, 4, 4])],
                                       [onnx.helper.make_tensor_value_info("y", dtype, None)])
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                            onnx.helper.make_opsetid("onnxtrain", 1)]).SerializeToString()

    with pytest.raises(Exception, match="mode must be max, average, global_average or global_max"):
        onnxtrain.InferenceSession(model("median", onnx.TensorProto.FLOAT)).run(None, {"x": np.ones((1, 2, 4, 4), np.float32)})
    with pytest.raises(Exception, match="X must be float32"):
        onnxtrain.InferenceSession(model("max", onnx.TensorProto.DOUBLE)).run(None, {"x": np.ones((1, 2, 4, 4))})


@pytest.mark.parametrize("op, mode", [("GlobalMaxPool", "global_max"), ("GlobalAveragePool", "global_average")])
def test_global_pools_read_channels_last(op, mode):
    from onnx import helper
    data = _conv_then(([helper.make_node(op, ["y"], ["out"])], []))
    assert _pool_layouts(data) == [("ChannelsLastPool", mode)], _pool_layouts(data)
    assert _channels_last_attrs(data)[0] == ("FusedConv", 0, 1)
    _check_against_unoptimized(data)


def test_residual_block_on_2x2_planes_in_blocked_layout_matches_torch():
    # A ResNet's last stage: channels-last values between convolutions, the residual Add + Relu in
    # the second convolution's post-ops, each convolution computing in nChw16c blocks (2x2 planes).
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.conv1, self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.Conv2d(32, 32, 3, padding=1)
            self.head = torch.nn.Conv2d(32, 16, 1)

        def forward(self, x):
            y = torch.relu(self.down(x))
            return self.head(torch.relu(self.conv2(torch.relu(self.conv1(y))) + y)).mean((2, 3))

    module = Block().eval()
    x = torch.randn(6, 16, 4, 4)
    data = export(module, x)
    assert [(i, o) for op, i, o in _channels_last_attrs(data) if op == "FusedConv"] == [(0, 1), (1, 1), (1, 1), (1, 0)]
    sess = onnxtrain.InferenceSession(data)
    (y,) = sess.run(None, {"in0": x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    # The summand dies at conv2, whose output takes over its buffer: the sum post-op reads it in place.
    assert " 1 in-place" in sess.memory_report(), sess.memory_report()


class _DynamicBatchNet(torch.nn.Module):
    """openWakeWord's embedding pattern: conv, LeakyRelu, max with a constant, max pool, repeated."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Conv2d(1, 16, (3, 1)), torch.nn.Conv2d(16, 24, (1, 3), padding=(0, 1)), torch.nn.Conv2d(24, 8, 3)

    def forward(self, x):
        y = torch.maximum(torch.nn.functional.leaky_relu(self.a(x), 0.2), torch.tensor(-0.1))
        y = torch.nn.functional.max_pool2d(torch.clamp_min(torch.nn.functional.leaky_relu(self.b(y), 0.2), -0.05), 2)
        return self.c(y)


def _export_dynamic(module, x, axes):
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, opset_version=17, input_names=["in0"], output_names=["out"],
                      dynamic_axes={"in0": axes, "out": axes})
    return f.getvalue()


def test_values_of_an_unknown_batch_stay_channels_last():
    module = _DynamicBatchNet().eval()
    data = _export_dynamic(module, torch.randn(2, 1, 14, 9), {0: "batch"})
    assert [(i, o) for op, i, o in _channels_last_attrs(data) if op == "FusedConv"] == [(0, 1), (1, 1), (1, 0)]
    assert [op for op, _ in _pool_layouts(data)] == ["ChannelsLastPool"]
    sess = onnxtrain.InferenceSession(data)
    for batch in (1, 3):  # one session, two batch sizes
        x = torch.randn(batch, 1, 14, 9)
        np.testing.assert_allclose(sess.run(None, {"in0": x.numpy()})[0], module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_values_of_an_unknown_spatial_dim_stay_in_onnx_order():
    # An unknown height could hide a broadcast along it, which pairs elements by position.
    module = _DynamicBatchNet().eval()
    data = _export_dynamic(module, torch.randn(2, 1, 14, 9), {0: "batch", 2: "height"})
    assert all(i == 0 and o == 0 for _, i, o in _channels_last_attrs(data)), _channels_last_attrs(data)
    x = torch.randn(2, 1, 12, 9)
    np.testing.assert_allclose(onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})[0], module(x).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_pointwise_conv_with_a_residual_in_onnx_order_matches_numpy():
    # Conv 1x1 + Add between a graph input and a graph output (ONNX order on both sides): the
    # residual folds into the sum post-op of oneDNN's GEMM-based kernel.
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((16, 12, 1, 1)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"]), helper.make_node("Add", ["y", "z"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 12, 5, 7]),
                                           helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, 16, 5, 7])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    assert [(op, i, o) for op, i, o in _channels_last_attrs(data)] == [("FusedConv", 0, 0)]
    x, z = rng.standard_normal((2, 12, 5, 7)).astype(np.float32), rng.standard_normal((2, 16, 5, 7)).astype(np.float32)
    (got,) = onnxtrain.InferenceSession(data).run(None, {"x": x, "z": z})
    want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) + b[None, :, None, None] + z
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


class _TanhGeluMLP(torch.nn.Module):
    """Linear -> tanh-GELU -> Linear, the GELU as torch's F.gelu(approximate="tanh") or written out
    as GPT-2's gelu_new (HF NewGELUActivation) or as HF's FastGELUActivation; ``loss`` sums the
    output against fixed weights, so a gradient graph of it is seeded."""

    def __init__(self, form, loss=False):
        super().__init__()
        torch.manual_seed(3)
        self.up, self.down, self.form, self.loss = torch.nn.Linear(8, 24), torch.nn.Linear(24, 4), form, loss
        self.register_buffer("w", torch.randn(4))

    def gelu(self, x):
        if self.form == "torch":
            return torch.nn.functional.gelu(x, approximate="tanh")
        if self.form == "fast":
            return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    def forward(self, x):
        y = self.down(self.gelu(self.up(x)))
        return (y * self.w).sum() if self.loss else y


@pytest.mark.parametrize("form", ["torch", "gelu_new", "fast"])
def test_tanh_gelu_pattern_becomes_one_node_and_matches_float64(form):
    module = _TanhGeluMLP(form).eval()
    x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(0)) * 2
    data = export(module, x)
    assert "Tanh" in op_types(data)
    optimized = onnx.load_from_string(_C.optimize_model(data))
    gelus = [n for n in optimized.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 1 and [n.op_type for n in optimized.graph.node if n.op_type in ("Tanh", "Pow", "Mul")] == []
    assert {a.name: a.s for a in gelus[0].attribute} == {"approximate": b"tanh"}
    (y,) = onnxtrain.InferenceSession(data).run(None, {"in0": x.numpy()})
    np.testing.assert_allclose(y, module.double()(x.double()).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["torch", "gelu_new", "fast"])
def test_tanh_gelu_fuses_in_training_graphs_with_its_fused_gradient(form):
    from onnxtrain.autodiff import build_gradient_graph
    module = _TanhGeluMLP(form, loss=True)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)) * 2
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, input_names=["x"], output_names=["loss"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    params = ["up.weight", "up.bias", "down.weight"]
    grad_model = build_gradient_graph(f.getvalue(), params, ["loss"])
    nodes = onnx.load_from_string(grad_model).graph.node
    ops = [n.op_type for n in nodes]
    assert "Tanh" not in ops and ops.count("Gelu") == 1 and ops.count("GeluGrad") == 1, ops
    grad_node = next(n for n in nodes if n.op_type == "GeluGrad")
    assert {a.name: a.s for a in grad_node.attribute} == {"approximate": b"tanh"}
    got = onnxtrain.InferenceSession(grad_model).run(["loss"] + [p + "_grad" for p in params], {"x": x.numpy()})
    ref = module.double()
    loss = ref(x.double())
    loss.backward()
    want = [loss.detach().numpy()] + [dict(ref.named_parameters())[p].grad.numpy() for p in params]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def copy_module(module):
    import copy
    return copy.deepcopy(module)


class _TinyLM(torch.nn.Module):
    """Embedding -> tanh layer -> vocabulary head, with its cross-entropy inside when ``loss``:
    the shape of a language model's output layer (logits [B, S, V] flattened to token rows)."""

    def __init__(self, vocab=37, width=12, head_bias=False, reduction="mean"):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=head_bias)
        self.loss = torch.nn.CrossEntropyLoss(reduction=reduction)  # ignore_index -100

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.hidden(self.embed(ids))))
        return self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _lm_batches(vocab, steps, ignored, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (3, 10), generator=g)
        labels = torch.randint(0, vocab, (3, 10), generator=g)
        labels[torch.rand(3, 10, generator=g) < ignored] = -100
        out.append((ids, labels))
    return out


def _step_both_and_compare(ref, ours, ids, labels):
    """One forward and backward of the eager module and its TrainModule: equal losses and gradients."""
    want = ref(ids, labels)
    want.backward()
    got = ours(ids, labels)
    got.backward()
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        assert (q.grad is None) == (p.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("head_bias,reduction,ignored", [(False, "mean", 0.3), (True, "mean", 0.0), (True, "sum", 0.5)])
def test_output_layer_and_loss_fuse_under_train_module_and_match_torch(tmp_path, monkeypatch, head_bias, reduction, ignored):
    """The vocabulary head and its loss become one LinearSoftmaxCrossEntropy in TrainModule's forward
    graph (the logits are never a value of either graph), and 3 SGD steps give torch's losses and
    parameters."""
    from onnxtrain.torch import DebugOptions, TrainModule
    monkeypatch.setenv("ONNXTRAIN_SAVE_ONNX_PATH", str(tmp_path))
    torch.manual_seed(0)
    ref = _TinyLM(head_bias=head_bias, reduction=reduction)
    ours = TrainModule(copy_module(ref), DebugOptions(save_onnx=True, onnx_prefix="lm"))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.5)
    for ids, labels in _lm_batches(37, 3, ignored):
        _step_both_and_compare(ref, ours, ids, labels)
        opt_ref.step(), opt_ours.step(), opt_ref.zero_grad(), opt_ours.zero_grad()
    forward = next(tmp_path.glob("lm_*_forward.onnx"))
    nodes = onnx.load(str(forward)).graph.node
    fused = [n for n in nodes if n.op_type == "LinearSoftmaxCrossEntropy"]
    assert len(fused) == 1 and "SoftmaxCrossEntropyLoss" not in [n.op_type for n in nodes], [n.op_type for n in nodes]
    # dA, dW (and dbias) leave the forward for the backward; the logits do not exist.
    assert len([o for o in fused[0].output if o]) == (4 if head_bias else 3)


def test_output_layer_fusion_computes_only_the_gradients_the_backward_reads(tmp_path, monkeypatch):
    """A frozen head: the fused op computes the loss and dA, not the head's weight gradient."""
    from onnxtrain.torch import DebugOptions, TrainModule
    monkeypatch.setenv("ONNXTRAIN_SAVE_ONNX_PATH", str(tmp_path))
    torch.manual_seed(0)
    ref = _TinyLM()
    ref.head.weight.requires_grad_(False)
    ours = TrainModule(copy_module(ref), DebugOptions(save_onnx=True, onnx_prefix="frozen"))
    _step_both_and_compare(ref, ours, *_lm_batches(37, 1, 0.2)[0])
    fused = next(n for n in onnx.load(str(next(tmp_path.glob("frozen_*_forward.onnx")))).graph.node
                 if n.op_type == "LinearSoftmaxCrossEntropy")
    assert list(fused.output[1:]) == [fused.output[1]] and fused.output[1], list(fused.output)


def test_output_layer_with_another_reader_of_the_logits_is_not_fused():
    """Logits that something besides the loss reads stay a MatMul and a SoftmaxCrossEntropyLoss."""
    from onnxtrain.torch import TrainModule

    class LossAndArgmax(_TinyLM):
        def forward(self, ids, labels):
            logits = self.head(torch.tanh(self.hidden(self.embed(ids))))
            return self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)), logits.detach().argmax(-1)

    torch.manual_seed(0)
    ref = LossAndArgmax()
    ours = TrainModule(copy_module(ref))
    ids, labels = _lm_batches(37, 1, 0.2)[0]
    (want, want_top), (got, got_top) = ref(ids, labels), ours(ids, labels)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    assert torch.equal(got_top, want_top)


def test_linear_cross_entropy_rejects_labels_that_do_not_match_the_rows():
    node = onnx.helper.make_node("LinearSoftmaxCrossEntropy", ["a", "b", "t"], ["loss"], domain="onnxtrain")
    graph = onnx.helper.make_graph(
        [node], "lce",
        [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [4, 3]),
         onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [3, 5]),
         onnx.helper.make_tensor_value_info("t", onnx.TensorProto.INT64, [None])],
        [onnx.helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("onnxtrain", 1)])
    session = onnxtrain.InferenceSession(model.SerializeToString())
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    with pytest.raises(Exception, match=r"\[LinearSoftmaxCrossEntropy\].*labels of shape \[3\] hold 3 values for 4 rows"):
        session.run(["loss"], {"a": a, "b": b, "t": np.zeros(3, np.int64)})
    with pytest.raises(Exception, match=r"label 5 at row 1 is out of range \[0, 5\)"):
        session.run(["loss"], {"a": a, "b": b, "t": np.array([0, 5, 1, 2], np.int64)})
    loss, = session.run(["loss"], {"a": a, "b": b, "t": np.array([0, 4, 1, 2], np.int64)})
    np.testing.assert_allclose(loss, np.log(5.0), rtol=1e-6)  # equal logits: log of the class count
