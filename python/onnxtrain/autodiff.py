"""Gradient graphs: ``build_gradient_graph(model, wrt, outputs, path=None)``.

The returned model holds forward and backward; its outputs are the forward outputs followed by
``<name>_grad`` for each name in ``wrt``. A scalar output is seeded with 1; any other output
gets an extra input ``<output>_grad`` carrying the upstream gradient.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import _C
from . import _model_arg


def build_gradient_graph(model: Any, wrt: Sequence[str], outputs: Sequence[str],
                         path: Optional[Union[str, os.PathLike]] = None) -> Optional[bytes]:
    """Builds the training graph. Returns its bytes, or writes it to ``path`` and returns None."""
    source = _model_arg(model)
    if isinstance(source, str):
        with open(source, "rb") as f:
            source = f.read()
    data, _, _ = _C.build_gradient_graph(source, list(wrt), list(outputs))
    if path is None:
        return data
    with open(os.fspath(path), "wb") as f:
        f.write(data)
    return None
