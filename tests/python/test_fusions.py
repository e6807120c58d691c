"""Fusion passes: the rewritten graph computes what the original computes, and the fusion fires."""
import io

import numpy as np
import onnx
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
