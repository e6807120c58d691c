"""Writes mlp_classifier.onnx: a 2 -> 32 -> 32 -> 3 ReLU MLP (input "x" [N, 2] float32, output
"logits" [N, 3]), with torch.nn.Linear's initialisation from a fixed seed. The C example
(examples/c/train_mlp.c) and the C API tests train it.

    /usr/bin/python3 tests/models/make_mlp_classifier.py [OUT.onnx]
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZES = [2, 32, 32, 3]


def linear(rng, fan_in, fan_out, name):
    # torch.nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight [out, in] and bias.
    bound = 1.0 / np.sqrt(fan_in)
    w = rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32)
    b = rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32)
    return [numpy_helper.from_array(w, f"{name}.weight"), numpy_helper.from_array(b, f"{name}.bias")]


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    value = "x"
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        name = f"fc{i + 1}"
        inits += linear(rng, fan_in, fan_out, name)
        last = i == len(SIZES) - 2
        out = "logits" if last else f"{name}_out"
        nodes.append(helper.make_node("Gemm", [value, f"{name}.weight", f"{name}.bias"], [out], name=name, transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i + 1}"], name=f"relu{i + 1}"))
            out = f"relu{i + 1}"
        value = out
    graph = helper.make_graph(
        nodes, "mlp_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIZES[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", SIZES[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_mlp_classifier")
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "mlp_classifier.onnx")
    onnx.save(build(), out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
