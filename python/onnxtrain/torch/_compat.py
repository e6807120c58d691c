"""What differs between the torches TrainModule runs under (1.13, 2.x): the version check, the
ONNX exporter, autocast's query, torch.compile's graph break.

TrainModule exports with the TorchScript-based exporter on every torch it supports: torch 1.13
(Debian's), where it is the only one, and torch 2.x, where ``torch.onnx.export`` defaults to the
torch.export-based exporter since 2.9 and the TorchScript one is kept behind ``dynamo=False``
(deprecated, still whole in 2.15). TorchScript's trace is what TrainModule's graph passes were
written against: it exports in training mode (Dropout as ONNX Dropout with its mask, BatchNorm with
its running-statistics outputs, each submodule in its own mode), keeps the parameters as
initializers named by their state_dict keys, does no constant folding (which would bake parameters
in), emits the loss as SoftmaxCrossEntropyLoss/NegativeLogLikelihoodLoss (what label sparsity
recognises) and honours the ``symbolic`` of the checkpoint marks. The torch.export-based exporter
exports an inference program (training-mode Dropout and BatchNorm decomposed, buffer updates
lifted to outputs, constants folded by its optimizer), needs onnxscript and an onnx newer than
Debian's 1.12, and has no ``symbolic`` hook. docs/DESIGN.md, "TrainModule under torch 2.x".
"""
from __future__ import annotations

import inspect
import re
from typing import Dict, List, Optional, Tuple

import torch

MIN_TORCH = (1, 13)


def torch_version() -> Tuple[int, int]:
    """(major, minor) of the running torch: "1.13.0a0+git..." and "2.15.0+cu132" alike."""
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _export_parameters() -> dict:
    return dict(inspect.signature(torch.onnx.export).parameters)


def unsupported_reason(module_name: str) -> Optional[str]:
    """Why this torch cannot run TrainModule (naming the version and the module), or None."""
    if torch_version() < MIN_TORCH:
        return (f"TrainModule: {module_name}: torch {torch.__version__} is too old; TrainModule needs torch "
                f">= {MIN_TORCH[0]}.{MIN_TORCH[1]}")
    params = _export_parameters()
    # `training` is an option of the TorchScript-based exporter only: a torch.onnx.export that has
    # `dynamo` but lost `training` has dropped that exporter.
    if "dynamo" in params and "training" not in params:
        return (f"TrainModule: {module_name}: torch {torch.__version__}'s torch.onnx.export has no TorchScript-based "
                "exporter (dynamo=False, training=PRESERVE), which TrainModule exports with")
    return None


def exporter_name() -> str:
    """What an export error names: the torch and its exporter."""
    return f"torch.onnx.export (torch {torch.__version__}, TorchScript-based)"


def torchscript_exporter() -> dict:
    """torch.onnx.export's keyword arguments that choose the TorchScript-based exporter: ``dynamo=False``
    where the parameter exists (torch 2.x; the torch.export-based one is the default from 2.9)."""
    return {"dynamo": False} if "dynamo" in _export_parameters() else {}


def export(wrapper: torch.nn.Module, inputs: tuple, f, opset: int, input_names: List[str],
           dynamic_axes: Optional[Dict[str, Dict[int, str]]] = None) -> None:
    """Exports ``wrapper`` with the TorchScript-based exporter: opset ``opset``, training mode
    preserved per submodule, no constant folding, parameters as initializers; ``dynamic_axes``
    names the input dims that are symbolic (input name -> dim -> symbol)."""
    kwargs = torchscript_exporter()
    torch.onnx.export(
        wrapper, inputs, f, opset_version=opset, do_constant_folding=False,
        export_params=True, keep_initializers_as_inputs=False,
        # Each submodule exports in its own mode (a frozen BatchNorm in eval inside a training
        # model); TRAINING would switch them all to train and leave them so.
        training=torch.onnx.TrainingMode.PRESERVE,
        input_names=input_names, output_names=None, dynamic_axes=dynamic_axes or None, **kwargs)


def autocast_cpu() -> Optional[torch.dtype]:
    """The dtype of an enclosing ``torch.autocast("cpu")``, or None (torch 2.x deprecates the
    ``*_cpu_*`` functions 1.13 has)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


_GRAPH_BREAK_REASON = ("onnxtrain's TrainModule runs its forward and backward in onnxtrain's own graphs (a native "
                       "call per step, an ONNX export per new input schema), which torch.compile cannot trace: "
                       "its call is a graph break, and the code around it compiles")


def graph_break(forward):
    """``forward`` as torch.compile's graph break: Dynamo runs it eagerly instead of tracing into
    the export and the native calls (it would guard on every parameter, recompile per tensor rank
    and give up); ``fullgraph=True`` fails naming the reason. torch 1.13 has no torch.compile."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)  # torch >= 2.1
    if disable is None:
        return forward
    if "reason" in inspect.signature(disable).parameters:
        return disable(forward, recursive=True, reason=_GRAPH_BREAK_REASON)
    return disable(forward, recursive=True)
