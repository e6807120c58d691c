"""onnxtrain for PyTorch users.

Submodules are imported on first use, so ``import onnxtrain`` never pays for ``import torch``::

    from onnxtrain.torch import FusedAdam          # onnxtrain.torch.optim
    optimizer = FusedAdam(model.parameters(), lr=1e-3)
"""
from __future__ import annotations

import importlib
from typing import Any

# attribute -> submodule that defines it
_LAZY = {
    "FusedAdam": "optim",
}
_SUBMODULES = ("optim",)

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
