"""A generic finite-difference gradient checker for single ops (float64, central differences).

For a node y = op(x...), the checker builds the gradient graph with onnxtrain's autodiff, feeds a
random upstream gradient w for each non-scalar output (scalar outputs are seeded with 1), and
compares d/dx sum(w * y) from the graph with central differences. Failures name the seed.
An input or output may be a sequence (a list of arrays): its elements are weighted, seeded and
perturbed one by one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain import _C

_NP_TO_ONNX = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.float32): TensorProto.FLOAT,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
               np.dtype(np.bool_): TensorProto.BOOL}


@dataclasses.dataclass
class Sample:
    """One gradient check: the op's inputs (None for an omitted optional input, a list of arrays for a
    sequence), attributes, which
    inputs to differentiate (default: every float64 input that is not a constant), which outputs
    to differentiate (default: the first), and inputs passed as initializers (``constants``)."""
    inputs: Sequence[Optional[np.ndarray]]
    attrs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    wrt: Optional[Sequence[int]] = None
    outputs: Sequence[int] = (0,)
    n_outputs: int = 1
    constants: Sequence[int] = ()
    opset: int = 17
    domain: str = ""
    name: str = ""
    rtol: float = 1e-5
    atol: float = 1e-6
    eps: float = 1e-6  # finite-difference step; larger where a float32 intermediate rounds
    # Graph inputs o0, o1, ... that are not the node's inputs: values its subgraphs read by name
    # (If branches). Float64 ones are differentiated too.
    outer: Sequence[np.ndarray] = ()


def _model(op: str, s: Sample):
    inputs, initializers, names = [], [], []
    for i, value in enumerate(s.inputs):
        if value is None:
            names.append("")
            continue
        name = f"x{i}"
        names.append(name)
        if isinstance(value, list):  # a sequence input
            elem = helper.make_tensor_type_proto(_NP_TO_ONNX[np.asarray(value[0]).dtype], None)
            inputs.append(helper.make_value_info(name, helper.make_sequence_type_proto(elem)))
            continue
        arr = np.asarray(value)
        if i in s.constants:
            initializers.append(numpy_helper.from_array(arr, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, _NP_TO_ONNX[arr.dtype], list(arr.shape)))
    for j, value in enumerate(s.outer):
        arr = np.asarray(value)
        inputs.append(helper.make_tensor_value_info(f"o{j}", _NP_TO_ONNX[arr.dtype], list(arr.shape)))
    outs = [f"y{k}" for k in range(s.n_outputs)]
    node = helper.make_node(op, names, outs, name=f"{op}_under_test", domain=s.domain, **s.attrs)
    graph = helper.make_graph([node], "gradcheck", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
                              initializer=initializers)
    opsets = [helper.make_opsetid("", s.opset)]
    if s.domain:
        opsets.append(helper.make_opsetid(s.domain, 1))
    return helper.make_model(graph, opset_imports=opsets)


def _as_value(v):
    return [np.asarray(e) for e in v] if isinstance(v, list) else np.asarray(v)


def _dtype(v):
    return np.asarray(v[0] if isinstance(v, list) else v).dtype


def check(op: str, s: Sample, seed: int = 0) -> None:
    model = _model(op, s)
    wrt = list(s.wrt) if s.wrt is not None else [
        i for i, v in enumerate(s.inputs)
        if v is not None and _dtype(v) == np.float64 and i not in s.constants]
    feeds = {f"x{i}": _as_value(v) for i, v in enumerate(s.inputs) if v is not None and i not in s.constants}
    feeds.update({f"o{j}": np.asarray(v) for j, v in enumerate(s.outer)})
    wrt_names = [f"x{i}" for i in wrt] + [f"o{j}" for j, v in enumerate(s.outer) if np.asarray(v).dtype == np.float64]
    out_names = [f"y{k}" for k in s.outputs]
    forward = onnxtrain.InferenceSession(model)
    ys = forward.run(out_names, feeds)

    data, grad_names, seed_names = _C.build_gradient_graph(model.SerializeToString(), wrt_names, out_names)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, y in zip(out_names, ys):
        seeded = f"{name}_grad" in seed_names
        draw = rng.standard_normal if seeded else np.ones
        weights[name] = [draw(e.shape) for e in y] if isinstance(y, list) else draw(y.shape)
    grad_sess = onnxtrain.InferenceSession(data)
    grad_feeds = dict(feeds)
    for name, y in zip(out_names, ys):
        if f"{name}_grad" in seed_names:
            w = weights[name]
            grad_feeds[f"{name}_grad"] = ([wk.astype(e.dtype) for wk, e in zip(w, y)] if isinstance(y, list)
                                          else w.astype(y.dtype))
    analytic = grad_sess.run(grad_names, grad_feeds)

    def objective(current) -> float:
        outs = forward.run(out_names, current)
        total = 0.0
        for n, o in zip(out_names, outs):
            pairs = zip(weights[n], o) if isinstance(o, list) else [(weights[n], o)]
            total += float(sum(np.sum(w * e) for w, e in pairs))
        return total

    eps = s.eps
    for i, grad in zip(wrt_names, analytic):
        x = feeds[i]
        sequence = isinstance(x, list)
        elements = x if sequence else [x]
        grads = grad if sequence else [grad]
        assert len(grads) == len(elements), f"{op}: gradient of {i} has {len(grads)} elements, input {len(elements)}"
        for k, (xe, ge) in enumerate(zip(elements, grads)):
            assert ge.shape == xe.shape, f"{op}: gradient of input {i} has shape {ge.shape}, input {xe.shape}"
            numeric = np.zeros_like(xe)
            for idx in np.ndindex(xe.shape):
                plus, minus = xe.copy(), xe.copy()
                plus[idx] += eps
                minus[idx] -= eps
                if sequence:
                    plus, minus = x[:k] + [plus] + x[k + 1:], x[:k] + [minus] + x[k + 1:]
                numeric[idx] = (objective({**feeds, i: plus}) - objective({**feeds, i: minus})) / (2 * eps)
            np.testing.assert_allclose(ge, numeric, rtol=s.rtol, atol=s.atol,
                                       err_msg=f"{op} sample {s.name or s.attrs}: gradient of {i}[{k}] (seed {seed})")


def collect_samples() -> Dict[str, List[Sample]]:
    """Every op's samples, from the modules in grad_samples/ (keyed 'Op' or 'domain.Op')."""
    import importlib
    import pkgutil

    from . import grad_samples
    samples: Dict[str, List[Sample]] = {}
    for mod in pkgutil.iter_modules(grad_samples.__path__):
        module = importlib.import_module(f"{grad_samples.__name__}.{mod.name}")
        for key, value in module.SAMPLES.items():
            samples.setdefault(key, []).extend(value)
    return samples
