"""Settings of TrainModule: ``DebugOptions`` and the ``ONNXTRAIN_*`` environment variables
(LOG_LEVEL, SAVE_ONNX, SAVE_ONNX_PATH, OPSET, FALLBACK, MEMORY_OPT_LEVEL, MEMORY_OPT_CONFIG,
ENABLE_COMPUTE_OPTIMIZER, ENABLE_MEM_EFFICIENT_GRAD_MGMT, ENABLE_LABEL_SPARSITY_OPTIMIZATION,
ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION, PRINT_INPUT_DENSITY, MIXED_PRECISION, DYNAMIC_SHAPES; ORTMODULE_* aliases), read when a TrainModule is
made. Their table, with values and defaults, is in the README's TrainModule section. An explicit
``DebugOptions(...)`` argument wins over the environment for its own fields.
"""
from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field

_LOGGER_NAME = "onnxtrain.torch"


class LogLevel(enum.IntEnum):
    VERBOSE = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4


_PY_LEVELS = {LogLevel.VERBOSE: logging.DEBUG, LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
              LogLevel.ERROR: logging.ERROR, LogLevel.FATAL: logging.CRITICAL}


# ONNX Runtime's ORTModule names of the same settings, read when the ONNXTRAIN_* name is unset
# (the README's TrainModule table lists them).
ORTMODULE_ALIASES = {
    "ONNXTRAIN_LOG_LEVEL": "ORTMODULE_LOG_LEVEL",
    "ONNXTRAIN_SAVE_ONNX_PATH": "ORTMODULE_SAVE_ONNX_PATH",
    "ONNXTRAIN_OPSET": "ORTMODULE_ONNX_OPSET_VERSION",
    "ONNXTRAIN_FALLBACK": "ORTMODULE_FALLBACK_POLICY",
    "ONNXTRAIN_MEMORY_OPT_LEVEL": "ORTMODULE_MEMORY_OPT_LEVEL",
    "ONNXTRAIN_MEMORY_OPT_CONFIG": "ORTMODULE_MEMORY_OPT_CONFIG",
    "ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER": "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER",
    "ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT": "ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT",
    # ORTModule's sparse optimizer switch covers labels (and embeddings, with the next one).
    "ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION": "ORTMODULE_ENABLE_SPARSE_OPTIMIZER",
    "ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION": "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER",
    "ONNXTRAIN_PRINT_INPUT_DENSITY": "ORTMODULE_PRINT_INPUT_DENSITY",
}


def _source(name: str) -> str:
    """The variable that sets `name`: itself, else its ORTMODULE_* alias when that one is set."""
    alias = ORTMODULE_ALIASES.get(name)
    if name not in os.environ and alias and alias in os.environ:
        return alias
    return name


def _env(name: str, default: str) -> str:
    value = os.environ.get(_source(name), default).strip()
    if _source(name) == "ORTMODULE_FALLBACK_POLICY":
        # ORTModule's policies: FALLBACK_DISABLE raises; any fallback policy falls back, warning.
        value = "raise" if value.upper() == "FALLBACK_DISABLE" else "warn"
    return value


def _env_choice(name: str, default: str, choices) -> str:
    value = _env(name, default).lower()
    if value not in choices:
        source = _source(name)
        raise ValueError(f"{source}={os.environ.get(source)!r}: expected one of {', '.join(sorted(choices))}")
    return value


def _env_int(name: str, default: int, allowed=None) -> int:
    raw = _env(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{_source(name)}={raw!r}: expected an integer") from None
    if allowed is not None and value not in allowed:
        raise ValueError(f"{_source(name)}={value}: expected one of {sorted(allowed)}")
    return value


def _memory_opt_level() -> int:
    # ONNXTRAIN_MEMORY_LEVEL=1 (whole-forward recompute, before the memory optimizer) now means
    # level 1; the new name wins when both are set.
    if _source("ONNXTRAIN_MEMORY_OPT_LEVEL") not in os.environ and "ONNXTRAIN_MEMORY_LEVEL" in os.environ:
        return _env_int("ONNXTRAIN_MEMORY_LEVEL", 0, {0, 1})
    return _env_int("ONNXTRAIN_MEMORY_OPT_LEVEL", 0, {0, 1, 2})


def _env_log_level() -> LogLevel:
    name = _env_choice("ONNXTRAIN_LOG_LEVEL", "WARNING", {lvl.name.lower() for lvl in LogLevel})
    return LogLevel[name.upper()]


@dataclass
class DebugOptions:
    """What TrainModule logs and writes (ORTModule's DebugOptions).

    log_level: messages below it are dropped (INFO reports export and build times per input schema).
    save_onnx: write ``<onnx_prefix>_<schema>_{exported,forward,backward}.onnx`` for each input
        schema, into ONNXTRAIN_SAVE_ONNX_PATH (default: the working directory). In all three the
        module's parameters and buffers are graph inputs (bound from torch at each run), not data.
    onnx_prefix: the files' name prefix (required with save_onnx).
    """

    log_level: LogLevel = field(default_factory=_env_log_level)
    save_onnx: bool = field(default_factory=lambda: _env_choice("ONNXTRAIN_SAVE_ONNX", "0", {"0", "1"}) == "1")
    onnx_prefix: str = "onnxtrain"

    def __post_init__(self):
        self.log_level = LogLevel(self.log_level)
        if self.save_onnx and not self.onnx_prefix:
            raise ValueError("DebugOptions: save_onnx needs a non-empty onnx_prefix")


@dataclass
class Settings:
    """Everything TrainModule reads from the environment and DebugOptions, fixed at construction."""

    debug: DebugOptions
    save_path: str
    opset: int
    fallback: str       # "raise" or "warn"
    memory_opt_level: int   # 0, 1 (layer-wise recompute) or 2 (plus compromised plans)
    memory_opt_config: str  # "cluster:strategy:count,...", checked against the model's clusters
    compute_optimizer: bool  # Gathers of a few rows move upstream (on by default)
    mixed_precision: str = ""  # "", "bf16" or "fp16" (ONNXTRAIN_MIXED_PRECISION)
    # Each parameter's gradient goes to torch (.grad, its AccumulateGrad hooks: DDP) as soon as
    # the backward graph finishes it, and onnxtrain's copy is freed (off by default).
    mem_efficient_grad: bool = False
    label_sparsity: bool = True       # losses with ignore_index take the kept rows (when sparse enough)
    embedding_sparsity: bool = False  # padded tokens skip the token-wise layers (the model must mask them)
    print_input_density: bool = False  # label and padding density of each step, on stdout
    dynamic_shapes: bool = True  # batch and sequence sizes symbolic in the export (TrainModule's docstring)

    @staticmethod
    def load(debug_options: "DebugOptions | None") -> "Settings":
        return Settings(debug=debug_options if debug_options is not None else DebugOptions(),
                        save_path=_env("ONNXTRAIN_SAVE_ONNX_PATH", os.getcwd()),
                        opset=_env_int("ONNXTRAIN_OPSET", 17, range(7, 18)),
                        fallback=_env_choice("ONNXTRAIN_FALLBACK", "raise", {"raise", "warn"}),
                        memory_opt_level=_memory_opt_level(),
                        memory_opt_config=_env("ONNXTRAIN_MEMORY_OPT_CONFIG", ""),
                        compute_optimizer=_env_int("ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER", 1, {0, 1}) == 1,
                        mixed_precision=_env_choice("ONNXTRAIN_MIXED_PRECISION", "", {"", "none", "bf16", "fp16"}),
                        mem_efficient_grad=_env_int("ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT", 0, {0, 1}) == 1,
                        label_sparsity=_env_int("ONNXTRAIN_ENABLE_LABEL_SPARSITY_OPTIMIZATION", 1, {0, 1}) == 1,
                        embedding_sparsity=_env_int("ONNXTRAIN_ENABLE_EMBEDDING_SPARSITY_OPTIMIZATION", 0, {0, 1}) == 1,
                        print_input_density=_env_int("ONNXTRAIN_PRINT_INPUT_DENSITY", 0, {0, 1}) == 1,
                        dynamic_shapes=_env_int("ONNXTRAIN_DYNAMIC_SHAPES", 1, {0, 1}) == 1)

    def log(self, level: LogLevel, message: str) -> None:
        if level < self.debug.log_level:
            return
        logger = logging.getLogger(_LOGGER_NAME)
        if not logger.handlers and level < LogLevel.WARNING:
            # Python's last-resort handler shows warnings only: INFO that was asked for must show.
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(_PY_LEVELS[self.debug.log_level])
        logger.log(_PY_LEVELS[level], message)
