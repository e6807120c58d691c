"""torch.utils.checkpoint inside an exported module: a recompute hint instead of a failed export.

torch 1.13 cannot trace the reentrant checkpoint (its autograd.Function takes the callable as an
argument: the tracer fails with ``unordered_map::at``), and the non-reentrant one traces inline
without a trace of the call. While TrainModule exports, :func:`checkpoints_as_regions` makes both
run the checkpointed function inline and wrap each tensor entering it and each tensor it returns in
a ``onnxtrain.torch::CheckpointBoundary`` node (attributes ``region``: the call's number, ``end``:
0 entering, 1 leaving). The graph builder removes the marks and recomputes in the backward what
each region computes (src/passes/memory_optimizer.h, ``take_checkpoint_regions``). torch 2.x routes
both kinds through ``_checkpoint_impl``, which is the one name replaced there.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

import torch
import torch.utils.checkpoint as _torch_checkpoint

_DOMAIN_OP = "onnxtrain.torch::CheckpointBoundary"


class _Boundary(torch.autograd.Function):
    """Identity in torch; one mark node in the ONNX export."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, region: int, end: int) -> torch.Tensor:  # noqa: ARG004
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None

    @staticmethod
    def symbolic(g, x, region: int, end: int):
        return g.op(_DOMAIN_OP, x, region_i=region, end_i=end)


def _mark(value: Any, region: int, end: int) -> Any:
    if isinstance(value, torch.Tensor):
        return _Boundary.apply(value, region, end)
    if isinstance(value, (tuple, list)):
        items = [_mark(v, region, end) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # namedtuples too
    if isinstance(value, dict):
        return {k: _mark(v, region, end) for k, v in value.items()}
    return value


@contextlib.contextmanager
def checkpoints_as_regions() -> Iterator[None]:
    """Within the block, torch.utils.checkpoint.checkpoint (reentrant or not, however it was
    imported: every path looks the replaced names up in torch.utils.checkpoint when called) runs
    its function inline between boundary marks."""
    numbers = itertools.count()

    def run(function, preserve_rng_state, *args, **kwargs):  # noqa: ARG001 (the recomputation reuses Dropout masks)
        region = next(numbers)
        return _mark(function(*_mark(args, region, 0), **kwargs), region, 1)

    if hasattr(_torch_checkpoint, "_checkpoint_impl"):  # torch 2.x: checkpoint() calls it, both kinds
        def impl(function, args, kwargs, *, preserve_rng_state=True, **options):  # noqa: ARG001
            return run(function, preserve_rng_state, *args, **kwargs)

        names, replacements = ("_checkpoint_impl",), (impl,)
    else:  # torch 1.13: checkpoint() calls one of these two
        class _Inline:
            apply = staticmethod(run)

        names, replacements = ("CheckpointFunction", "_checkpoint_without_reentrant"), (_Inline, run)
    saved = [getattr(_torch_checkpoint, n) for n in names]
    for n, value in zip(names, replacements):
        setattr(_torch_checkpoint, n, value)
    try:
        yield
    finally:
        for n, value in zip(names, saved):
            setattr(_torch_checkpoint, n, value)
