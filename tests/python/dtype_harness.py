"""Runs a gradcheck Sample in float32, bfloat16 or float16 and compares forward and gradient with
float64 on the same (rounded) inputs.

The op under test reads its float inputs through Cast nodes from float64 graph inputs and its
outputs are cast back to float64, so numpy never needs a bfloat16 type and the gradient graph
differentiates the op in the low precision (the Casts' gradients are Casts). The float64
reference runs on the inputs rounded to the dtype first: what is left is the op's own error
(intermediate and output rounding), which per-dtype tolerances bound.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain import _C

from .gradcheck import Sample, _model

DTYPES = {"float32": TensorProto.FLOAT, "bfloat16": TensorProto.BFLOAT16, "float16": TensorProto.FLOAT16}

# |got - want| <= atol * scale + rtol * |want|, scale = max(1, max |want|) per tensor: a few units
# in the last place of each type (bf16 keeps 8 significant bits, fp16 11, fp32 24).
TOLERANCE = {"float32": (1e-4, 1e-4), "bfloat16": (4e-2, 3e-2), "float16": (5e-3, 4e-3)}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float64) rounded to dtype (nearest even), as float64."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    f = x.astype(np.float32)
    if dtype == "float32":
        return f.astype(np.float64)
    bits = np.ascontiguousarray(f).view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = bits.view(np.float32).astype(np.float64)
    out[nan] = np.nan
    return out


def _float_inputs(s: Sample) -> List[int]:
    return [i for i, v in enumerate(s.inputs) if v is not None and np.asarray(v).dtype == np.float64]


def _wrapped_model(op: str, s: Sample, elem: int):
    """The sample's model with its float64 inputs cast to elem before the op and its outputs cast
    back to float64 after it."""
    base = _model(op, s)
    g = base.graph
    node = g.node[0]
    floats = set(_float_inputs(s))
    casts = []
    for i, name in enumerate(node.input):
        if i in floats and name:
            casts.append(helper.make_node("Cast", [name], [name + "_lp"], to=elem))
            node.input[i] = name + "_lp"
    back = []
    for k, out in enumerate(list(node.output)):
        node.output[k] = out + "_lp"
        back.append(helper.make_node("Cast", [out + "_lp"], [out], to=TensorProto.DOUBLE))
    nodes = casts + [node] + back
    del g.node[:]
    g.node.extend(nodes)
    for o in g.output:
        o.type.tensor_type.elem_type = TensorProto.DOUBLE
    return base


def _run(model, s: Sample, feeds: Dict[str, np.ndarray], wrt: List[int], weights: Dict[str, np.ndarray]):
    out_names = [f"y{k}" for k in s.outputs]
    ys = onnxtrain.InferenceSession(model.SerializeToString()).run(out_names, feeds)
    if not wrt:
        return ys, []
    data, grad_names, seed_names = _C.build_gradient_graph(model.SerializeToString(), [f"x{i}" for i in wrt], out_names)
    grad_feeds = dict(feeds)
    for name in out_names:
        if f"{name}_grad" in seed_names:
            grad_feeds[f"{name}_grad"] = weights[name]
    return ys, onnxtrain.InferenceSession(data).run(grad_names, grad_feeds)


def compare(op: str, s: Sample, dtype: str, seed: int,
            tolerance: Optional[Tuple[float, float]] = None) -> None:
    """Forward and gradient of the sample in dtype against float64; raises AssertionError naming
    the op, sample, dtype and seed, or the engine's error when the op has no kernel for dtype."""
    rtol, atol = tolerance or TOLERANCE[dtype]
    floats = _float_inputs(s)
    rounded = [round_to(np.asarray(v), dtype) if i in floats else v for i, v in enumerate(s.inputs)]
    ref_sample = Sample(**{**s.__dict__, "inputs": rounded})
    wrt = list(s.wrt) if s.wrt is not None else [i for i in floats if i not in s.constants]
    feeds = {f"x{i}": np.asarray(v) for i, v in enumerate(rounded) if v is not None and i not in s.constants}

    ref_model = _model(op, ref_sample)
    ref_ys = onnxtrain.InferenceSession(ref_model.SerializeToString()).run([f"y{k}" for k in s.outputs], feeds)
    rng = np.random.default_rng(seed)
    weights = {f"y{k}": round_to(rng.standard_normal(np.shape(y)), dtype) for k, y in zip(s.outputs, ref_ys)}
    ref_ys, ref_grads = _run(ref_model, ref_sample, feeds, wrt, weights)
    test_model = _wrapped_model(op, ref_sample, DTYPES[dtype])
    ys, grads = _run(test_model, ref_sample, feeds, wrt, weights)

    what = f"{op} sample {s.name or s.attrs} in {dtype} (seed {seed})"
    pairs = [(f"output {k}", y, r) for k, y, r in zip(s.outputs, ys, ref_ys)]
    pairs += [(f"gradient of input {i}", g, r) for i, g, r in zip(wrt, grads, ref_grads)]
    for label, got, want in pairs:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert got.shape == want.shape, f"{what}: {label} has shape {got.shape}, float64 gives {want.shape}"
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), f"{what}: {label} is not finite where float64 is"
        if not finite.any():
            continue
        scale = max(1.0, float(np.abs(want[finite]).max()))
        err = np.abs(got[finite] - want[finite])
        bound = atol * scale + rtol * np.abs(want[finite])
        worst = int(np.argmax(err - bound))
        assert (err <= bound).all(), (f"{what}: {label} off by {err[worst]:.3g} (allowed {bound[worst]:.3g}, "
                                      f"float64 {want[finite][worst]:.6g})")
