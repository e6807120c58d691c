"""Runs one ONNX or onnxtrain-domain node through onnxtrain.InferenceSession, for kernel tests."""
import numpy as np
from onnx import TensorProto, helper

import onnxtrain

ELEM_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def run_node(op, inputs, attrs, num_outputs=1, domain=""):
    """The node's outputs (a list) for numpy inputs; the model declares opset 17 and onnxtrain 1."""
    names = [f"in{i}" for i in range(len(inputs))]
    outputs = [f"out{i}" for i in range(num_outputs)]
    elem = ELEM_TYPES[inputs[0].dtype.type]
    node = helper.make_node(op, names, outputs, domain=domain, **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, elem, a.shape)
                                           for n, a in zip(names, inputs)],
                              [helper.make_tensor_value_info(o, elem, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)])
    return onnxtrain.InferenceSession(model.SerializeToString()).run(None, dict(zip(names, inputs)))
