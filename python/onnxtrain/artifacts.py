"""Training artifacts from an inference model, as ``onnxruntime.training.artifacts`` makes them —
but generated in C++, so the same step runs from the CLI (``onnxtrain artifacts``) with no Python.

::

    from onnxtrain import artifacts
    artifacts.generate_artifacts("model.onnx", requires_grad=["fc.weight", "fc.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory="out")

writes ``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx`` and ``checkpoint``.
"""
from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _C
from . import _model_arg


class LossType(enum.Enum):
    MSELoss = "MSELoss"
    CrossEntropyLoss = "CrossEntropyLoss"
    BCEWithLogitsLoss = "BCEWithLogitsLoss"
    L1Loss = "L1Loss"
    NLLLoss = "NLLLoss"
    SmoothL1Loss = "SmoothL1Loss"
    HuberLoss = "HuberLoss"
    KLDivLoss = "KLDivLoss"
    BCELoss = "BCELoss"


class OptimType(enum.Enum):
    AdamW = "adamw"
    Adam = "adam"
    SGD = "sgd"
    Lamb = "lamb"
    Adagrad = "adagrad"


def _config(kind: str, **kwargs: Any) -> "_C.optim.OptimizerConfig":
    return _C.optim.OptimizerConfig(kind, **{k: v for k, v in kwargs.items() if v is not None})


def AdamW(lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
          amsgrad: bool = False, max_grad_norm: Optional[float] = None):
    """torch.optim.AdamW with its defaults; ``max_grad_norm`` clips the global gradient norm."""
    return _config("adamw", lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                   max_grad_norm=max_grad_norm)


def Adam(lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
         amsgrad: bool = False, max_grad_norm: Optional[float] = None):
    """torch.optim.Adam (L2 weight decay added to the gradient)."""
    return _config("adam", lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                   max_grad_norm=max_grad_norm)


def SGD(lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, max_grad_norm: Optional[float] = None):
    """torch.optim.SGD with momentum, dampening and Nesterov."""
    return _config("sgd", lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                   nesterov=nesterov, max_grad_norm=max_grad_norm)


def Lamb(lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
         max_grad_norm: Optional[float] = 1.0):
    """LAMB with apex FusedLAMB's defaults."""
    return _config("lamb", lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm)


def Adagrad(lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
            initial_accumulator_value: float = 0.0, eps: float = 1e-10, max_grad_norm: Optional[float] = None):
    """torch.optim.Adagrad."""
    return _config("adagrad", lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                   initial_accumulator_value=initial_accumulator_value, eps=eps, max_grad_norm=max_grad_norm)


def _mixed_precision_arg(value: Optional[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"mixed_precision must be \"bf16\", \"fp16\" or None, got {type(value).__name__}")
    return value


@dataclasses.dataclass
class LoraConfig:
    """LoRA adapters (include/onnxtrain/lora.h): for each targeted MatMul/Gemm/MatMulNBits weight,
    y += alpha/rank (x A^T) B^T with A Kaiming-uniform (as PEFT) and B zero; only A and B train.
    ``target``: module names by PEFT's ``target_modules`` rule: ``"fc"`` adapts the layers whose
    module path is ``fc`` or ends in ``.fc`` (not ``fc2``); a pattern with * ? [ is a glob over the
    module path (``"*"``: every layer)."""
    rank: int = 8
    alpha: float = 16.0
    target: Sequence[str] = ()
    dropout: float = 0.0
    seed: int = 0


def _lora_target(target) -> Dict[str, List[str]]:
    if isinstance(target, str):  # a lone string would be taken letter by letter
        raise TypeError(f"LoraConfig.target must be a list of module names (PEFT's target_modules), got the "
                        f"string {target!r}")
    return {"target": list(target)}


def generate_artifacts(model: Any, requires_grad: Optional[Sequence[str]] = None,
                       frozen_params: Optional[Sequence[str]] = None,
                       loss: Union[LossType, Any, None] = None,
                       optimizer: Union[OptimType, "_C.optim.OptimizerConfig", None] = None,
                       artifact_directory: Union[str, os.PathLike, None] = None, prefix: str = "",
                       additional_output_names: Optional[Sequence[str]] = None,
                       nominal_checkpoint: bool = False, loss_input_names: Optional[Sequence[str]] = None,
                       loss_options: Optional[Dict[str, Any]] = None,
                       mixed_precision: Optional[str] = None, lora: Optional["LoraConfig"] = None,
                       memory_opt_level: int = 0, memory_opt_config: str = "",
                       compute_optimizer: bool = True, label_sparsity: bool = False,
                       ort_compatible: bool = False) -> List[str]:
    """Writes the training, eval and optimizer models and the checkpoint; returns their paths.

    ``model``: a path, bytes or ``onnx.ModelProto``; a model over 2 GB must be a path to a file
    saved with ONNX external data. Models whose initializers pass 2 GB are written with external
    data (``<name>.onnx.data`` beside them). ``loss``: a :class:`LossType` or a custom loss
    as an ONNX model (path, bytes or ModelProto) whose first inputs take the model's outputs and
    whose single output is the loss. ``optimizer``: an :class:`OptimType` (torch.optim defaults)
    or a configured one (``artifacts.AdamW(lr=...)``). ``loss_options``: reduction, ignore_index,
    label_smoothing, beta/delta, log_target. ``requires_grad``: initializer names or output
    names of floating-point ``Constant`` nodes (they become parameters), or ``"all"``.
    ``mixed_precision``: ``"bf16"`` runs the GEMMs
    and their gradients in bfloat16 (fp32 accumulation) with losses, normalisations, the optimizer
    and the checkpoint's master parameters in fp32; ``"fp16"`` does the same in float16 with a
    dynamic loss scaler (the training graph scales the loss and unscales the gradients;
    ``Optimizer.step()`` skips an update whose gradients overflowed and reports it; the scale,
    2^16 to start, lives in the checkpoint); None for fp32. ``lora``: a :class:`LoraConfig`;
    then only the adapters train (``requires_grad`` may be empty), the base stays in the graphs and
    the checkpoint holds the adapters and the base's hash.
    ``memory_opt_level`` (0, 1: layer-wise recompute, 2: plus compromised plans) and
    ``memory_opt_config`` (``"cluster:strategy:count,..."``) set the memory optimizer;
    ``onnxtrain inspect`` prints the training model's plan table. ``compute_optimizer`` (on by
    default): a Gather or Slice keeping a few positions (a head on token 0, the last token) moves
    upstream past elementwise ops, LayerNorm, Softmax and MatMul, so the graphs compute only
    those rows; exact, ``False`` computes every row. ``label_sparsity`` (off by default): a
    CrossEntropy/NLL loss with ``ignore_index`` computes the LM head (final LayerNorm, vocabulary
    projection, softmax and their gradients) on the rows whose label is kept only; the loss and
    gradients are the dense graph's, a step with 70% of labels ignored costs much less; with every
    label kept the extra gathers cost a little, hence opt-in. ``ort_compatible``: artifacts that
    ONNX Runtime training's ``onnxruntime.training.api`` (1.16-1.19) loads and trains too, as well
    as onnxtrain (ORT's graph conventions, optimizer graph and checkpoint format); AdamW (torch's or
    transformers') or plain SGD, fp32, no LoRA, memory optimizer or label sparsity.
    """
    source = _model_arg(model)  # a path stays a path: its external data is found beside it
    if requires_grad == "all":  # every weight: initializers and Constant-node weights (not frozen ones)
        frozen = set(frozen_params or [])
        requires_grad = [n for n in _C.all_parameters(source) if n not in frozen]
    if lora is not None and requires_grad is None:
        requires_grad = []
    if requires_grad is None or isinstance(requires_grad, str):
        raise TypeError('requires_grad must be a sequence of parameter names or "all"')
    if loss is None:
        raise ValueError("loss is required: a LossType or a custom loss ONNX model")
    loss_name, custom = None, None
    if isinstance(loss, LossType):
        loss_name = loss.value
    else:
        custom = _model_arg(loss)
        if isinstance(custom, str):
            with open(custom, "rb") as f:
                custom = f.read()
    if optimizer is None or isinstance(optimizer, OptimType):
        config = _C.optim.OptimizerConfig((optimizer or OptimType.AdamW).value)
    elif isinstance(optimizer, _C.optim.OptimizerConfig):
        config = optimizer
    else:
        raise TypeError(f"optimizer must be an OptimType or a configured optimizer, got {type(optimizer).__name__}")
    directory = os.fspath(artifact_directory) if artifact_directory is not None else os.getcwd()
    return _C.generate_artifacts(source, list(requires_grad), list(frozen_params or []), loss_name, custom, config,
                                 directory, prefix, list(additional_output_names or []), bool(nominal_checkpoint),
                                 list(loss_input_names or []), dict(loss_options or {}),
                                 mixed_precision=_mixed_precision_arg(mixed_precision),
                                 lora=None if lora is None else {"rank": int(lora.rank), "alpha": float(lora.alpha),
                                                                 **_lora_target(lora.target),
                                                                 "dropout": float(lora.dropout), "seed": int(lora.seed)},
                                 memory_opt_level=int(memory_opt_level), memory_opt_config=str(memory_opt_config),
                                 compute_optimizer=bool(compute_optimizer), label_sparsity=bool(label_sparsity),
                                 ort_compatible=bool(ort_compatible))
