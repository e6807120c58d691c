"""Samples for the fused forward ops in src/ops/fused/."""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(11)

SAMPLES = {
    "onnxtrain.Gelu": [Sample([rng.standard_normal((3, 5)) * 2], domain="onnxtrain", name="matrix"),
                       Sample([np.array(0.3)], domain="onnxtrain", name="scalar"),
                       Sample([rng.standard_normal((3, 5)) * 3], attrs=dict(approximate="tanh"), domain="onnxtrain",
                              name="tanh form")],
    "Gelu": [Sample([rng.standard_normal((2, 4))], opset=20, name="ai.onnx opset 20"),
             Sample([rng.standard_normal((2, 4)) * 2], attrs=dict(approximate="tanh"), opset=20,
                    name="ai.onnx opset 20, tanh form")],
}
