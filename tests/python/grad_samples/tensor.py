"""Samples for the tensor-manipulation ops in src/ops/tensor/ and their backward ops.

Index, shape, axes, pads and repeat inputs are int64 initializers (``constants``); every float64
input that is not a constant is differentiated. Index samples repeat and negate indices so that
accumulation and normalisation are checked.
"""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(23)


def r(*shape):
    return rng.standard_normal(shape)


def i64(*values):
    return np.array(values, np.int64)


def onnxtrain(inputs, **kw):
    return Sample(inputs, domain="onnxtrain", **kw)


SAMPLES = {
    # ---- views ----
    "Reshape": [
        Sample([r(3, 4), i64(2, -1, 2)], constants=[1], name="infer"),
        Sample([r(2, 3, 4), i64(0, 12)], constants=[1], name="copy dim"),
        Sample([r(1), np.array([], np.int64)], constants=[1], name="to scalar"),
        Sample([r(2, 0, 3), i64(0, 2, 3)], attrs={"allowzero": 1}, constants=[1], name="empty, allowzero"),
        Sample([r(3, 2), i64(6)], constants=[1], opset=11, name="opset 11"),
    ],
    "Flatten": [
        Sample([r(2, 3, 4)], name="default axis"),
        Sample([r(2, 3, 4)], attrs={"axis": 0}, name="axis 0"),
        Sample([r(2, 1, 4)], attrs={"axis": -1}, name="axis -1"),
        Sample([r(2, 3)], attrs={"axis": 2}, name="axis = rank"),
        Sample([r(2, 0, 3)], attrs={"axis": 2}, name="empty"),
    ],
    "Squeeze": [
        Sample([r(1, 3, 1, 2)], name="all size-1"),
        Sample([r(1, 3, 1, 2), i64(0, -2)], constants=[1], name="axes input, negative"),
        Sample([r(3, 1, 2)], attrs={"axes": [1]}, opset=11, name="axes attribute"),
        Sample([r(1, 1)], name="to scalar"),
    ],
    "Unsqueeze": [
        Sample([r(3, 4), i64(0, -1)], constants=[1], name="axes input, negative"),
        Sample([r(3, 4)], attrs={"axes": [1]}, opset=11, name="axes attribute"),
        Sample([np.array(0.7), i64(0)], constants=[1], name="scalar"),
        Sample([r(0, 2), i64(1)], constants=[1], name="empty"),
    ],
    "Identity": [
        Sample([r(2, 3)], name="matrix"),
        Sample([np.array(1.5)], name="scalar"),
    ],
    # ---- concat / split ----
    "Concat": [
        Sample([r(2, 1), r(2, 3), r(2, 2)], attrs={"axis": 1}, name="axis 1"),
        Sample([r(2, 3, 1), r(2, 3, 2)], attrs={"axis": -1}, name="axis -1"),
        Sample([r(3), r(0), r(2)], attrs={"axis": 0}, name="empty part"),
        Sample([r(2, 3)], attrs={"axis": -2}, name="single input"),
        Sample([r(1, 2, 3), r(2, 2, 3)], attrs={"axis": -3}, name="axis -3"),
    ],
    "Split": [
        Sample([r(6, 4)], attrs={"axis": 0}, n_outputs=3, outputs=(0, 1, 2), name="equal parts"),
        Sample([r(2, 6), i64(1, 2, 3)], attrs={"axis": -1}, constants=[1], n_outputs=3, outputs=(0, 1, 2),
               name="split input"),
        Sample([r(2, 6), i64(1, 2, 3)], attrs={"axis": 1}, constants=[1], n_outputs=3, outputs=(0, 2),
               name="unused output"),
        Sample([r(3, 2), i64(2, 0, 1)], constants=[1], n_outputs=3, outputs=(0, 1, 2), name="empty part"),
        Sample([r(4, 3)], attrs={"axis": 0, "split": [3, 1]}, opset=11, n_outputs=2, outputs=(0, 1),
               name="split attribute"),
    ],
    # ---- slicing ----
    "Slice": [
        Sample([r(5, 4), i64(1, 0), i64(4, 3)], constants=[1, 2], name="starts, ends"),
        Sample([r(5, 4), i64(-1), i64(-100), i64(0), i64(-1)], constants=[1, 2, 3, 4], name="reverse"),
        Sample([r(4, 7), i64(5), i64(0), i64(-1), i64(-2)], constants=[1, 2, 3, 4], name="step -2"),
        Sample([r(3, 6, 2), i64(1, 0), i64(2**62, 2), i64(-2, 0), i64(2, 1)], constants=[1, 2, 3, 4],
               name="step 2, clamped end"),
        Sample([r(4, 3), i64(2), i64(2), i64(0)], constants=[1, 2, 3], name="empty result"),
        Sample([r(4, 5)], attrs={"starts": [1, -3], "ends": [3, 5], "axes": [0, 1]}, opset=9,
               name="attributes (opset 9)"),
    ],
    "Transpose": [
        Sample([r(2, 3, 4)], name="default perm"),
        Sample([r(2, 3, 4)], attrs={"perm": [1, 2, 0]}, name="perm"),
        Sample([r(1, 3, 1, 2)], attrs={"perm": [3, 0, 2, 1]}, name="size-1 dims"),
        Sample([r(2, 0, 3)], attrs={"perm": [2, 0, 1]}, name="empty"),
    ],
    "Expand": [
        Sample([r(3, 1), i64(2, 3, 4)], constants=[1], name="broadcast and new dims"),
        Sample([r(1), i64(3)], constants=[1], name="1-D"),
        Sample([r(2, 3), i64(1, 1)], constants=[1], name="target smaller"),
        Sample([np.array(0.4), i64(2, 2)], constants=[1], name="scalar"),
        Sample([r(3, 1), i64(3, 0)], constants=[1], name="to empty"),
    ],
    "Tile": [
        Sample([r(2, 3), i64(2, 1)], constants=[1], name="rows"),
        Sample([r(2, 1, 3), i64(1, 3, 2)], constants=[1], name="3-D"),
        Sample([r(4), i64(3)], constants=[1], name="1-D"),
        Sample([r(2, 3), i64(0, 2)], constants=[1], name="zero repeats"),
    ],
    # ---- indexing ----
    "Gather": [
        Sample([r(5, 3), i64(0, 2, -1, 2, 0)], constants=[1], name="axis 0, repeated and negative"),
        Sample([r(2, 4, 3), np.array([[1, -4], [3, 1]], np.int64)], attrs={"axis": 1}, constants=[1],
               name="axis 1, 2-D indices"),
        Sample([r(3, 4), np.array(-2, np.int64)], attrs={"axis": -1}, constants=[1], name="scalar index"),
        Sample([r(3, 4), np.zeros((0,), np.int64)], constants=[1], name="empty indices"),
        Sample([r(4), np.array([3, 3, 3], np.int32)], constants=[1], name="int32 indices"),
    ],
    "GatherElements": [
        Sample([r(3, 4), np.array([[0, 2, -1, 1], [2, 2, 0, -3]], np.int64)], attrs={"axis": 0}, constants=[1],
               name="axis 0"),
        Sample([r(3, 4), np.array([[3, 3, 0], [1, -1, 1], [0, 2, 2]], np.int64)], attrs={"axis": -1},
               constants=[1], name="axis -1, repeated"),
        Sample([r(2, 3, 2), np.array([[[1], [0]]], np.int64)], attrs={"axis": 1}, constants=[1],
               name="indices smaller than data"),
    ],
    "GatherND": [
        Sample([r(3, 4), np.array([[0, 1], [2, -1], [0, 1]], np.int64)], constants=[1], name="elements"),
        Sample([r(3, 4, 2), np.array([[[1]], [[-1]], [[1]]], np.int64)], constants=[1], name="slices"),
        Sample([r(2, 3, 4), np.array([[[1, 0], [2, 3], [1, 0]], [[0, 0], [0, -1], [2, 2]]], np.int64)],
               attrs={"batch_dims": 1}, constants=[1], name="batch_dims 1"),
        Sample([r(2, 3, 4), np.array([[1], [1]], np.int64)], attrs={"batch_dims": 1}, constants=[1],
               name="batch_dims 1, slices"),
    ],
    "ScatterElements": [
        Sample([r(3, 3), np.array([[1, 0, 2], [0, 2, 1]], np.int64), r(2, 3)], constants=[1], name="none, axis 0"),
        Sample([r(2, 4), np.array([[-1, 1], [0, 2]], np.int64), r(2, 2)], attrs={"axis": 1}, constants=[1],
               name="none, axis 1, negative"),
        Sample([r(2, 4), np.array([[1, 1, 3], [0, 2, 0]], np.int64), r(2, 3)], attrs={"axis": 1}, constants=[1],
               name="none, repeated: last write wins"),
        Sample([r(3, 2), np.array([[1, 0], [1, 0], [2, -3]], np.int64), r(3, 2)],
               attrs={"axis": 0, "reduction": "add"}, constants=[1], opset=18, name="add, repeated"),
        Sample([r(3, 2), np.zeros((0, 2), np.int64), r(0, 2)], constants=[1], name="no updates"),
    ],
    "Scatter": [
        Sample([r(3, 3), np.array([[1, 0, 2], [0, 2, 1]], np.int64), r(2, 3)], constants=[1], opset=10,
               name="opset 10"),
        Sample([r(2, 3), np.array([[2], [2]], np.int64), r(2, 1)], attrs={"axis": 1}, constants=[1], opset=9,
               name="opset 9, axis 1"),
    ],
    "ScatterND": [
        Sample([r(4, 3), np.array([[1, 2], [3, 0], [-4, 1]], np.int64), r(3)], constants=[1], name="none, elements"),
        Sample([r(4, 3), np.array([[2], [-1]], np.int64), r(2, 3)], constants=[1], name="none, rows"),
        Sample([r(4, 3), np.array([[2], [0], [2]], np.int64), r(3, 3)], attrs={"reduction": "add"}, constants=[1],
               name="add, repeated rows"),
        Sample([r(2, 2, 2), np.array([[[0, 1]], [[1, 1]]], np.int64), r(2, 1, 2)], constants=[1],
               name="none, batched tuples"),
    ],
    # ---- padding ----
    "Pad": [
        Sample([r(2, 3), i64(1, 0, 2, 1)], constants=[1], name="constant"),
        Sample([r(2, 3), i64(1, 2, 0, 1), np.array(0.5)], constants=[1], name="constant value input"),
        Sample([r(3, 4), i64(-1, 1, 2, -2)], constants=[1], name="constant, cropping"),
        Sample([r(0, 3), i64(1, 0, 1, 1), np.array(2.0)], constants=[1], name="constant, empty input"),
        Sample([r(3, 4), i64(2, 1, 1, 3)], attrs={"mode": "reflect"}, constants=[1], name="reflect"),
        Sample([r(2, 3, 3), i64(0, 1, 2, 0, 2, 1)], attrs={"mode": "reflect"}, constants=[1], name="reflect 3-D"),
        Sample([r(3, 4), i64(2, 1, 1, 3)], attrs={"mode": "edge"}, constants=[1], name="edge"),
        Sample([r(1, 2), i64(2, 1, 1, 3)], attrs={"mode": "edge"}, constants=[1], name="edge, size-1 dim"),
        Sample([r(3, 4), i64(-1, 2, 1, 1)], attrs={"mode": "edge"}, constants=[1], name="edge, cropping"),
        Sample([r(2, 3, 4), i64(2, 1, 3, 0), None, i64(-1, 1)], attrs={"mode": "reflect"}, constants=[1, 3],
               opset=18, name="axes input"),
        Sample([r(2, 3), i64(1, 1, 1, 1), np.array(1.5)], attrs={"mode": "edge"}, constants=[1],
               name="edge, value unused"),
        Sample([r(2, 4)], attrs={"mode": "reflect", "pads": [1, 2, 0, 3]}, opset=10, name="attribute (opset 10)"),
        Sample([r(2, 3)], attrs={"pads": [0, 1, 1, 0], "value": 2.0}, opset=10, name="constant attribute"),
    ],
    # ---- rearrangements ----
    "DepthToSpace": [
        Sample([r(1, 8, 2, 3)], attrs={"blocksize": 2}, name="DCR"),
        Sample([r(2, 8, 2, 1)], attrs={"blocksize": 2, "mode": "CRD"}, name="CRD"),
        Sample([r(1, 9, 1, 2)], attrs={"blocksize": 3, "mode": "CRD"}, name="CRD, b=3"),
    ],
    "SpaceToDepth": [
        Sample([r(1, 2, 4, 6)], attrs={"blocksize": 2}, name="b=2"),
        Sample([r(2, 1, 3, 3)], attrs={"blocksize": 3}, name="b=3"),
    ],
    "Trilu": [
        Sample([r(3, 4)], name="upper"),
        Sample([r(2, 3, 4), np.array(-1, np.int64)], attrs={"upper": 0}, constants=[1], name="lower, k=-1"),
        Sample([r(4, 3), i64(2)], constants=[1], name="upper, k=2"),
        Sample([r(0, 3)], attrs={"upper": 0}, name="empty"),
    ],
    "ReverseSequence": [
        Sample([r(4, 3, 2), i64(4, 2, 0)], attrs={"time_axis": 0, "batch_axis": 1}, constants=[1], name="time major"),
        Sample([r(2, 5), i64(3, 5)], attrs={"time_axis": 1, "batch_axis": 0}, constants=[1], name="batch major"),
    ],
    # ---- selection ----
    "TopK": [
        Sample([r(3, 5), i64(2)], constants=[1], n_outputs=2, name="largest, last axis"),
        Sample([r(4, 3), i64(3)], attrs={"axis": 0, "largest": 0}, constants=[1], n_outputs=2, name="smallest, axis 0"),
        Sample([r(2, 3, 2), i64(0)], attrs={"axis": 1}, constants=[1], n_outputs=2, name="k=0"),
        Sample([r(2, 4)], attrs={"k": 2}, opset=9, n_outputs=2, name="k attribute (opset 9)"),
    ],
    "Compress": [
        Sample([r(4, 2), np.array([True, False, True, True])], attrs={"axis": 0}, constants=[1], name="axis 0"),
        Sample([r(2, 3), np.array([False, True])], attrs={"axis": -1}, constants=[1], name="short condition"),
        Sample([r(2, 3), np.array([True, False, False, True, True])], constants=[1], name="flattened"),
        Sample([r(3, 2), np.array([False, False, False])], attrs={"axis": 0}, constants=[1], name="nothing kept"),
    ],
    # ---- generators ----
    "OneHot": [
        Sample([i64(0, 2, -1, 1), np.array(3, np.int64), np.array([0.25, 1.5])], constants=[0, 1], name="axis -1"),
        Sample([np.array([[1, 0], [2, 2]], np.int64), np.array(3, np.int64), np.array([-1.0, 2.0])],
               attrs={"axis": 0}, constants=[0, 1], name="axis 0"),
    ],
    "Range": [
        Sample([np.array(0.3), np.array(5.1), np.array(0.7)], name="increasing"),
        Sample([np.array(2.0), np.array(-1.1), np.array(-0.6)], name="decreasing"),
    ],
    # ---- backward ops ----
    "onnxtrain.SliceGrad": [
        onnxtrain([r(2, 2), i64(4, 3), i64(3, 0), i64(-100, 3), i64(0, 1), i64(-2, 2)], constants=[1, 2, 3, 4, 5],
                  name="steps"),
        onnxtrain([r(2, 3), i64(4, 3), i64(1), i64(3)], constants=[1, 2, 3], name="starts, ends"),
    ],
    "onnxtrain.GatherGrad": [
        onnxtrain([r(3, 3, 2), i64(3, 4, 2), i64(0, -1, 0)], attrs={"axis": 1}, constants=[1, 2], name="axis 1"),
    ],
    "onnxtrain.GatherElementsGrad": [
        onnxtrain([r(2, 3), i64(3, 3), np.array([[0, 0, 2], [-1, 1, 0]], np.int64)], constants=[1, 2], name="axis 0"),
    ],
    "onnxtrain.GatherNDGrad": [
        onnxtrain([r(2, 3, 4), i64(2, 3, 4), np.array([[[1], [1], [0]], [[2], [0], [-1]]], np.int64)],
                  attrs={"batch_dims": 1}, constants=[1, 2], name="batch_dims 1"),
    ],
    "onnxtrain.ScatterElementsGrad": [
        onnxtrain([r(3, 4), np.array([[1, 3], [1, 0]], np.int64)], attrs={"axis": 1}, constants=[1], n_outputs=2,
                  outputs=(0, 1), name="both outputs"),
        onnxtrain([r(3, 2), np.array([[2, 1], [2, 1]], np.int64)], constants=[1], n_outputs=2, outputs=(1,),
                  name="dUpdates only, repeated"),
    ],
    "onnxtrain.PadGrad": [
        onnxtrain([r(6, 8), i64(2, 1, 1, 3)], attrs={"mode": "reflect"}, constants=[1], name="reflect"),
        onnxtrain([r(4, 6), i64(-1, 2, 1, 1)], attrs={"mode": "edge"}, constants=[1], name="edge"),
        onnxtrain([r(2, 6, 3), i64(1, 2), i64(1)], attrs={"mode": "constant"}, constants=[1, 2], name="axes"),
    ],
}

# Unique has a derivative only where no item repeats (tests/python/test_autodiff.py checks the
# error for a repeated one): random values are distinct.
SAMPLES["Unique"] = [
    Sample([r(6)], name="sorted"),
    Sample([r(2, 3)], attrs={"sorted": 0}, name="flattened, first-occurrence order"),
    Sample([r(3, 2)], attrs={"axis": 0}, name="rows"),
    Sample([r(2, 4)], attrs={"axis": 1, "sorted": 0}, name="columns, unsorted"),
]
