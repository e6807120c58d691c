"""Samples for onnxtrain's own ops in src/ops/grad/."""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(7)

SAMPLES = {
    "onnxtrain.SumTo": [
        Sample([rng.standard_normal((3, 4)), np.array([4], np.int64)], constants=[1], domain="onnxtrain", name="rows"),
        Sample([rng.standard_normal((2, 3, 4)), np.array([3, 1], np.int64)], constants=[1], domain="onnxtrain",
               name="middle"),
        Sample([rng.standard_normal((2, 3)), np.array([2, 3], np.int64)], constants=[1], domain="onnxtrain",
               name="same"),
    ],
}
