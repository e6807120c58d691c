"""``transformers.Trainer`` with onnxtrain underneath: what Optimum's ``ORTTrainer`` did for ORTModule.

    from onnxtrain.hf import Trainer, TrainingArguments
    trainer = Trainer(model=model, args=TrainingArguments("out", bf16=True, use_cpu=True), ...)
    trainer.train()                      # or trainer.train(resume_from_checkpoint=True)

The Trainer keeps ``self.model`` the Hugging Face model (its ``save_pretrained``, ``config``,
``forward`` signature and state_dict keys are what checkpoints, column pruning and evaluation see)
and hands its loop a :class:`~onnxtrain.torch.TrainModule` sharing that model's parameters
(``_wrap_model``, Trainer's own hook for DDP/FSDP wrappers): training and evaluation steps run in
onnxtrain's graphs, everything else (data, gradient accumulation, clipping, schedulers, logging,
callbacks, checkpoint save and resume) is Trainer's unchanged code. The optimizer is
:class:`~onnxtrain.torch.FusedAdam` with Trainer's parameter groups (no decay on biases and
LayerNorm). What TrainingArguments turns into onnxtrain settings:

  ``optim``                  adamw_torch, adamw_torch_fused: FusedAdam("adamw"); adamw_hf (4.x): FusedAdam("hf")
  ``bf16``                   TrainModule(mixed_precision="bf16"): GEMMs and their gradients in bfloat16,
                             parameters, losses and normalisations in fp32 (``fp16`` is refused: no loss
                             scaler on the CPU)
  ``gradient_checkpointing`` the model's torch.utils.checkpoint calls become TrainModule's recompute regions
  ``memory_opt_level``, ``memory_opt_config`` (this module's TrainingArguments): TrainModule's memory
                             optimizer (ONNXTRAIN_MEMORY_OPT_LEVEL / _CONFIG when unset)

An option onnxtrain cannot honour (a GPU device, torch.compile, DeepSpeed, FSDP, IPEX, another optimizer,
...) raises ``ValueError`` naming it; with ``ONNXTRAIN_FALLBACK=warn`` (ORTMODULE_FALLBACK_POLICY) the
Trainer instead runs as a plain ``transformers.Trainer`` in eager PyTorch and says so once.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Tuple

import transformers

from ..torch.debug import Settings
from ..torch.optim import FusedAdam
from ..torch.train_module import TrainModule

__all__ = ["Trainer", "TrainingArguments", "unsupported_options"]

# Trainer's optimizer names -> FusedAdam's mode.
FUSED_ADAM_MODES = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "hf"}


@dataclasses.dataclass
class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments plus TrainModule's memory optimizer (None: from the environment,
    ONNXTRAIN_MEMORY_OPT_LEVEL / ONNXTRAIN_MEMORY_OPT_CONFIG)."""

    memory_opt_level: Optional[int] = dataclasses.field(
        default=None, metadata={"help": "onnxtrain memory optimizer: 0 off, 1 layer-wise recompute, 2 plus "
                                        "compromised plans"})
    memory_opt_config: Optional[str] = dataclasses.field(
        default=None, metadata={"help": "onnxtrain recompute plan, 'cluster:strategy:count,...'"})


def _optim_name(args) -> str:
    return getattr(args.optim, "value", args.optim)


def unsupported_options(args: transformers.TrainingArguments) -> List[str]:
    """Each TrainingArguments option set that onnxtrain's Trainer cannot honour, as 'option=value: why'."""
    found: List[str] = []

    def check(name: str, bad, why: str) -> None:
        value = getattr(args, name, None)
        value = getattr(value, "value", value)  # an enum's string
        if value is not None and bad(value):
            found.append(f"{name}={value!r}: {why}")

    check("optim", lambda v: v not in FUSED_ADAM_MODES,
          f"onnxtrain steps with FusedAdam ({', '.join(FUSED_ADAM_MODES)})")
    check("torch_compile", bool, "TrainModule's call is a graph break under torch.compile: nothing would compile")
    check("deepspeed", bool, "DeepSpeed shards and runs the model itself")
    check("fsdp", bool, "FSDP shards the model itself")
    check("use_ipex", bool, "IPEX rewrites the module TrainModule exports")
    check("jit_mode_eval", bool, "a TorchScript-traced eval model bypasses TrainModule")
    check("half_precision_backend", lambda v: v == "apex", "apex rewrites the optimizer and the module")
    check("fp16_full_eval", bool, "it casts the parameters to float16; TrainModule's fp16 keeps them fp32")
    check("bf16_full_eval", bool, "it casts the parameters to bfloat16; TrainModule's bf16 keeps them fp32")
    check("neftune_noise_alpha", lambda v: v > 0, "its forward hook draws noise that an export would fix")
    check("use_liger_kernel", bool, "Liger's kernels are Triton (GPU) kernels")
    check("fp16", bool, "on the CPU Trainer runs fp16 without a loss scaler (accelerate 1.2 refuses it), so small "
          "gradients would underflow; use bf16=True")
    # args.device sets accelerate up, which refuses torch_compile on torch 1.13 before we could name it.
    if not args.torch_compile and args.device.type != "cpu":
        found.append(f"device {args.device} (use_cpu=False): onnxtrain trains on the CPU; set use_cpu=True")
    return found


class Trainer(transformers.Trainer):
    """transformers.Trainer whose training and evaluation steps run through TrainModule, stepped by
    FusedAdam (the module docstring says what each TrainingArguments option becomes).

    ``train_module``: the TrainModule around ``self.model`` (made on first use); ``fallback_reason``:
    why this Trainer runs in eager PyTorch (ONNXTRAIN_FALLBACK=warn and an unsupported option), or None.
    """

    def __init__(self, model=None, args=None, *positional, **kwargs):
        self.fallback_reason: Optional[str] = None
        self._train_module: Optional[TrainModule] = None
        # Checked before transformers' own checks, which may refuse an option for another reason.
        problems = unsupported_options(args if args is not None else transformers.TrainingArguments("tmp_trainer"))
        if problems:
            message = "onnxtrain.hf.Trainer cannot honour " + "; ".join(problems)
            if Settings.load(None).fallback != "warn":
                raise ValueError(message)
            self.fallback_reason = message
            warnings.warn(f"{message}\nONNXTRAIN_FALLBACK=warn: the Trainer runs "
                          f"{type(model).__name__} in eager PyTorch, without onnxtrain.", RuntimeWarning, stacklevel=2)
        super().__init__(model, args, *positional, **kwargs)

    @property
    def mixed_precision(self) -> Optional[str]:
        return "bf16" if self.args.bf16 else None

    @property
    def train_module(self) -> TrainModule:
        """The TrainModule sharing ``self.model``'s parameters (a new one if the model was replaced,
        e.g. by ``model_init``)."""
        if self._train_module is None or self._train_module.original_module is not self.model:
            self._train_module = TrainModule(self.model, mixed_precision=self.mixed_precision,
                                             memory_opt_level=getattr(self.args, "memory_opt_level", None),
                                             memory_opt_config=getattr(self.args, "memory_opt_config", None))
        return self._train_module

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        if self.fallback_reason is not None:
            return super()._wrap_model(model, training, dataloader)
        if isinstance(model, TrainModule):  # train/evaluate again: wrapped already
            return model
        return self.train_module

    def get_optimizer_cls_and_kwargs(self, args, model=None) -> Tuple[Any, Dict[str, Any]]:
        if self.fallback_reason is not None:
            return transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
        return FusedAdam, {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2),
                           "eps": args.adam_epsilon, "mode": FUSED_ADAM_MODES[_optim_name(args)]}
