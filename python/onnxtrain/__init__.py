"""onnxtrain: train ONNX models, fast, from C++ first.

The inference API mirrors ONNX Runtime's, so migrating is a change of imports::

    import onnxtrain
    sess = onnxtrain.InferenceSession("model.onnx")
    outputs = sess.run(None, {"input": x})

The submodules ``onnxtrain.autodiff``, ``onnxtrain.artifacts`` and ``onnxtrain.api`` are imported with
the package; ``onnxtrain.torch`` is imported on first use, since it imports torch.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _C
from ._C import Error, InvalidArgument, InvalidModel, NotImplemented, SessionOptions  # noqa: A004

__all__ = [
    "InferenceSession", "SessionOptions", "NodeArg", "Error", "InvalidArgument", "InvalidModel",
    "NotImplemented", "set_num_threads", "registered_ops", "cpu_features", "gpu_features", "resource_limits",
    "set_resource_limits",
]

_ONNX_TYPE_NAMES = {
    "float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)", "int8": "tensor(int8)", "uint8": "tensor(uint8)",
    "int16": "tensor(int16)", "uint16": "tensor(uint16)", "int32": "tensor(int32)",
    "uint32": "tensor(uint32)", "int64": "tensor(int64)", "uint64": "tensor(uint64)",
    "bool": "tensor(bool)",
}


class NodeArg:
    """An input or output of a session: ``name``, ``shape`` (ints, dim names or None), ``type``."""

    def __init__(self, info: "_C.IoInfo"):
        self.name: str = info.name
        self.shape: Optional[List[Union[int, str, None]]] = info.shape if info.rank_known else None
        self.type: str = _ONNX_TYPE_NAMES.get(info.dtype, f"tensor({info.dtype})")
        if info.sequence:
            self.type = f"seq({self.type})"
        if info.optional:
            self.type = f"optional({self.type})"
        self._sequence = info.sequence

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _model_arg(model: Any) -> Union[str, bytes]:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):  # onnx.ModelProto
        return model.SerializeToString()
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


class InferenceSession:
    """Runs an ONNX model on CPU.

    ``model`` is a path, serialized bytes or an ``onnx.ModelProto``. ``providers`` is accepted for
    ONNX Runtime compatibility; only the CPU is used.
    """

    def __init__(self, model: Any, sess_options: Optional[SessionOptions] = None,
                 providers: Optional[Sequence[Any]] = None, num_threads: int = 0):
        options = sess_options or SessionOptions()
        if num_threads:
            options.num_threads = num_threads
        self._sess = _C.InferenceSession(_model_arg(model), options)
        self._inputs = [NodeArg(i) for i in self._sess.inputs()]
        self._outputs = [NodeArg(o) for o in self._sess.outputs()]

    def get_inputs(self) -> List[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        return list(self._outputs)

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any],
            run_options: Any = None) -> List[np.ndarray]:
        """Returns the requested outputs (all when ``output_names`` is None) as numpy arrays; a
        sequence input or output is a list of arrays, an empty optional None."""
        sequences = {i.name for i in self._inputs if i._sequence}
        feeds = {name: (None if value is None else
                        [np.asarray(v, order="C") for v in value]
                        if name in sequences and isinstance(value, (list, tuple)) else
                        np.asarray(value, order="C"))
                 for name, value in input_feed.items()}
        return self._sess.run(list(output_names or []), feeds)

    def memory_report(self) -> str:
        """Planned arena bytes against naive allocation, for the last run's plan."""
        return self._sess.memory_report()

    def profile(self) -> List[Dict[str, Any]]:
        """Per-node kernel times (node, op_type, calls, total_us), in execution order.

        Empty unless the session was made with ``SessionOptions.enable_profiling = True``."""
        return self._sess.profile()

    def profile_report(self) -> str:
        """Kernel time summed by op type, slowest first."""
        return self._sess.profile_report()


def set_num_threads(n: int) -> None:
    _C.set_num_threads(n)


def resource_limits() -> Dict[str, int]:
    """The process-wide limits: ``max_alloc_bytes`` (tensor storage alive at once; default
    ONNXTRAIN_MAX_ALLOC, else the machine's memory) and ``max_loop_iterations`` (per Loop run;
    default ONNXTRAIN_MAX_LOOP_ITERATIONS, else 10,000,000). 0 means no limit."""
    return _C.resource_limits()


def set_resource_limits(max_alloc_bytes: Optional[int] = None, max_loop_iterations: Optional[int] = None) -> None:
    """Changes the limits given (the others stay). Past them a model fails with onnxtrain.Error
    naming the allocation or the Loop, instead of exhausting the machine."""
    _C.set_resource_limits(max_alloc_bytes, max_loop_iterations)


def registered_ops() -> List[Dict[str, Any]]:
    """Every registered op: domain, type, since-version, kernel, shape rule and gradient status."""
    return _C.registered_ops()


def cpu_features() -> Dict[str, Any]:
    """What this CPU offers for mixed precision and what the engine does with it: CPUID flags the
    OS has enabled (``avx2``, ``fma``, ``f16c``, ``avx512f``, ``avx512bw``, ``avx512_vnni``,
    ``avx512_bf16``, ``avx512_fp16``, ``amx_tile``, ``amx_bf16``, ``amx_int8``, ``amx_fp16``),
    ``vendor``, ``model`` (the brand string), ``onednn_isa`` (what oneDNN dispatches to),
    ``bf16_matmul_native`` / ``fp16_matmul_native`` (False: those products compute through fp32 on
    this CPU), ``gemm_gflops`` (``fp32``, ``bf16``: one 256 x 512 x 512 product's rate, measured
    once per process, or ``ONNXTRAIN_GEMM_RATES``; ``source`` says which) and ``bf16_pays`` (bf16
    GEMMs faster than fp32 ones: where False, bf16 mixed precision saves memory but slows steps,
    and asking for it prints a note once)."""
    return _C.cpu_features()


def gpu_features() -> Dict[str, Any]:
    """The GPU a ``device="cuda"`` Module would use: ``available``, and ``description`` (name,
    compute capability, multiprocessors, memory) where there is one, or ``reason`` where not (a build
    without CUDA, no driver, no device)."""
    return _C.gpu_features()


# Imported last: they use the helpers above (_model_arg).
from . import api, artifacts, autodiff  # noqa: E402


def __getattr__(name: str) -> Any:
    if name == "torch":
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
