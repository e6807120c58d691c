"""Nested arguments and results as a flat list of tensors plus a structure.

A structure is a tuple: ``("tensor",)`` for the next tensor, ``("const", value)`` for anything
else (part of the input schema: a different value is a different graph), or a container
``("tuple" | "list", children)``, ``("dict", keys, children)``, ``("namedtuple", type, children)``,
``("mapping", type, keys, children)`` for a dict subclass (Hugging Face's ``ModelOutput``: a
dataclass over an OrderedDict, whose ``.loss`` a training loop reads), rebuilt as its own type.
"""
from __future__ import annotations

from typing import Any, Hashable, Iterator, List

import dataclasses

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
    if isinstance(obj, dict) and type(obj) is not dict:
        return ("mapping", type(obj), tuple(obj.keys()), tuple(flatten(v, tensors) for v in obj.values()),
                _empty_recipe(obj))
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
    if kind == "mapping":
        cls, items = structure[1], {k: unflatten(s, tensors) for k, s in zip(structure[2], structure[3])}
        # A dataclass mapping (ModelOutput) takes its present fields by name; others are rebuilt as
        # pickle does (a defaultdict's constructor takes its factory first, a subclass's may take anything).
        return cls(**items) if dataclasses.is_dataclass(cls) else _rebuild(structure[4], items)
    values = [unflatten(s, tensors) for s in structure[1]]
    return tuple(values) if kind == "tuple" else values


def _empty_recipe(obj: dict) -> tuple:
    """How pickle would make ``obj`` before its items: (callable, args, state); None for dataclasses."""
    if dataclasses.is_dataclass(obj):
        return None
    made = obj.__reduce_ex__(2)
    return made[0], made[1], made[2] if len(made) > 2 else None


def _rebuild(recipe: tuple, items: dict) -> dict:
    make, args, state = recipe
    obj = make(*args)
    if state:
        if hasattr(obj, "__setstate__"):
            obj.__setstate__(state)
        else:
            obj.__dict__.update(state)
    for k, v in items.items():
        obj[k] = v
    return obj


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
    if kind == "mapping":
        return (kind, structure[1], structure[2], tuple(key(s) for s in structure[3]))
    return (kind, tuple(key(s) for s in structure[1]))


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, type(Ellipsis))


def _holds_tensors(obj: Any, depth: int = 3) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if depth == 0 or isinstance(obj, _PLAIN):
        return False
    if isinstance(obj, dict):
        return any(_holds_tensors(v, depth - 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(_holds_tensors(v, depth - 1) for v in obj)
    return _holds_tensors(getattr(obj, "__dict__", None), depth - 1)


def opaque_constants(structure: tuple, path: str = "") -> List[tuple]:
    """(path, value) of each constant that holds tensors inside an object of its own (a Hugging Face
    ``DynamicCache``): an export would bake those tensors in, so such a value cannot be a constant."""
    kind = structure[0]
    if kind == "tensor":
        return []
    if kind == "const":
        value = structure[1]
        return [(path or "the value", value)] if not isinstance(value, _PLAIN) and _holds_tensors(value) else []
    if kind == "dict":
        names, children = structure[1], structure[2]
    elif kind == "mapping":
        names, children = structure[2], structure[3]
    else:
        children = structure[2] if kind == "namedtuple" else structure[1]
        names = [f"[{i}]" for i in range(len(children))]
    found = []
    for name, child in zip(names, children):
        found += opaque_constants(child, f"{path}.{name}" if path and not str(name).startswith("[") else f"{path}{name}")
    return found

