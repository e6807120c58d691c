"""Data-parallel training over MPI.

Start N processes with ``mpirun -np N python3 train.py``; in each::

    import onnxtrain.distributed as dist
    world = dist.init()                       # world.rank, world.size, world.local_rank
    optimizer = Optimizer("out/optimizer_model.onnx", module, data_parallel=True)
    # feed each rank its shard of every global batch; optimizer.step() averages the gradients

``init`` reads the rank, size and local rank Open MPI (or a PMI launcher) put in the
environment, or uses mpi4py's already-initialised MPI when mpi4py was imported first. Outside a
launcher it returns a single rank. After ``init`` in a multi-rank job, an exception that reaches
the top of the program ends every rank (MPI_Abort) with its traceback naming the rank, so the
other ranks never wait for a rank that died.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, NamedTuple, Optional

from . import _C

__all__ = ["World", "init", "mpi_built", "abort", "launcher_environment"]

_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK")


class World(NamedTuple):
    rank: int
    size: int
    local_rank: int
    backend: str  # "mpi" or "single"

    @property
    def label(self) -> str:
        return f"rank {self.rank} of {self.size}"


_world: Optional[World] = None


def _first_int(env: Mapping[str, str], names) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v:
            return int(v)
    return None


def launcher_environment(env: Mapping[str, str] = os.environ, mpi: Optional[bool] = None):
    """(rank, size, local_rank) from a launcher's environment, or None outside one. Raises when
    the environment names several ranks but this onnxtrain has no MPI (``mpi`` overrides what the
    build says, for tests)."""
    size = _first_int(env, _SIZE_VARS)
    rank = _first_int(env, _RANK_VARS)
    if size is None and rank is None:
        return None
    size = 1 if size is None else size
    rank = 0 if rank is None else rank
    local = _first_int(env, _LOCAL_RANK_VARS)
    if mpi is None:
        mpi = _C.distributed_mpi_built()
    if size > 1 and not mpi:
        raise RuntimeError(
            f"rank {rank} of {size}: started by an MPI launcher, but this onnxtrain was built without "
            "MPI (install libopenmpi-dev and openmpi-bin with scripts/install_deps.sh, and rebuild)")
    return rank, size, rank if local is None else local


def mpi_built() -> bool:
    """Whether this onnxtrain was built with MPI."""
    return _C.distributed_mpi_built()


def abort(code: int = 1) -> None:
    """Ends every rank of the job (MPI_Abort); with one rank, exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    _C.distributed_abort(int(code))


def _abort_on_uncaught(world: World) -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        sys.stderr.write(f"onnxtrain: {world.label}: uncaught exception, ending every rank\n")
        previous(kind, value, tb)
        abort(1)

    sys.excepthook = hook


def init() -> World:
    """Joins the job's world (idempotent) and returns its rank, size and local rank."""
    global _world
    if _world is not None:
        return _world
    from_env = launcher_environment()
    if from_env is None and "mpi4py.MPI" in sys.modules:
        os.environ.setdefault("ONNXTRAIN_FORCE_MPI", "1")  # use the MPI mpi4py initialised
    rank, size, local_rank, backend = _C.distributed_init()
    if from_env is not None and (rank, size) != from_env[:2]:
        raise RuntimeError(f"rank {from_env[0]} of {from_env[1]}: the launcher's environment and MPI disagree "
                           f"(MPI says rank {rank} of {size})")
    _world = World(rank, size, local_rank, backend)
    if size > 1:
        _abort_on_uncaught(_world)
    return _world
