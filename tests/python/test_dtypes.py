"""Registry-driven dtype harness: every gradcheck sample (tests/python/grad_samples/) also runs in
float32, bfloat16 and float16 and is compared with float64, forward and gradient
(tests/python/dtype_harness.py). An op without a kernel for a half type is reported as skipped,
except the ops mixed precision runs in the low precision or lets follow it
(src/passes/mixed_precision.cc), which must have them."""
import pytest

import onnxtrain

from .dtype_harness import DTYPES, compare
from .gradcheck import collect_samples
from .test_gradients import differentiable_ops

SAMPLES = collect_samples()

# Ops whose purpose is a dtype change: their samples are about the dtypes themselves. Control-flow
# ops: their samples carry float64-typed subgraphs (and outer-scope values), which this harness,
# converting a node's own inputs, does not rewrite; their bodies' ops are covered one by one.
# Sequence ops: their samples feed or return sequences (lists), which the harness's Cast wrapper
# does not convert; their kernels only move tensors, whatever the dtype.
NOT_APPLICABLE = {"Cast", "CastLike", "If", "Loop", "Scan", "SequenceConstruct", "SequenceAt", "SequenceInsert",
                  "SequenceErase", "SplitToSequence",
                  "ConcatFromSequence"}

# The op set mixed precision puts in the low precision (low and follow classes) plus the fp32
# ops whose kernels keep statistics in fp32 for half inputs: a missing kernel is a failure here.
MUST_HAVE_HALF = {
    "MatMul", "Gemm", "onnxtrain.FusedMatMul", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu",
    "Gelu", "onnxtrain.Gelu", "Tanh", "Sigmoid", "Dropout", "Identity", "Reshape", "Transpose", "Squeeze",
    "Unsqueeze", "Flatten", "Concat", "Split", "Slice", "Gather", "Expand", "Where", "Tile", "Max", "Min",
    "Softmax", "LayerNormalization", "ReduceSum", "ReduceMean", "onnxtrain.SumTo", "Conv", "MaxPool", "AveragePool",
}

# Where the op's own rounding exceeds the generic bound, with the reason (rtol, atol per dtype).
TOLERANCE_OVERRIDES = {}


def cases():
    out = []
    for op in differentiable_ops():
        if op in NOT_APPLICABLE or not SAMPLES.get(op):
            continue
        for dtype in DTYPES:
            out.append((op, dtype))
    return out


@pytest.mark.parametrize("op,dtype", cases())
def test_op_matches_float64(op, dtype):
    op_type = op.split(".")[-1]
    tol = TOLERANCE_OVERRIDES.get(op, {}).get(dtype)
    for k, sample in enumerate(SAMPLES[op]):
        try:
            compare(op_type, sample, dtype, seed=2000 + k, tolerance=tol)
        except onnxtrain.NotImplemented as e:
            if op in MUST_HAVE_HALF or dtype == "float32":
                raise
            pytest.skip(f"{op} has no {dtype} kernel: {e}")


def test_must_have_half_names_registered_ops():
    ops = set(differentiable_ops())
    assert MUST_HAVE_HALF <= ops, MUST_HAVE_HALF - ops
