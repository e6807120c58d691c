"""onnxtrain for Hugging Face users (needs ``transformers``; PEFT's adapters need ``peft``):
``Trainer`` and ``TrainingArguments`` (trainer.py), a ``transformers.Trainer`` whose steps run through
TrainModule with FusedAdam; ``export_peft_adapters`` and ``import_peft_adapters`` (peft.py), LoRA
artifacts' adapters to and from PEFT's adapter directories.

This front end sits above ``onnxtrain.torch`` and ``onnxtrain.api``; nothing below imports it.
"""
from .trainer import Trainer, TrainingArguments, unsupported_options

__all__ = ["Trainer", "TrainingArguments", "unsupported_options"]
