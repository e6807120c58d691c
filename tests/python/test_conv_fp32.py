"""fp32 Conv and onnxtrain.ConvGrad against torch, across bias, groups, strides, dilations and the
compute_dx / compute_dw flags: the oneDNN path (backward-data and backward-weights side by side) and,
for small 2-d images, the portable kernels (src/backends/cpu/portable.h)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from . import single_node

# (x shape, out channels, kernel, stride, pad, dilation, group, bias)
CASES = [
    ((4, 3, 12, 12), 8, 3, 1, 1, 1, 1, True),
    ((2, 16, 9, 9), 32, 3, 2, 1, 1, 1, False),     # the blocked layouts' channel multiple
    ((2, 8, 10, 10), 12, 3, 1, 2, 2, 4, True),      # groups and dilation
    ((3, 6, 11), 4, 5, 2, 2, 1, 2, True),           # 1-d
    ((1, 4, 5, 6, 5), 6, 3, 1, 1, 1, 1, True),      # 3-d
    ((2, 32, 12, 12), 32, 3, 1, 1, 1, 32, True),    # depthwise in ONNX order: oneDNN's nChw16c kernel
    # Small 2-d images, which both builds run through the portable direct kernels (conv_direct.h;
    # src/backends/cpu/portable.h); with ONNXTRAIN_KERNELS=portable every case here does.
    ((2, 5, 6, 5), 20, 3, 1, 2, 1, 1, True),        # outputs not a whole vector, pad at the kernel's reach
    ((2, 3, 4, 4), 7, 3, 1, 3, 1, 1, True),         # pad past the reach: windows wholly in the padding
    ((2, 4, 7, 7), 9, 3, 1, 1, 2, 1, False),        # dilation
    ((2, 3, 6, 6), 60, 3, 1, 1, 1, 1, True),        # a 64-wide output tile with a tail
    ((3, 2, 8, 8), 5, 2, 2, 0, 1, 1, True),         # stride 2: dX from the stride-spread dY frame
    # ConvGrad's Winograd shapes (winograd_backward in conv_dnnl.cc): both passes on 8x8 outputs,
    # backward-weights alone on 4x4 (with AVX-512; elsewhere the direct kernels run them). Larger than
    # the portable kernels' shapes.
    ((2, 32, 16, 16), 16, 3, 1, 1, 1, 1, True),
    ((2, 80, 4, 4), 16, 3, 1, 1, 1, 1, False),
]


def torch_conv_grads(x, w, b, dy, stride, pad, dilation, group):
    conv = [F.conv1d, F.conv2d, F.conv3d][x.ndim - 3]
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True) if b is not None else None
    y = conv(tx, tw, tb, stride, pad, dilation, group)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy() if tb is not None else None


@pytest.mark.parametrize("need", ["both", "dx", "dw"])
@pytest.mark.parametrize("shape,m,k,stride,pad,dilation,group,bias", CASES)
def test_conv_grad_fp32_matches_torch(shape, m, k, stride, pad, dilation, group, bias, need):
    rng = np.random.default_rng(0)
    nd = len(shape) - 2
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((m, shape[1] // group) + (k,) * nd).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    attrs = dict(kernel_shape=[k] * nd, strides=[stride] * nd, pads=[pad] * (2 * nd), dilations=[dilation] * nd,
                 group=group)
    y = single_node.run_node("Conv", [x, w] + ([b] if bias else []), attrs)[0]
    dy = rng.standard_normal(y.shape).astype(np.float32)
    ty, tdx, tdw, tdb = torch_conv_grads(x, w, b, dy, stride, pad, dilation, group)
    np.testing.assert_allclose(y, ty, rtol=1e-4, atol=1e-4)
    grad_attrs = dict(attrs, compute_dx=int(need != "dw"), compute_dw=int(need != "dx"))
    grads = single_node.run_node("ConvGrad", [dy, x, w], grad_attrs, num_outputs=3 if bias else 2,
                                 domain="onnxtrain")
    if need != "dw":
        np.testing.assert_allclose(grads[0], tdx, rtol=1e-4, atol=1e-4)
    if need != "dx":
        np.testing.assert_allclose(grads[1], tdw, rtol=1e-4, atol=1e-3)
        if bias:
            np.testing.assert_allclose(grads[2], tdb, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 4])  # 2.7 M multiply-adds (one thread) and 10.6 M (the pool)
def test_conv_fp32_on_one_thread_and_on_the_pool_matches_torch(batch):
    # Convolutions under ConvPrimitive::kSerialMacs (4 M multiply-adds) are built and run on the
    # calling thread; the others on all threads. Both must give torch's numbers.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 32, 12, 12)).astype(np.float32)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    y = single_node.run_node("Conv", [x, w], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))[0]
    np.testing.assert_allclose(y, F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("hw,stride", [(2, 1), (4, 2), (1, 1)])
def test_conv_fp32_on_tiny_planes_matches_torch(hw, stride):
    # Output planes of at most 4 positions over a batch run in oneDNN's nChw16c blocks (its direct
    # kernel) instead of the layout its brgemm kernel takes.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 32, hw, hw)).astype(np.float32)
    w = rng.standard_normal((48, 32, 3, 3)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    y = single_node.run_node("Conv", [x, w, b], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride] * 2))[0]
    want = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=stride, padding=1).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape", [(1, 48, 12, 20), (3, 16, 7, 9), (2, 8, 11), (2, 4, 3, 5, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_conv_in_onnx_order_matches_torch(shape, bias):
    # 1x1 convolutions between values in ONNX order run oneDNN's GEMM-based kernel on that order.
    rng = np.random.default_rng(3)
    nd = len(shape) - 2
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((24, shape[1]) + (1,) * nd).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    y = single_node.run_node("Conv", [x, w] + ([b] if bias else []), dict(kernel_shape=[1] * nd))[0]
    conv = [F.conv1d, F.conv2d, F.conv3d][nd - 1]
    want = conv(torch.tensor(x), torch.tensor(w), torch.tensor(b) if bias else None).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_unknown_kernel_choice_is_an_error_naming_the_variable():
    # ONNXTRAIN_KERNELS (src/backends/cpu/portable.cc) is read when the first primitive is built:
    # an unknown value fails that call with a message, in a fresh process (the choice is per process).
    import os
    import subprocess
    import sys
    code = ("import numpy as np\n"
            "from tests.python import single_node\n"
            "x = np.ones((1, 1, 4, 4), np.float32); w = np.ones((1, 1, 3, 3), np.float32)\n"
            "try:\n"
            "    single_node.run_node('Conv', [x, w], dict(kernel_shape=[3, 3]))\n"
            "except Exception as e:\n"
            "    print('ERROR', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ONNXTRAIN_KERNELS="fastest")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERROR" in out.stdout and "ONNXTRAIN_KERNELS" in out.stdout and "'fastest'" in out.stdout, out.stdout


def test_conv_grad_runs_winograd_where_chosen():
    # ConvGrad of a 3x3 stride-1 convolution with 16-multiple channels on a 16x16 plane runs oneDNN's
    # Winograd kernels (jit_wino_4x3, AVX-512 only) for both passes; the cases above check its
    # numbers. oneDNN's verbose output, read when the library loads, names the kernels: a fresh process.
    import os
    import subprocess
    import sys
    with open("/proc/cpuinfo") as f:
        if "avx512f" not in f.read():
            pytest.skip("oneDNN's Winograd kernels need AVX-512")
    code = ("import numpy as np\n"
            "from tests.python import single_node\n"
            "x = np.ones((2, 32, 16, 16), np.float32); w = np.ones((16, 32, 3, 3), np.float32)\n"
            "dy = np.ones((2, 16, 16, 16), np.float32)\n"
            "single_node.run_node('ConvGrad', [dy, x, w], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),\n"
            "                     num_outputs=2, domain='onnxtrain')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kernels = {line.split(",")[5]: line.split(",")[4] for line in out.stdout.splitlines()
               if line.startswith(("onednn_verbose,exec,cpu,convolution", "dnnl_verbose,exec,cpu,convolution"))}
    assert kernels.get("backward_data", "").startswith("jit_wino_4x3"), kernels
    assert kernels.get("backward_weights", "").startswith("jit_wino_4x3"), kernels


def test_serial_work_override_keeps_results_and_refuses_a_bad_value():
    # ONNXTRAIN_SERIAL_WORK (src/core/parallel.cc) replaces the bar under which a convolution runs
    # on the calling thread; read once per process, so each value gets a fresh one. 0 sends this
    # batch-1 convolution (37 K multiply-adds, serial by default) through the pool: same values.
    import os
    import subprocess
    import sys
    code = ("import numpy as np, torch, torch.nn.functional as F\n"
            "from tests.python import single_node\n"
            "rng = np.random.default_rng(0)\n"
            "x = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)\n"
            "w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)\n"
            "try:\n"
            "    y = single_node.run_node('Conv', [x, w], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))[0]\n"
            "except Exception as e:\n"
            "    print('ERROR', e); raise SystemExit(0)\n"
            "want = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()\n"
            "print('MAXERR', float(np.max(np.abs(y - want))))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = {}
    for value in ("0", "many"):
        env = dict(os.environ, ONNXTRAIN_SERIAL_WORK=value)
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        outs[value] = out.stdout
    assert "MAXERR" in outs["0"] and float(outs["0"].split("MAXERR")[1]) < 1e-3, outs["0"]
    assert "ERROR" in outs["many"] and "ONNXTRAIN_SERIAL_WORK" in outs["many"] and "'many'" in outs["many"], outs["many"]


# ConvTranspose whose windows tile the output (kernel == stride, no pads or dilation: a learned
# upsampling) runs as a matmul and a scatter (run_tiled in conv_transpose.cc); the others through
# oneDNN. (x shape, out channels, kernel = stride, bias)
TILED_TRANSPOSE_CASES = [
    ((2, 24, 5, 6), 24, (2, 2), True),     # PP-OCR det's upsampling
    ((3, 24, 4, 4), 1, (2, 2), True),      # one output channel
    ((1, 5, 3, 7), 7, (2, 3), False),      # unequal kernel dims, odd channels
    ((2, 6, 9), 4, (4,), True),            # 1-d
    ((2, 3, 2, 3, 4), 5, (2, 1, 3), True), # 3-d, a dim without upsampling
    ((1, 4, 3, 3), 6, (1, 1), True),       # 1x1: a pointwise product
    ((16, 16, 20, 20), 8, (2, 2), True),   # images on both threads at once, sharing one matmul
]


@pytest.mark.parametrize("x_shape,m,kernel,bias", TILED_TRANSPOSE_CASES)
@pytest.mark.parametrize("weights_constant", [False, True])
def test_tiled_conv_transpose_matches_torch(x_shape, m, kernel, bias, weights_constant):
    import onnxtrain
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(len(x_shape) + m)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((x_shape[1], m, *kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    conv_t = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][x.ndim - 3]
    want = conv_t(torch.tensor(x), torch.tensor(w), torch.tensor(b) if bias else None, stride=kernel).numpy()
    names = ["x", "w", "b"][:3 if bias else 2]
    values = dict(zip(names, [x, w, b]))
    constants = [numpy_helper.from_array(values[n], n) for n in names[1:]] if weights_constant else []
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, values[n].shape)
                    for n in names if not weights_constant or n == "x"]
    node = helper.make_node("ConvTranspose", names, ["y"], kernel_shape=list(kernel), strides=list(kernel))
    graph = helper.make_graph([node], "t", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxtrain.InferenceSession(model.SerializeToString())
    feeds = {i.name: values[i.name] for i in graph_inputs}
    for _ in range(2):  # the second run reuses the kernel's matmul and its buffer
        y = sess.run(None, feeds)[0]
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


# A pointwise convolution between values in ONNX order (dynamic spatial dims keep the layout pass
# away) runs oneDNN's GEMM-based kernel and then its activation as a separate in-place primitive
# (conv_dnnl.cc); the fusion pass folds each of these activations into the convolution.
POINTWISE_ACTIVATIONS = [
    ("Relu", {}, F.relu),
    ("LeakyRelu", {"alpha": 0.1}, lambda t: F.leaky_relu(t, 0.1)),
    ("Sigmoid", {}, torch.sigmoid),
    ("Tanh", {}, torch.tanh),
    ("HardSwish", {}, F.hardswish),
]


@pytest.mark.parametrize("op,attrs,reference", POINTWISE_ACTIVATIONS, ids=[a[0] for a in POINTWISE_ACTIVATIONS])
def test_pointwise_conv_activation_in_onnx_order_matches_torch(op, attrs, reference):
    import onnxtrain
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 24, 9, 10)).astype(np.float32)  # past the portable kernels' 64 positions
    w = rng.standard_normal((40, 24, 1, 1)).astype(np.float32) * 0.3
    b = rng.standard_normal(40).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
             helper.make_node(op, ["c"], ["y"], **attrs)]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 24, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxtrain.InferenceSession(model.SerializeToString())
    want = reference(F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b))).numpy()
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
