"""fp32 MaxPool / AveragePool and their gradient ops (the oneDNN path) against torch, and against
onnxtrain's own float64 generic loop for geometry torch cannot express (asymmetric pads).

The gradient ops are run directly: onnxtrain.MaxPoolGrad(dY, X) / AveragePoolGrad(dY, X) with the
forward node's attributes, compared with torch.autograd for the same dY.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import onnxtrain

from . import single_node


def run_node(op, inputs, attrs, domain=""):
    return single_node.run_node(op, inputs, attrs, domain=domain)[0]


def forward_and_grad(op, x, dy_seed, attrs):
    """(Y, dX) from onnxtrain for X and a random dY of Y's shape."""
    y = run_node(op, [x], attrs)
    dy = np.random.default_rng(dy_seed).standard_normal(y.shape).astype(x.dtype)
    dx = run_node(op + "Grad", [dy, x], attrs, domain="onnxtrain")
    return y, dy, dx


def torch_pool(op, x, dy, kernel, stride, pad, ceil, dilation=1, include_pad=False):
    """Y and dX from torch for symmetric pads."""
    nd = x.ndim - 2
    t = torch.tensor(x, requires_grad=True)
    if op == "MaxPool":
        fn = [F.max_pool1d, F.max_pool2d, F.max_pool3d][nd - 1]
        y = fn(t, kernel, stride, pad, dilation=dilation, ceil_mode=ceil)
    else:
        fn = [F.avg_pool1d, F.avg_pool2d, F.avg_pool3d][nd - 1]
        y = fn(t, kernel, stride, pad, ceil_mode=ceil, count_include_pad=include_pad)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), t.grad.numpy()


# (op, input shape, kernel, stride, pad, ceil_mode, dilation, count_include_pad)
TORCH_CASES = [
    ("MaxPool", (4, 8, 8, 8), 2, 2, 0, False, 1, False),         # the digits model's pool
    ("MaxPool", (2, 16, 9, 9), 3, 2, 1, False, 1, False),
    ("MaxPool", (2, 5, 10, 7), 3, 2, 1, True, 1, False),          # ceil mode, odd sizes
    ("MaxPool", (2, 3, 11, 11), 3, 1, 1, False, 2, False),        # dilation
    ("MaxPool", (2, 4, 13), 3, 2, 0, True, 1, False),             # 1-d
    ("MaxPool", (1, 3, 6, 6, 6), 2, 2, 0, False, 1, False),       # 3-d
    ("AveragePool", (4, 8, 8, 8), 2, 2, 0, False, 1, False),
    ("AveragePool", (2, 16, 9, 9), 3, 2, 1, False, 1, False),
    ("AveragePool", (2, 16, 9, 9), 3, 2, 1, False, 1, True),      # count_include_pad
    ("AveragePool", (2, 5, 10, 7), 3, 2, 1, True, 1, False),      # ceil mode
    ("AveragePool", (2, 5, 10, 7), 3, 2, 1, True, 1, True),       # ceil mode past the pads
    ("AveragePool", (2, 4, 13), 3, 2, 1, False, 1, True),         # 1-d
    ("AveragePool", (1, 3, 7, 6, 5), 3, 2, 1, False, 1, False),   # 3-d
]


@pytest.mark.parametrize("op,shape,kernel,stride,pad,ceil,dilation,include_pad", TORCH_CASES)
def test_pool_fp32_matches_torch(op, shape, kernel, stride, pad, ceil, dilation, include_pad):
    nd = len(shape) - 2
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    attrs = dict(kernel_shape=[kernel] * nd, strides=[stride] * nd, pads=[pad] * (2 * nd), ceil_mode=int(ceil))
    if op == "MaxPool":
        attrs["dilations"] = [dilation] * nd
    else:
        attrs["count_include_pad"] = int(include_pad)
    y, dy, dx = forward_and_grad(op, x, 2, attrs)
    ty, tdx = torch_pool(op, x, dy, kernel, stride, pad, ceil, dilation, include_pad)
    np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, tdx, rtol=1e-5, atol=1e-6)


# Asymmetric pads and strides per axis: fp32 against the float64 generic loop.
GENERIC_CASES = [
    ("MaxPool", dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2], dilations=[2, 1])),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 2, 1], count_include_pad=0, ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1, ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("op,attrs", GENERIC_CASES)
def test_pool_fp32_matches_generic_float64(op, attrs):
    x = np.random.default_rng(3).standard_normal((2, 6, 9, 8))
    y64, dy64, dx64 = forward_and_grad(op, x, 4, attrs)
    y32 = run_node(op, [x.astype(np.float32)], attrs)
    dx32 = run_node(op + "Grad", [dy64.astype(np.float32), x.astype(np.float32)], attrs, domain="onnxtrain")
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx32, dx64, rtol=1e-5, atol=1e-6)


def test_maxpool_indices_output_keeps_generic_path():
    """Asking for Indices (which oneDNN does not produce) still gives ONNX's flat indices."""
    x = np.random.default_rng(5).standard_normal((1, 2, 4, 4)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    sess = onnxtrain.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                      .SerializeToString())
    y, idx = sess.run(None, {"x": x})
    ty, tidx = F.max_pool2d(torch.tensor(x), 2, 2, return_indices=True)
    np.testing.assert_array_equal(y, ty.numpy())
    # torch's indices are per plane; ONNX's are flat over the whole tensor.
    plane = np.arange(2).reshape(1, 2, 1, 1) * 16
    np.testing.assert_array_equal(idx, tidx.numpy() + plane)
