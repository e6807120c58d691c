"""Counts the floating-point work of an ONNX model's GEMM-like ops (MatMul, Gemm, Conv).

A multiply-add counts as 2 FLOPs. Elementwise, normalisation and pooling ops are not counted: they
are memory bound, and leaving them out makes "achieved GFLOP/s" comparable to the GEMM peak.
Shapes come from onnx shape inference, so the model needs static shapes for the ops counted.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import shape_inference


def _known_shapes(model: onnx.ModelProto) -> Dict[str, List[Optional[int]]]:
    """Maps every value name with a known rank to its dims (None for symbolic dims)."""
    inferred = shape_inference.infer_shapes(model)
    graph = inferred.graph
    shapes: Dict[str, List[Optional[int]]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in tensor_type.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _prod(dims) -> int:
    return int(np.prod(dims, dtype=np.int64)) if len(dims) else 1


def _matmul_flops(a: List[int], b: List[int]) -> int:
    a = [1] + a if len(a) == 1 else a
    b = b + [1] if len(b) == 1 else b
    m, k, n = a[-2], a[-1], b[-1]
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return 2 * _prod(batch) * m * k * n


def _gemm_flops(node: onnx.NodeProto, a: List[int], b: List[int]) -> int:
    attrs = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
    m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
    n = b[0] if attrs.get("transB", 0) else b[1]
    return 2 * m * k * n


def _conv_flops(w: List[int], y: List[int]) -> int:
    # Y: (N, Cout, *spatial), W: (Cout, Cin/group, *kernel): each output element is a dot product
    # of length Cin/group * prod(kernel).
    return 2 * y[0] * y[1] * _prod(y[2:]) * w[1] * _prod(w[2:])


def count_flops(model: onnx.ModelProto) -> Dict[str, int]:
    """Returns FLOPs per op type (MatMul, Gemm, Conv) plus a "total" entry.

    Raises ValueError when a counted op has an input or output whose shape is not fully static.
    """
    shapes = _known_shapes(model)
    flops: Counter = Counter()
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        needed = [node.input[0], node.input[1]] if node.op_type != "Conv" else \
            [node.input[1], node.output[0]]
        dims = [shapes.get(name) for name in needed]
        if any(d is None or None in d for d in dims):
            raise ValueError(f"{node.op_type} node '{node.name}': shapes not static ({dims})")
        if node.op_type == "MatMul":
            flops["MatMul"] += _matmul_flops(*dims)
        elif node.op_type == "Gemm":
            flops["Gemm"] += _gemm_flops(node, *dims)
        else:
            flops["Conv"] += _conv_flops(*dims)
    result = dict(flops)
    result["total"] = sum(flops.values())
    return result
