"""On-device training API, mirroring ``onnxruntime.training.api``.

::

    from onnxtrain.api import CheckpointState
    state = CheckpointState.load_checkpoint("out/checkpoint")
    w = state.parameters["fc.weight"].data          # numpy copy
    state.parameters["fc.weight"].data = new_w      # shape and dtype are checked
    state.properties["epoch"] = 3                   # int, float or str
    CheckpointState.save_checkpoint(state, "out/checkpoint", include_optimizer_state=True)

The checkpoint file is in the safetensors layout, so any safetensors reader opens it.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _C

__all__ = ["CheckpointState", "Parameter", "Parameters", "Properties", "Module", "Optimizer", "StepResult",
           "LinearLRScheduler", "CosineLRScheduler", "StepLRScheduler", "ConstantLRScheduler", "compile_artifacts"]

_NUMPY_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "bfloat16": np.float32,  # numpy has no bfloat16: bfloat16 parameters read and write as float32
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_,
}
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1

PathLike = Union[str, "os.PathLike[str]"]


def _path(p: PathLike) -> str:
    if not isinstance(p, (str, os.PathLike)):
        raise TypeError(f"expected a path (str or os.PathLike), got {type(p).__name__}")
    return os.fspath(p)


class Parameter:
    """One model parameter of a :class:`CheckpointState`: ``name``, ``data``, ``grad``,
    ``requires_grad``, ``shape``, ``dtype``. Obtained from ``state.parameters[name]``; it reads
    the state on every access, so it always shows current values."""

    def __init__(self, state: "_C.CheckpointState", name: str):
        self._state = state
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _info(self):
        return self._state.parameter_info(self._name)

    @property
    def dtype(self) -> str:
        return self._info()[0]

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """The dims; None for a parameter of an ONNX Runtime nominal checkpoint (names and
        dtypes only) until its data is set."""
        shape = self._info()[1]
        return None if shape is None else tuple(shape)

    @property
    def requires_grad(self) -> bool:
        return self._info()[2]

    @property
    def data(self) -> np.ndarray:
        """A copy of the parameter's values. Raises for a nominal checkpoint not yet filled."""
        return self._state.get_parameter_data(self._name)

    @data.setter
    def data(self, value: Any) -> None:
        """Copies ``value`` into the parameter. A numpy array must match the parameter's dtype and
        shape exactly; other values (lists, scalars) are converted to the parameter's dtype."""
        if not isinstance(value, np.ndarray):
            value = np.asarray(value, dtype=_NUMPY_DTYPES.get(self.dtype))
        self._state.set_parameter_data(self._name, np.ascontiguousarray(value))

    @property
    def grad(self) -> Optional[np.ndarray]:
        """A copy of the gradient, or None when no gradient has been computed."""
        return self._state.get_parameter_grad(self._name)

    def __repr__(self) -> str:
        dtype, shape, requires_grad, has_data, _ = self._info()
        extra = "" if has_data else ", nominal"
        return (f"Parameter(name={self._name!r}, dtype={dtype}, shape={None if shape is None else tuple(shape)}, "
                f"requires_grad={requires_grad}{extra})")


class Parameters:
    """The parameters of a state, by name. ``state.parameters["w"]`` is a :class:`Parameter`;
    ``state.parameters["w"] = array`` copies values in. Iterating yields ``(name, Parameter)``
    pairs, as in ONNX Runtime; ``keys()``, ``values()`` and ``items()`` work as for a dict."""

    def __init__(self, state: "_C.CheckpointState"):
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        if not isinstance(name, str):
            raise TypeError(f"parameter names are str, got {type(name).__name__}")
        if not self._state.has_parameter(name):
            raise KeyError(f"no parameter named {name!r} (parameters: {', '.join(self.keys()[:8]) or 'none'}"
                           f"{', ...' if len(self) > 8 else ''})")
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value: Any) -> None:
        self[name].data = value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._state.has_parameter(name)

    def __len__(self) -> int:
        return len(self._state.parameter_names())

    def __iter__(self) -> Iterator[Tuple[str, Parameter]]:
        for name in self._state.parameter_names():
            yield name, Parameter(self._state, name)

    def keys(self) -> List[str]:
        return list(self._state.parameter_names())

    def values(self) -> List[Parameter]:
        return [Parameter(self._state, n) for n in self._state.parameter_names()]

    def items(self) -> List[Tuple[str, Parameter]]:
        return list(self)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __repr__(self) -> str:
        return f"Parameters({self.keys()!r})"


def _check_property_value(name: str, value: Any) -> Tuple[str, Union[int, float, str]]:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"property {name!r}: bool values are not supported; use int, float or str")
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(f"property {name!r}: int {value} does not fit in 64 bits")
        return "int", value
    if isinstance(value, (float, np.floating)):
        return "float", float(value)
    if isinstance(value, str):
        return "str", value
    raise TypeError(f"property {name!r}: values of type {type(value).__name__} are not supported; "
                    f"use int, float or str")


class Properties:
    """User properties of a state (int, float or str values), by name. Iterating yields
    ``(name, value)`` pairs, as in ONNX Runtime; ``keys()``, ``values()`` and ``items()`` work as
    for a dict."""

    def __init__(self, state: "_C.CheckpointState"):
        self._state = state

    def __getitem__(self, name: str) -> Union[int, float, str]:
        if not isinstance(name, str) or not self._state.has_property(name):
            raise KeyError(f"no property named {name!r} (properties: {', '.join(self.keys()) or 'none'})")
        return self._state.get_property(name)

    def __setitem__(self, name: str, value: Union[int, float, str]) -> None:
        if not isinstance(name, str):
            raise TypeError(f"property names are str, got {type(name).__name__}")
        kind, v = _check_property_value(name, value)
        if kind == "int":
            self._state.set_int_property(name, v)
        elif kind == "float":
            self._state.set_float_property(name, v)
        else:
            self._state.set_string_property(name, v)

    def __delitem__(self, name: str) -> None:
        if not (isinstance(name, str) and self._state.remove_property(name)):
            raise KeyError(f"no property named {name!r}")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._state.has_property(name)

    def __len__(self) -> int:
        return len(self._state.property_names())

    def __iter__(self) -> Iterator[Tuple[str, Union[int, float, str]]]:
        for name in self._state.property_names():
            yield name, self._state.get_property(name)

    def keys(self) -> List[str]:
        return list(self._state.property_names())

    def values(self) -> List[Union[int, float, str]]:
        return [v for _, v in self]

    def items(self) -> List[Tuple[str, Union[int, float, str]]]:
        return list(self)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __repr__(self) -> str:
        return f"Properties({dict(self.items())!r})"


class CheckpointState:
    """The state of training: parameters (with gradients), optimizer state and user properties.

    Create it with :meth:`load_checkpoint` (or :meth:`from_onnx_model`); save it with
    :meth:`save_checkpoint`.
    """

    def __init__(self, state: "_C.CheckpointState"):
        if not isinstance(state, _C.CheckpointState):
            raise TypeError(f"CheckpointState wraps a native state; got {type(state).__name__}. "
                            f"Use CheckpointState.load_checkpoint(path).")
        self._state = state
        self._parameters = Parameters(state)
        self._properties = Properties(state)

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: PathLike) -> "CheckpointState":
        """Loads and validates a checkpoint file (onnxtrain.Error subclasses on failure): onnxtrain's
        format or ONNX Runtime's (versions 1 and 2, nominal, external data in ``<path>.data``),
        told apart by the file's bytes."""
        return cls(_C.CheckpointState.load(_path(checkpoint_uri)))

    @classmethod
    def save_checkpoint(cls, state: "CheckpointState", checkpoint_uri: PathLike,
                        include_optimizer_state: bool = False, format: str = "onnxtrain") -> None:
        """Writes ``state`` atomically: on failure the previous file is left as it was.
        ``format="ort"`` writes ONNX Runtime's training checkpoint (loads in
        ``onnxruntime.training.api.CheckpointState.load_checkpoint``; tensors go to
        ``<path>.data`` past 1800 MiB, float properties are stored as float32)."""
        if not isinstance(state, CheckpointState):
            raise TypeError(f"expected a CheckpointState, got {type(state).__name__}")
        if format not in ("onnxtrain", "ort"):
            raise ValueError(f"format: expected 'onnxtrain' or 'ort', got {format!r}")
        state._state.save(_path(checkpoint_uri), bool(include_optimizer_state), format)

    @staticmethod
    def checkpoint_format(checkpoint_uri: PathLike) -> str:
        """``"onnxtrain"`` or ``"ort"``: the format of a checkpoint file, from its bytes."""
        return _C.CheckpointState.file_format(_path(checkpoint_uri))

    @classmethod
    def from_onnx_model(cls, model: Any, requires_grad: Sequence[str] = (),
                        nominal: bool = False) -> "CheckpointState":
        """A state holding every initializer of ``model`` (path, bytes or onnx.ModelProto) as a
        parameter; those named in ``requires_grad`` are trainable. ``nominal``: shapes only."""
        if isinstance(model, (bytes, bytearray)):
            arg: Union[str, bytes] = bytes(model)
        elif isinstance(model, (str, os.PathLike)):
            arg = os.fspath(model)
        elif hasattr(model, "SerializeToString"):
            arg = model.SerializeToString()
        else:
            raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")
        if isinstance(requires_grad, str):
            raise TypeError("requires_grad must be a sequence of names, not a str")
        return cls(_C.CheckpointState.from_onnx_model(arg, list(requires_grad), bool(nominal)))

    @property
    def parameters(self) -> Parameters:
        return self._parameters

    @property
    def properties(self) -> Properties:
        return self._properties

    def is_nominal(self) -> bool:
        """True when some parameter has shapes and dtype only, no data."""
        return self._state.is_nominal()

    def to_contiguous_buffer(self, trainable_only: bool = True) -> np.ndarray:
        """The (trainable) parameters concatenated into one 1-D array, in parameter order."""
        return self._state.to_contiguous_buffer(trainable_only)

    def fill_parameters_from_buffer(self, buffer: np.ndarray, trainable_only: bool = True) -> None:
        """Copies a 1-D buffer (as from :meth:`to_contiguous_buffer`) into the parameters; fills
        a nominal checkpoint. The buffer is checked whole before anything is written."""
        self._state.fill_parameters_from_buffer(np.ascontiguousarray(buffer), trainable_only)

    # ONNX Runtime's older API indexed properties on the state itself.
    def __getitem__(self, name: str) -> Union[int, float, str]:
        return self._properties[name]

    def __setitem__(self, name: str, value: Union[int, float, str]) -> None:
        self._properties[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._properties

    def __repr__(self) -> str:
        return (f"CheckpointState({len(self._parameters)} parameters, {len(self._properties)} properties"
                f"{', optimizer state' if self._state.has_optimizer_state() else ''}"
                f"{', nominal' if self.is_nominal() else ''})")


def compile_artifacts(artifact_directory: PathLike, input_shapes: Optional[dict] = None) -> List[str]:
    """Pre-compiles the artifacts of ``artifact_directory`` (``onnxtrain compile``): writes
    ``training_model.otc``, ``eval_model.otc`` and ``optimizer_model.otc`` next to the ONNX files, with
    the memory plans for ``input_shapes`` (input name -> dims; inputs with a static declared shape need
    none). :class:`Module` and :class:`Optimizer` load them instead of the ONNX files while they are
    valid, and ignore a stale or damaged one with a note on stderr. Returns the paths written.
    """
    shapes = {str(name): [int(d) for d in dims] for name, dims in (input_shapes or {}).items()}
    return list(_C.compile_artifacts(_path(artifact_directory), shapes))


class Module:
    """Runs the training graph (``module(*inputs)`` in train mode: forward, backward and gradient
    accumulation; returns the loss) or, after :meth:`eval`, the eval graph (returns its outputs).

    Mirrors ``onnxruntime.training.api.Module``. Parameters stay in ``state`` and are read in place.
    A valid pre-compiled model next to an ONNX file (:func:`compile_artifacts`) is loaded instead.
    ``device="cuda"`` (a build with CUDA, on a machine with a GPU) runs the graphs on the GPU; the
    parameters stay on the host and are copied in each step, and the optimizer updates on the CPU.
    """

    def __init__(self, train_model_uri: PathLike, state: CheckpointState,
                 eval_model_uri: Optional[PathLike] = None, device: str = "cpu"):
        # ORT spells the first GPU "cuda" or "cuda:0"; one GPU is all a Module uses.
        if device not in ("cpu", "cuda", "cuda:0"):
            raise ValueError(f"device should be 'cpu' or 'cuda', got {device!r}")
        if not isinstance(state, CheckpointState):
            raise TypeError(f"expected a CheckpointState, got {type(state).__name__}")
        self._state = state
        self._train_model_uri = _path(train_model_uri)
        self._module = _C.Module(_path(train_model_uri), state._state,
                                 _path(eval_model_uri) if eval_model_uri is not None else "",
                                 "cpu" if device == "cpu" else "cuda")
        self._training = True

    def __call__(self, *user_inputs: Any) -> Union[np.ndarray, List[np.ndarray]]:
        inputs = [np.asarray(x, order="C") for x in user_inputs]
        outputs = self._module.train_step(inputs) if self._training else self._module.eval_step(inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def train(self, mode: bool = True) -> "Module":
        self._training = bool(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    @property
    def training(self) -> bool:
        return self._training

    def memory_report(self) -> str:
        """The training graph's arena after the last train step: planned bytes, peak live bytes and
        the part held by stashed activations (what the memory optimizer reduces)."""
        return self._module.memory_report()

    def profile(self) -> List[Dict[str, Any]]:
        """Per-node kernel times of the training graph (node, op_type, calls, total_us), in
        execution order, summed since the Module was made; the optimizer's update is not in it.
        Empty unless ONNXTRAIN_PROFILE=1 was set in the environment when the Module was made."""
        return self._module.profile()

    def lazy_reset_grad(self) -> None:
        """The next train step overwrites the gradients instead of adding to them."""
        self._module.lazy_reset_grad()

    def input_names(self) -> List[str]:
        return self._module.input_names(self._training)

    def output_names(self) -> List[str]:
        return self._module.output_names(self._training)

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        return self._module.get_parameters_size(trainable_only)

    def get_contiguous_parameters(self, trainable_only: bool = False) -> np.ndarray:
        return self._module.get_contiguous_parameters(trainable_only)

    def copy_buffer_to_parameters(self, buffer: np.ndarray, trainable_only: bool = True) -> None:
        self._module.copy_buffer_to_parameters(np.ascontiguousarray(buffer), trainable_only)

    def export_model_for_inferencing(self, inference_model_uri: PathLike,
                                     graph_output_names: Sequence[str], merge_lora: bool = False) -> None:
        """Writes the eval graph with the current parameters as initializers and these outputs.
        With LoRA artifacts and ``merge_lora``, adapters on fp32 weights are folded in
        (W += alpha/rank (B A)^T); adapters on an int4 (MatMulNBits) base are kept as base + adapter
        branch, since re-quantizing would add the quantization error to the trained update."""
        self._module.export_model_for_inferencing(_path(inference_model_uri), list(graph_output_names))
        if merge_lora:
            _C.merge_lora_file(_path(inference_model_uri))

    def export_adapters(self, path: PathLike) -> str:
        """Writes the LoRA adapters with PEFT's key names (``base_model.model.<module>.lora_A.weight``).
        A path ending in ``.safetensors`` is that file; any other path is a directory that gets
        PEFT's ``adapter_model.safetensors`` and ``adapter_config.json`` (``target_modules``: the
        adapted modules' full paths, which PEFT matches exactly), which
        ``peft.PeftModel.from_pretrained(model, path)`` loads. Returns the file written."""
        path = _path(path)
        info = _C.lora_info(self._train_model_uri)
        if path.endswith(".safetensors"):
            file = path
        else:
            os.makedirs(path, exist_ok=True)
            file = os.path.join(path, PEFT_ADAPTER_FILE)
            config = {"peft_type": "LORA", "r": info["rank"], "lora_alpha": info["alpha"],
                      "lora_dropout": info["dropout"], "target_modules": sorted(a["module"] for a in info["adapters"]),
                      "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
                      "modules_to_save": None, "base_model_name_or_path": None, "task_type": None,
                      "inference_mode": True}
            with open(os.path.join(path, PEFT_CONFIG_FILE), "w") as f:
                json.dump(config, f, indent=2)
        _C.export_lora_adapters(self._train_model_uri, self._state._state, file)
        return file

    def import_adapters(self, path: PathLike) -> None:
        """Sets the LoRA adapters from a PEFT adapter: a directory with ``adapter_model.safetensors``
        and ``adapter_config.json`` (its rank and alpha must be the artifacts', and it must use
        plain LoRA: no rsLoRA, DoRA, bias, modules_to_save, or per-module ``rank_pattern`` /
        ``alpha_pattern``), or the ``.safetensors`` file alone. The file alone carries no alpha:
        only the ranks (the tensors' shapes) are checked, and the adapters are scaled by the
        artifacts' alpha/rank whatever alpha they were trained with. The adapters must cover
        exactly the modules these artifacts adapt, with the same shapes; on any error nothing
        changes. ``CheckpointState.save_checkpoint`` then keeps them."""
        path = _path(path)
        info = _C.lora_info(self._train_model_uri)
        if not info["adapters"]:
            raise _C.InvalidArgument(f"import_adapters: '{self._train_model_uri}' has no LoRA adapters")
        file = path
        if not path.endswith(".safetensors"):
            file = os.path.join(path, PEFT_ADAPTER_FILE)
            config_path = os.path.join(path, PEFT_CONFIG_FILE)
            with open(config_path) as f:
                config = json.load(f)
            expected = {"peft_type": "LORA", "r": info["rank"], "lora_alpha": info["alpha"], "use_rslora": False,
                        "use_dora": False, "bias": "none", "modules_to_save": None, "fan_in_fan_out": False}
            for key, want in expected.items():
                got = config.get(key, want)
                if got != want and not (key == "lora_alpha" and float(got) == float(want)):
                    raise _C.InvalidArgument(f"import_adapters: '{config_path}': {key} is {got!r}, these artifacts need {want!r}")
            # Per-module ranks or alphas would scale some adapters otherwise than the artifacts' one
            # alpha/rank: silently wrong outputs, so refused.
            for key in ("rank_pattern", "alpha_pattern"):
                if config.get(key):
                    raise _C.InvalidArgument(f"import_adapters: '{config_path}': {key} is {config[key]!r}; these artifacts "
                                             f"scale every adapter by one alpha/rank ({info['alpha']}/{info['rank']}), "
                                             "per-module ranks and alphas are not supported")
        _C.import_lora_adapters(self._train_model_uri, self._state._state, file)


PEFT_ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's file names in an adapter directory
PEFT_CONFIG_FILE = "adapter_config.json"


class StepResult(NamedTuple):
    """What :meth:`Optimizer.step` did. ``skipped``: fp16 artifacts' loss scaler found an inf or
    NaN gradient, so the parameters, moments and step count were left alone and the scale halved.
    ``loss_scale``: the scale after the step (0.0 for artifacts without loss scaling).
    ``grad_norm``: the global gradient norm when clipping computed it, else -1.0."""
    skipped: bool
    loss_scale: float
    grad_norm: float


class Optimizer:
    """Applies the optimizer model's update rule to the module's parameters: one fused
    multi-tensor pass per :meth:`step`. Moments and the step count live in the checkpoint."""

    def __init__(self, optimizer_uri: PathLike, module: Module, data_parallel: bool = False,
                 bucket_bytes: int = 25 << 20, check_every: int = 0, timeout_seconds: float = 300.0,
                 overlap: bool = True, gradient_accumulation_steps: int = 1):
        """With ``data_parallel=True`` the gradients are averaged over the ranks of
        :func:`onnxtrain.distributed.init` before every :meth:`step` (allreduce in buckets of
        ``bucket_bytes``); ``check_every`` N compares a parameter checksum across ranks every N
        steps (debug); ``timeout_seconds`` bounds how long a rank waits for the others. With
        ``overlap`` (default) each bucket is reduced on a communication thread during the backward
        of the update's last ``Module.train_step`` (``gradient_accumulation_steps`` train steps per
        optimizer step; one more before :meth:`step` is an error); the results are the same bits
        as without. All ranks must construct it together from the same artifacts and checkpoint
        (a hash is compared)."""
        if not isinstance(module, Module):
            raise TypeError(f"expected a Module, got {type(module).__name__}")
        self._module = module
        self._optimizer = _C.Optimizer(_path(optimizer_uri), module._module)
        if data_parallel:
            from . import distributed
            distributed.init()
            self._optimizer.set_data_parallel(True, int(bucket_bytes), int(check_every), float(timeout_seconds),
                                              bool(overlap), int(gradient_accumulation_steps))

    def data_parallel_stats(self) -> dict:
        """What the gradient allreduces cost so far: steps, calls, bytes (per rank), seconds (pack,
        allreduce, unpack), wait_seconds (of those, the time the training thread waited: less
        than seconds when overlapped), overlapped_steps."""
        return self._optimizer.data_parallel_stats()

    def step(self) -> StepResult:
        stats = self._optimizer.step()
        return StepResult(bool(stats["skipped"]), float(stats["loss_scale"]), float(stats["grad_norm"]))

    def set_learning_rate(self, learning_rate: float) -> None:
        self._optimizer.set_learning_rate(float(learning_rate))

    def get_learning_rate(self) -> float:
        return self._optimizer.get_learning_rate()


class _Scheduler:
    """Sets the optimizer's learning rate from the schedule at the optimizer's step count, as
    ONNX Runtime's schedulers do: a run resumed from a checkpoint continues its schedule."""

    def __init__(self, optimizer: Optimizer, native_class: Any, *args: Any):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected an Optimizer, got {type(optimizer).__name__}")
        self._optimizer = optimizer
        self._native = native_class(optimizer._optimizer, *args)  # sets the learning rate

    def step(self) -> float:
        """Call after ``Optimizer.step()``: sets and returns the learning rate of the next update."""
        return self._native.step()

    def lr_at(self, step: int) -> float:
        """The learning rate after ``step`` optimizer steps."""
        return self._native.lr_at(step)


class LinearLRScheduler(_Scheduler):
    """ONNX Runtime's LinearLRScheduler: linear warmup from 0 to ``initial_lr`` over
    ``warmup_step_count`` steps, then linear decay to 0 at ``total_step_count``."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float):
        super().__init__(optimizer, _C.LinearLRScheduler, warmup_step_count, total_step_count, initial_lr)


class CosineLRScheduler(_Scheduler):
    """Linear warmup, then cosine decay to 0 (transformers' cosine schedule with warmup)."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float,
                 num_cycles: float = 0.5):
        super().__init__(optimizer, _C.CosineLRScheduler, warmup_step_count, total_step_count, initial_lr,
                         num_cycles)


class StepLRScheduler(_Scheduler):
    """torch.optim.lr_scheduler.StepLR: multiply by ``gamma`` every ``step_size`` steps."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float, initial_lr: float):
        super().__init__(optimizer, _C.StepLRScheduler, step_size, gamma, initial_lr)


class ConstantLRScheduler(_Scheduler):
    """Linear warmup, then constant ``initial_lr``."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, initial_lr: float):
        super().__init__(optimizer, _C.ConstantLRScheduler, warmup_step_count, initial_lr)
