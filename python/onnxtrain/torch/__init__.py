"""onnxtrain for PyTorch users.

Submodules are imported on first use, so ``import onnxtrain`` never pays for ``import torch``::

    from onnxtrain.torch import TrainModule, FusedAdam
    model = TrainModule(model)                      # onnxtrain.torch.train_module
    optimizer = FusedAdam(model.parameters(), lr=1e-3)   # onnxtrain.torch.optim
"""
from __future__ import annotations

import importlib
from typing import Any

# attribute -> submodule that defines it
_LAZY = {
    "FusedAdam": "optim",
    "FP16_Optimizer": "fp16_optimizer",
    "DynamicLossScaler": "fp16_optimizer",
    "TrainModule": "train_module",
    "TrainModuleError": "train_module",
    "DebugOptions": "debug",
    "LogLevel": "debug",
}
_SUBMODULES = ("optim", "train_module", "debug", "fp16_optimizer")

__all__ = sorted(list(_LAZY) + list(_SUBMODULES))


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
