"""Samples for the reductions (src/ops/reduce/), normalisations, softmax and dropout (src/ops/nn/)
and losses (src/ops/loss/). The fused backward ops they emit (onnxtrain.SoftmaxGrad, ...) are
marked gradient_not_implemented and are exercised through these samples."""
import dataclasses

import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(23)


def r(*shape):
    return rng.standard_normal(shape)


def pos(*shape):
    return rng.uniform(0.5, 2.0, shape)


def i64(*values):
    return np.array(values, np.int64)


def _reduce_samples(x_fn, opsets=(13, 18)):
    """Axes variants for one Reduce* op: keepdims 0/1, negative axes, all axes, attribute axes
    (opset 13 for all but ReduceSum) and input axes (ReduceSum >= 13, the others >= 18)."""
    samples = []
    for opset in opsets:
        samples += [
            Sample([x_fn(2, 3, 4)], dict(keepdims=1), opset=opset, name=f"all keepdims=1 ({opset})"),
            Sample([x_fn(2, 3, 4)], dict(keepdims=0), opset=opset, name=f"all keepdims=0 ({opset})"),
        ]
    return samples


def reduce_family(op, x_fn):
    out = _reduce_samples(x_fn, opsets=(13, 18) if op != "ReduceSum" else (11, 13))
    attr_opset = 11 if op == "ReduceSum" else 13
    out += [
        Sample([x_fn(2, 3, 4)], dict(axes=[1], keepdims=1), opset=attr_opset, name="attr axis 1 keepdims"),
        Sample([x_fn(2, 3, 4)], dict(axes=[0, 2], keepdims=0), opset=attr_opset, name="attr axes 0,2"),
        Sample([x_fn(2, 3, 4)], dict(axes=[-1], keepdims=0), opset=attr_opset, name="attr axis -1"),
        Sample([x_fn(3, 1, 2)], dict(axes=[1], keepdims=0), opset=attr_opset, name="size-1 axis"),
        Sample([x_fn(5)], dict(keepdims=0), opset=attr_opset, name="vector to scalar"),
        Sample([x_fn(2, 3, 4), i64(1)], dict(keepdims=1), constants=[1], opset=18, name="input axis 1"),
        Sample([x_fn(2, 3, 4), i64(-1, 0)], dict(keepdims=0), constants=[1], opset=18, name="input axes -1,0"),
        Sample([x_fn(2, 3, 4), i64(-2)], dict(keepdims=0), opset=18, name="run-time axes"),
        Sample([x_fn(2, 3), i64()], dict(keepdims=0, noop_with_empty_axes=1), constants=[1], opset=18,
               name="noop"),
    ]
    return out


def with_ties(op):
    x = r(3, 4)
    x[0, 1] = x[0, 3] = (x[0].max() + 1.0) if op == "ReduceMax" else (x[0].min() - 1.0)
    # Central differences see 1/2 for each element of a 2-way tie, which is what an even split gives.
    return [Sample([x], dict(axes=[1], keepdims=1), opset=13, name="2-way tie (each gets half)")]


def prod_zero_samples():
    one_zero = pos(3, 4)
    one_zero[1, 2] = 0.0
    two_zeros = pos(3, 4)
    two_zeros[2, 0] = two_zeros[2, 3] = 0.0
    mixed = pos(2, 3, 2) * np.sign(r(2, 3, 2))
    mixed[0, 1, 1] = 0.0
    return [
        Sample([one_zero], dict(axes=[1], keepdims=0), opset=13, name="one zero in a row"),
        Sample([two_zeros], dict(axes=[1], keepdims=1), opset=13, name="two zeros in a row"),
        Sample([mixed, i64(1)], dict(keepdims=0), constants=[1], opset=18, name="signs and a zero"),
    ]


def nonzero(*shape):
    return pos(*shape) * np.where(rng.random(shape) < 0.5, -1.0, 1.0)


SAMPLES = {
    "ReduceSum": reduce_family("ReduceSum", r) + [
        Sample([r(2, 0, 3), i64(1)], dict(keepdims=0), constants=[1], opset=13, name="empty input"),
        Sample([r(2, 3), i64(0)], dict(keepdims=1), opset=13, name="run-time axes 13"),
    ],
    "ReduceMean": reduce_family("ReduceMean", r),
    "ReduceSumSquare": reduce_family("ReduceSumSquare", r),
    "ReduceL1": reduce_family("ReduceL1", nonzero),
    "ReduceL2": reduce_family("ReduceL2", r),
    "ReduceLogSum": reduce_family("ReduceLogSum", pos),
    "ReduceLogSumExp": reduce_family("ReduceLogSumExp", r),
    "ReduceMax": reduce_family("ReduceMax", r) + with_ties("ReduceMax"),
    "ReduceMin": reduce_family("ReduceMin", r) + with_ties("ReduceMin"),
    "ReduceProd": reduce_family("ReduceProd", nonzero) + prod_zero_samples(),
    "CumSum": [
        Sample([r(5), i64(0)], constants=[1], opset=14, name="vector"),
        Sample([r(3, 4), i64(1)], dict(exclusive=1), constants=[1], opset=14, name="exclusive"),
        Sample([r(3, 4), i64(-2)], dict(reverse=1), constants=[1], opset=14, name="reverse, negative axis"),
        Sample([r(2, 3, 4), i64(1)], dict(exclusive=1, reverse=1), constants=[1], opset=14,
               name="exclusive reverse, inner dims"),
        Sample([r(2, 3), np.array(1, np.int64)], opset=11, name="run-time scalar axis"),
    ],
    "Softmax": [
        Sample([r(3, 5)], opset=13, name="rows"),
        Sample([r(2, 3, 4)], dict(axis=1), opset=13, name="middle axis"),
        Sample([r(2, 3, 4)], dict(axis=0), opset=13, name="first axis"),
        Sample([r(2, 3, 4)], opset=11, name="legacy coerce at 1"),
        Sample([r(2, 3, 4)], dict(axis=2), opset=11, name="legacy axis 2"),
        Sample([r(2, 3, 4)], dict(axis=0), opset=11, name="legacy axis 0 (one row)"),
        Sample([r(1, 1)], opset=13, name="size-1"),
    ],
    "LogSoftmax": [
        Sample([r(3, 5)], opset=13, name="rows"),
        Sample([r(2, 3, 4)], dict(axis=-2), opset=13, name="middle axis"),
        Sample([r(2, 3, 4)], opset=11, name="legacy coerce at 1"),
        Sample([r(2, 3, 4)], dict(axis=-1), opset=11, name="legacy axis -1"),
        Sample([r(4)], dict(axis=0), opset=13, name="vector"),
    ],
    "LayerNormalization": [
        Sample([r(3, 6), pos(6), r(6)], dict(epsilon=1e-3), name="rows"),
        Sample([r(2, 3, 4), pos(3, 4), r(3, 4)], dict(axis=1), name="axis 1"),
        Sample([r(2, 3, 4), pos(4)], dict(axis=-2), name="broadcast scale, no bias"),
        Sample([r(2, 3, 4), pos(4), r(1, 4)], dict(axis=1), name="broadcast scale and bias"),
        Sample([r(4, 5), pos(5), r(5)], dict(stash_type=11), n_outputs=3, name="saved double statistics"),
        Sample([r(4, 5), pos(5), r(5)], n_outputs=3, name="float statistics: recomputed"),
        Sample([r(2, 3, 4), pos(2, 3, 4), r(2, 3, 4)], dict(axis=0), name="axis 0"),
    ],
    "BatchNormalization": [
        Sample([r(2, 3, 4), pos(3), r(3), r(3), pos(3)], opset=15, name="inference, all inputs"),
        Sample([r(3, 2), pos(2), r(2), r(2), pos(2)], dict(epsilon=1e-2), opset=9, name="inference [N, C]"),
        Sample([r(2, 3, 2, 2), pos(3), r(3), r(3), pos(3)], dict(training_mode=1), opset=15, n_outputs=3,
               name="training, running stats"),
        Sample([r(4, 2, 3), pos(2), r(2), r(2), pos(2)], dict(training_mode=1, momentum=0.7), opset=14,
               wrt=[0, 1, 2], name="training, output only"),
        Sample([r(5, 3), pos(3), r(3), r(3), pos(3)], dict(training_mode=1), opset=15, wrt=[0],
               name="training [N, C]"),
    ],
    "InstanceNormalization": [
        Sample([r(2, 3, 4), pos(3), r(3)], name="[N, C, L]"),
        Sample([r(2, 2, 3, 2), pos(2), r(2)], dict(epsilon=1e-2), name="[N, C, H, W]"),
        Sample([r(1, 3, 5), pos(3), r(3)], opset=6, name="N = 1"),
    ],
    "MeanVarianceNormalization": [
        Sample([r(2, 3, 2, 2)], name="default axes"),
        Sample([r(2, 3, 4)], dict(axes=[2]), name="last axis"),
        Sample([r(2, 3, 4)], dict(axes=[0, 1]), opset=9, name="leading axes"),
    ],
    "LRN": [
        Sample([r(2, 5, 3)], dict(size=3, alpha=0.5, beta=0.75), name="size 3"),
        Sample([r(1, 4, 2, 2)], dict(size=2, alpha=0.3, beta=0.6, bias=2.0), name="size 2 (asymmetric)"),
        Sample([r(2, 3)], dict(size=5, alpha=1.0, beta=1.5, bias=1.5), name="window wider than C"),
    ],
    # Training-mode Dropout with 0 < ratio < 1 draws a fresh mask per run (so finite differences
    # cannot see it); the samples cover inference, ratio 0 and ratio 1 in training, the run-time
    # training_mode path (mask reused, added to the forward when absent) and the legacy opsets.
    "Dropout": [
        Sample([r(3, 4)], opset=12, name="no training_mode input"),
        Sample([r(3, 4)], dict(ratio=0.3), opset=7, name="opset 7"),
        Sample([r(3, 4), np.array(0.5), np.array(False)], constants=[1, 2], opset=13, name="training_mode false"),
        Sample([r(3, 4), np.array(0.0), np.array(True)], constants=[1, 2], opset=13, name="training, ratio 0"),
        Sample([r(3, 4), np.array(0.0), np.array(True)], wrt=[0], opset=13, name="run-time training, ratio 0"),
        Sample([r(3, 4), np.array(1.0), np.array(True)], dict(seed=3), wrt=[0], opset=13,
               name="run-time training, ratio 1 (all dropped)"),
        Sample([r(3, 4), np.array(0.0), np.array(True)], wrt=[0], n_outputs=2, opset=13,
               name="mask output kept"),
        Sample([r(2, 3), np.array(0.25), np.array(False)], wrt=[0], n_outputs=2, opset=13,
               name="run-time inference with mask"),
    ],
}


def _labels(shape, c, ignore=None):
    t = rng.integers(0, c, shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


def _loss_samples(make_x):
    out = []
    for red in ("mean", "sum", "none"):
        out += [
            Sample([make_x(4, 5), _labels((4,), 5)], dict(reduction=red), constants=[1], name=f"{red}"),
            Sample([make_x(4, 5), _labels((4,), 5), pos(5)], dict(reduction=red), constants=[1],
                   name=f"{red}, weights"),
            Sample([make_x(3, 4, 2), _labels((3, 2), 4, ignore=2), pos(4)], dict(reduction=red, ignore_index=2),
                   constants=[1], name=f"{red}, [N, C, D], ignore_index hits"),
        ]
    out += [
        Sample([make_x(2, 3, 2, 2), _labels((2, 2, 2), 3, ignore=-1)], dict(ignore_index=-1), constants=[1],
               name="[N, C, D1, D2], negative ignore_index"),
        Sample([make_x(4, 3), _labels((4,), 3).astype(np.int32), pos(3)], dict(reduction="sum"), constants=[1, 2],
               name="int32 labels, constant weights"),
        Sample([make_x(4, 3), np.array([1, 7, 2, 7], np.int64)], dict(ignore_index=7), constants=[1],
               name="ignore_index outside [0, C)"),
    ]
    return out


SAMPLES.update({
    "SoftmaxCrossEntropyLoss": _loss_samples(r) + [
        Sample([r(4, 5), _labels((4,), 5), pos(5)], dict(reduction="mean"), constants=[1], n_outputs=2,
               name="log_prob output reused"),
        Sample([r(3, 4, 2), _labels((3, 2), 4, ignore=0)], dict(reduction="sum", ignore_index=0), constants=[1],
               n_outputs=2, outputs=(0, 1), name="gradients through loss and log_prob"),
        Sample([r(3, 4), _labels((3,), 4), pos(4)], dict(reduction="none"), constants=[1], n_outputs=2,
               outputs=(1,), name="gradient through log_prob only"),
    ],
    "NegativeLogLikelihoodLoss": _loss_samples(r),
})
# The fused output layer + loss (fuse_linear_cross_entropy writes it with its unit-gradient outputs,
# which its gradient reads: every sample declares all of them).
SAMPLES.update({
    "onnxtrain.LinearSoftmaxCrossEntropy": [
        Sample([r(2, 3, 4), r(4, 5), _labels((2, 3), 5)], dict(reduction="mean"), constants=[2], n_outputs=3,
               domain="onnxtrain", name="mean, [B, S, K] rows"),
        Sample([r(6, 4), r(5, 4), _labels((6,), 5, ignore=-100), r(5)], dict(reduction="mean", transB=1, ignore_index=-100),
               constants=[2], n_outputs=4, domain="onnxtrain", name="transB, bias, ignored rows"),
        Sample([r(3, 2, 4), r(4, 7), _labels((3, 2), 7, ignore=1)], dict(reduction="sum", ignore_index=1),
               constants=[2], n_outputs=3, domain="onnxtrain", name="sum, a class ignored"),
    ],
})
# onnxtrain's copies of the two loss ops, for models older than ai.onnx opset 12.
SAMPLES.update({
    f"onnxtrain.{op}": [dataclasses.replace(s, domain="onnxtrain", opset=11) for s in _loss_samples(r)]
    for op in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")
})
