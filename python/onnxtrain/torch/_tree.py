"""Nested arguments and results as a flat list of tensors plus a structure.

A structure is a tuple: ``("tensor",)`` for the next tensor, ``("const", value)`` for anything
else (part of the input schema: a different value is a different graph), or a container
``("tuple" | "list", children)``, ``("dict", keys, children)``, ``("namedtuple", type, children)``.
"""
from __future__ import annotations

from typing import Any, Hashable, Iterator, List

import torch

TENSOR = ("tensor",)


def flatten(obj: Any, tensors: List[torch.Tensor]) -> tuple:
    """Appends obj's tensors to ``tensors`` (depth first) and returns its structure."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return TENSOR
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("namedtuple", type(obj), tuple(flatten(v, tensors) for v in obj))
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(flatten(v, tensors) for v in obj))
    if isinstance(obj, dict):
        return ("dict", tuple(obj.keys()), tuple(flatten(v, tensors) for v in obj.values()))
    return ("const", obj)


def unflatten(structure: tuple, tensors: Iterator[torch.Tensor]) -> Any:
    kind = structure[0]
    if kind == "tensor":
        return next(tensors)
    if kind == "const":
        return structure[1]
    if kind == "namedtuple":
        return structure[1](*(unflatten(s, tensors) for s in structure[2]))
    if kind == "dict":
        return {k: unflatten(s, tensors) for k, s in zip(structure[1], structure[2])}
    values = [unflatten(s, tensors) for s in structure[1]]
    return tuple(values) if kind == "tuple" else values


def key(structure: tuple) -> Hashable:
    """A hashable form of ``structure``: constants by value when hashable, else by type and repr."""
    kind = structure[0]
    if kind == "tensor":
        return structure
    if kind == "const":
        value = structure[1]
        try:
            hash(value)
            return ("const", type(value), value)
        except TypeError:
            return ("const", type(value), repr(value))
    if kind == "namedtuple":
        return (kind, structure[1], tuple(key(s) for s in structure[2]))
    if kind == "dict":
        return (kind, structure[1], tuple(key(s) for s in structure[2]))
    return (kind, tuple(key(s) for s in structure[1]))
