"""Samples for the sequence and optional ops in src/ops/sequence/: sequences as inputs (lists) and
outputs, positions from either end, uneven splits, stacking (new_axis) and squeezing (keepdims=0)."""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(41)


def _r(*shape):
    return rng.standard_normal(shape)


SAMPLES = {
    "SequenceConstruct": [
        Sample([_r(2, 3), _r(2, 3), _r(1, 3)], name="three tensors, one shorter"),
        Sample([_r()], name="one scalar"),
    ],
    "SequenceAt": [
        Sample([[_r(2, 3), _r(4), _r(2, 3)], np.array(1)], name="middle element of a mixed-shape sequence"),
        Sample([[_r(2, 3), _r(2, 3)], np.array(-1, np.int32)], name="negative int32 position"),
    ],
    "SequenceInsert": [
        Sample([[_r(2, 3), _r(4)], _r(3, 1)], name="at the end (no position)"),
        Sample([[_r(2, 3), _r(4)], _r(3, 1), np.array(-2)], name="negative position counts in the input sequence"),
        Sample([[_r(2)], _r(2), np.array(1, np.int32)], name="position n (int32)"),
    ],
    "SequenceErase": [
        Sample([[_r(2, 3), _r(4), _r(1)]], name="the last (no position)"),
        Sample([[_r(2, 3), _r(4), _r(1)], np.array(-3)], name="the first, counted from the back"),
    ],
    "SplitToSequence": [
        Sample([_r(4, 3), np.array([1, 3])], {"axis": 0}, name="sizes along axis 0"),
        Sample([_r(2, 5), np.array(2)], {"axis": 1}, name="pieces of 2, the last one shorter"),
        Sample([_r(2, 3, 2)], {"axis": 1, "keepdims": 0}, name="pieces of 1, squeezed"),
        Sample([_r(2, 3)], {"axis": -1}, name="pieces of 1, kept"),
    ],
    "ConcatFromSequence": [
        Sample([[_r(2, 3), _r(1, 3), _r(3, 3)]], {"axis": 0}, name="uneven extents"),
        Sample([[_r(2, 3), _r(2, 3)]], {"axis": -1, "new_axis": 1}, name="stacked on a new last axis"),
        Sample([[_r(2, 3)]], {"axis": 1}, name="one element"),
    ],
    "Optional": [Sample([_r(2, 3)], opset=15, name="a tensor")],
    "OptionalGetElement": [Sample([_r(3)], opset=18, name="a tensor (opset 18)")],
}
