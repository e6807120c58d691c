"""TrainModule: an unchanged PyTorch training loop, run by onnxtrain.

    model = onnxtrain.torch.TrainModule(model)          # the one-line change
    loss = loss_fn(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()

On the first call with a new input schema (shapes, dtypes, which inputs require grad, constants,
train/eval mode) the module is exported with torch.onnx.export's TorchScript-based exporter on torch
1.13 and 2.x alike (opset 17, no constant folding, parameters as initializers, every submodule in its
own train/eval mode; _compat.py says why not 2.x's default), differentiated for the parameters and inputs that require grad,
split into a forward and a backward graph and planned; a repeated schema reuses them.

Batch and sequence sizes are symbolic once they vary: the first dim of every input and the second
of every integer or bool input (token ids, masks, labels), where the size is 2 or more. The export
names them (``dynamic_axes``), but a schema's first shape builds its graphs with those dims fixed
at its sizes (every pass sees them: plans, memory and compute optimizers); the first call at another
size builds them once more with the symbols, and those graphs then serve every size (their plans
are per shape). Whether the trace baked a size in (a Python int from ``x.shape`` in a constant, a
branch on a size) is checked, not assumed: the first time each symbol takes a new size, the module
is exported at it, and that export must be the same program (``torch_bridge.export_difference``:
nodes, attributes, constants, non-parameter initializers). When it is not, every shape of that
schema exports on its own, as with ``ONNXTRAIN_DYNAMIC_SHAPES=0``, and the difference is logged at
INFO. ``export_count`` counts the exports. A branch on a size that the two compared sizes take alike is beyond what two traces can show. A
``torch.autograd.Function`` runs the forward graph and saves what the backward graph reads;
backward takes torch's upstream gradients. Tensors cross by DLPack without copies, parameters are
the module's own and read in place, and their ``.grad`` is filled by torch's autograd, so torch
optimizers, schedulers, clipping, ``state_dict`` and DistributedDataParallel (wrapped around the
TrainModule) keep working. BatchNorm running statistics are updated in place, as torch does.
Under ``torch.no_grad()`` or when nothing requires grad only the forward graph runs.

When the module computes its loss (cross-entropy with ignore_index) or embeds ids with an
``nn.Embedding(padding_idx=...)``, the density of those inputs in a schema's first batch decides
whether its graphs compute the kept label rows only, or strip the padded tokens from the token-wise
layers (src/passes/sparsity.h; ONNXTRAIN_ENABLE_{LABEL,EMBEDDING}_SPARSITY_OPTIMIZATION).

Under torch.compile a TrainModule's call is a graph break. When the torch is too old, or the export
or the graph build fails, TrainModule raises ``TrainModuleError`` naming the version, op or construct; with ``ONNXTRAIN_FALLBACK=warn`` it warns once, saying why, and runs the PyTorch module.
The ONNXTRAIN_* environment variables are in the README's table (``onnxtrain.torch.debug``).
"""
from __future__ import annotations

import io
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import from_dlpack, to_dlpack

from .. import Error as _OnnxtrainError
from .. import _C
from . import _compat, _tree
from ._checkpoint import checkpoints_as_regions
from .debug import DebugOptions, LogLevel, Settings

__all__ = ["TrainModule", "TrainModuleError"]

_INPUT = "input_{}"
_OUTPUT = "output_{}"
_PREFIX = "module."  # the exported wrapper's attribute: initializers are named "module.<state_dict key>"
# The sparsity passes switch on for an input schema when the density measured on its first batch
# is below this: kept labels / all labels, non-padding tokens / all tokens.
DENSITY_THRESHOLD = 0.9


class TrainModuleError(RuntimeError):
    """The module cannot run through onnxtrain: the export or the graph build failed (the message
    names the op or construct), or an input is not supported."""


def _capsule(t: torch.Tensor):
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)  # torch 1.13's DLPack has no bool
    return to_dlpack(t if t.is_contiguous() else t.contiguous())


def _tensor(capsule, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    t = from_dlpack(capsule)
    return t.view(torch.bool) if dtype == torch.bool and t.dtype == torch.uint8 else t


def _zero_seed(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Zeros for an output's missing gradient, in memory from onnxtrain's storage (its own mapping
    from 2 MiB on): the backward only reads it, and untouched mapped pages read as the kernel's
    shared zero page, so it costs neither page zeroing nor resident memory."""
    nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
    return _tensor(_C.torch_bridge.zeros(nbytes)).view(dtype).reshape(shape)


class _ExportWrapper(nn.Module):
    """Flat tensors in, flat tensors out: what torch.onnx.export sees of the user's module."""

    def __init__(self, module: nn.Module, structure: tuple):
        super().__init__()
        self.module = module
        self.structure = structure
        self.out_structure: Optional[tuple] = None
        self.out_dtypes: List[torch.dtype] = []

    def forward(self, *tensors):
        args, kwargs = _tree.unflatten(self.structure, iter(tensors))
        outputs: List[torch.Tensor] = []
        self.out_structure = _tree.flatten(self.module(*args, **kwargs), outputs)
        self.out_dtypes = [t.dtype for t in outputs]
        return tuple(outputs)


@dataclass
class _Export:
    """One input schema's ONNX export and how its graph values map to the torch side."""

    data: bytes
    out_structure: tuple
    out_dtypes: List[torch.dtype]
    seconds: float
    # Inputs whose density the sparsity passes depend on: (flat input index, ignore_index) per
    # label input; (flat input index, table initializer, padding_idx) per embedding lookup whose
    # nn.Embedding has a padding_idx.
    labels: List[Tuple[int, int]] = field(default_factory=list)
    embeddings: List[Tuple[int, str, int]] = field(default_factory=list)


@dataclass
class _Family:
    """One input schema with its batch and sequence sizes as symbols, and its export with symbolic
    dims: built at its first shape's sizes until a size varies, then with the symbols."""

    export: _Export
    export_key: Any               # the first shape's concrete schema
    sizes: Dict[str, int]         # symbol -> its size in that shape
    symbolic: bool = False        # a size has varied: the graphs are built with the symbols
    varied: set = field(default_factory=set)  # symbols seen at another size, exporting the same program
    generic: bool = True          # False once an export at other sizes differed: each shape on its own


def _symbolic_dims(inputs: List[torch.Tensor]):
    """The batch and sequence dims (TrainModule's docstring) as symbols: per input its shape with
    symbols in place of those sizes, each symbol's size, and torch.onnx.export's dynamic_axes. One
    symbol per role and size: inputs that agree on a size share its symbol, so a later call whose
    inputs disagree there is another schema."""
    symbols: Dict[Tuple[str, int], str] = {}
    shapes, axes = [], {}
    for i, t in enumerate(inputs):
        dims: List[Any] = list(t.shape)
        roles = [(0, "batch")] if t.dim() >= 1 else []
        if t.dim() >= 2 and not (t.is_floating_point() or t.is_complex()):
            roles.append((1, "sequence"))
        for d, role in roles:
            if dims[d] < 2:  # 0 and 1 stay fixed: a size-1 dim broadcasts
                continue
            if (role, dims[d]) not in symbols:
                symbols[(role, dims[d])] = f"{role}_{sum(r == role for r, _ in symbols)}"
            sym = symbols[(role, dims[d])]
            axes.setdefault(_INPUT.format(i), {})[d] = sym
            dims[d] = sym
        shapes.append((tuple(dims), t.dtype))
    return tuple(shapes), {sym: size for (_, size), sym in symbols.items()}, axes


class _Graph:
    """One export under one choice of gradients: the native runner and the feed bookkeeping."""

    def __init__(self, export: _Export, runner, state_names: Dict[str, str]):
        self.export = export
        self.runner = runner
        # Per runner input: ("input", flat index) or ("state", state_dict key).
        self.sources: List[Tuple[str, Any]] = []
        for name in runner.inputs:
            if name.startswith("input_") and name[len("input_"):].isdigit():
                self.sources.append(("input", int(name[len("input_"):])))
            else:
                self.sources.append(("state", state_names[name]))
        self.forward_feeds = list(runner.forward_feeds)
        self.backward_feeds = list(runner.backward_feeds)
        self.seeded = list(runner.seeded_outputs)
        self.saved = list(runner.saved)
        self.n_outputs = len(runner.outputs)
        self.buffer_updates = [(state_names[b], i) for b, i in zip(runner.buffers, runner.buffer_outputs)]
        # torch counts BatchNorm's batches: "<bn>.num_batches_tracked" next to each updated running_mean.
        self.counters = sorted({key[: -len("running_mean")] + "num_batches_tracked" for key, _ in self.buffer_updates
                                if key.endswith("running_mean")})
        self.wrt = [self.sources[runner.inputs.index(name)] for name in runner.wrt]  # parallel to the gradients
        self.build_seconds = 0.0
        self.label_sparsity = False
        self.padding_index: Dict[str, int] = {}  # embedding table initializer -> padding index stripped


class _RunGraph(torch.autograd.Function):
    """Forward and backward through onnxtrain. Arguments: the TrainModule, the graph, the flat
    input tensors, then the parameters to differentiate (so autograd fills their .grad once the
    backward returns); with memory-efficient gradient management an anchor (an empty tensor that
    requires grad) stands in for the parameters, and each parameter gets its gradient during the
    backward instead (_hand_over)."""

    @staticmethod
    def forward(ctx, owner: "TrainModule", graph: _Graph, n_inputs: int, *tensors):
        outputs, saved, feeds = owner._run_forward(graph, tensors[:n_inputs])
        ctx.owner = owner
        ctx.graph = graph
        ctx.n_inputs = n_inputs
        ctx.n_params = len(tensors) - n_inputs
        ctx.n_saved = len(saved)
        not_differentiable = set(range(graph.n_outputs)) - set(graph.seeded)
        ctx.mark_non_differentiable(*(outputs[i] for i in sorted(not_differentiable)))
        # An output the loss does not use (a Hugging Face model's logits beside its loss) gets no
        # gradient from torch: materialized, it is a fresh zero tensor of the output's size every
        # step (GPT-2 small's logits: 51 MiB, 12,600 page faults); _zero_seed stands in for it.
        ctx.set_materialize_grads(False)
        ctx.seed_specs = [(outputs[i].shape, outputs[i].dtype) for i in graph.seeded]
        ctx.save_for_backward(*saved, *feeds)
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        graph: _Graph = ctx.graph
        stored = ctx.saved_tensors
        saved, feeds = stored[: ctx.n_saved], stored[ctx.n_saved:]
        seeds = [grad_outputs[i] if grad_outputs[i] is not None else _zero_seed(*spec)
                 for i, spec in zip(graph.seeded, ctx.seed_specs)]
        owner: TrainModule = ctx.owner
        on_gradient = owner._hand_over(graph) if owner._settings.mem_efficient_grad else None
        grads = graph.runner.backward([_capsule(g) for g in seeds], [_capsule(t) for t in saved],
                                      [_capsule(t) for t in feeds], on_gradient)
        result: List[Optional[torch.Tensor]] = [None] * (ctx.n_inputs + ctx.n_params)
        param = ctx.n_inputs
        for (kind, where), grad in zip(graph.wrt, grads):
            if kind == "input":
                result[where] = _tensor(grad)
            elif on_gradient is None:
                result[param] = _tensor(grad)
                param += 1
        return (None, None, None, *result)


class TrainModule(nn.Module):
    """Wraps ``module`` so that its forward and backward run through onnxtrain.

    The TrainModule shares the module's parameters, buffers and submodules (its ``state_dict()``
    has the module's keys, and loads into it); ``train()``/``eval()`` switch both.

    Args:
        module: the torch module; its tensors must be on the CPU.
        debug_options: logging and graph dumps (default: from the ONNXTRAIN_* environment).
        mixed_precision: "bf16" or "fp16": the GEMMs and their gradients run in that type (fp32
            accumulation), losses, normalisations and the parameters stay fp32
            (src/passes/mixed_precision.h). Default: ONNXTRAIN_MIXED_PRECISION, else the dtype of
            an enclosing ``torch.autocast("cpu", ...)`` at each call, else fp32.
        dynamic_shapes: batch and sequence sizes symbolic in the export, so that a new size does
            not export again (the module docstring says how that is checked). Default:
            ONNXTRAIN_DYNAMIC_SHAPES, else on.
        memory_opt_level, memory_opt_config: the memory optimizer's level (0, 1: layer-wise
            recompute, 2: plus compromised plans) and plan; default: ONNXTRAIN_MEMORY_OPT_LEVEL and
            ONNXTRAIN_MEMORY_OPT_CONFIG.
    """

    def __init__(self, module: nn.Module, debug_options: Optional[DebugOptions] = None,
                 mixed_precision: Optional[str] = None, dynamic_shapes: Optional[bool] = None,
                 memory_opt_level: Optional[int] = None, memory_opt_config: Optional[str] = None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"TrainModule wraps a torch.nn.Module, got {type(module).__name__}")
        if mixed_precision not in (None, "bf16", "fp16"):
            raise ValueError(f"TrainModule: mixed_precision must be \"bf16\", \"fp16\" or None, got {mixed_precision!r}")
        super().__init__()
        self.__dict__["_original_module"] = module  # not a child: the module's children are ours
        # One set of parameters, buffers and submodules, seen under the module's own names.
        for shared in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            self.__dict__[shared] = module.__dict__[shared]
        self.training = module.training
        _C.torch_bridge.fix_heap_thresholds()  # torch's per-step temporaries stay on the heap
        self._settings = Settings.load(debug_options)
        if dynamic_shapes is not None:
            self._settings.dynamic_shapes = bool(dynamic_shapes)
        if memory_opt_level is not None:
            if memory_opt_level not in (0, 1, 2):
                raise ValueError(f"TrainModule: memory_opt_level must be 0, 1 or 2, got {memory_opt_level!r}")
            self._settings.memory_opt_level = memory_opt_level
        if memory_opt_config is not None:
            self._settings.memory_opt_config = memory_opt_config
        env_mode = "" if self._settings.mixed_precision == "none" else self._settings.mixed_precision
        self.__dict__["_mixed_precision"] = mixed_precision or env_mode
        self._exports: Dict[Any, Tuple[_Export, Dict[str, int]]] = {}  # per shape: export, dims to fix
        self._families: Dict[Any, _Family] = {}
        self._graphs: Dict[Any, _Graph] = {}
        self._export_count = 0
        self._fallback_reason: Optional[str] = None
        self._paths: Dict[str, List[str]] = {}  # state_dict key -> attribute path
        self._density_step = 0  # steps printed (ONNXTRAIN_PRINT_INPUT_DENSITY)

    # ---- the torch.nn.Module surface ---------------------------------------------------------

    @property
    def original_module(self) -> nn.Module:
        """The wrapped PyTorch module (``.module`` would shadow a child of that name)."""
        return self._original_module

    def __getstate__(self):  # copy.deepcopy, pickling: graphs are rebuilt on the next call
        state = self.__dict__.copy()
        state["_exports"], state["_families"], state["_graphs"] = {}, {}, {}
        state.pop("_signature", None)
        return state

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original_module")
            if original is None:
                raise
            return getattr(original, name)

    def train(self, mode: bool = True) -> "TrainModule":
        self.training = mode
        self._original_module.train(mode)
        return self

    def _apply(self, fn, *args, **kwargs):
        self._original_module._apply(fn, *args, **kwargs)
        self._exports.clear()  # dtypes (or devices) of parameters changed: export again
        self._families.clear()
        self._graphs.clear()
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._original_module._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args, **kwargs):
        self._original_module._load_from_state_dict(*args, **kwargs)

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why this module runs in PyTorch (ONNXTRAIN_FALLBACK=warn), or None."""
        return self._fallback_reason

    @property
    def export_count(self) -> int:
        """How many times the module was exported (torch.onnx.export calls) since it was wrapped:
        one per input schema, plus one per symbolic dim the first time it takes a new size (the
        check that the export does not depend on it), plus one per shape where it did."""
        return self._export_count

    def profile(self) -> List[Dict[str, Any]]:
        """Per built graph and node: kernel calls and time (``graph``: forward or backward,
        ``schema``: the graph's place in build_stats, ``node``, ``op_type``, ``calls``,
        ``total_us``). Empty unless ONNXTRAIN_PROFILE=1 was set when the graphs were built."""
        return [{"schema": i, **row} for i, g in enumerate(self._graphs.values()) for row in g.runner.profile()]

    @property
    def build_stats(self) -> List[Dict[str, Any]]:
        """Per built graph: the seconds spent exporting and building it (the first-call cost);
        ``label_sparsity``: whether a loss now takes the kept label rows only (the fused output
        layer, when the loss is fused with its head, runs on those rows); ``padding_sparsity``: the
        tables whose padding tokens were stripped, with their padding index."""
        return [{"schema": i, "export_s": g.export.seconds, "build_s": g.build_seconds,
                 "backward": g.runner.has_backward, "memory": g.runner.memory_report(),
                 "memory_plan": g.runner.memory_plan, "saved_bytes": g.runner.saved_bytes,
                 "label_sparsity": g.label_sparsity, "padding_sparsity": dict(g.padding_index)}
                for i, g in enumerate(self._graphs.values())]

    # ---- forward ----------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if self._fallback_reason is not None:
            return self._original_module(*args, **kwargs)
        inputs: List[torch.Tensor] = []
        structure = _tree.flatten((args, kwargs), inputs)
        try:
            graph = self._graph_for(structure, inputs)
        except TrainModuleError as exc:
            if self._settings.fallback != "warn":
                raise
            self._fallback_reason = str(exc)
            message = (f"{exc}\nONNXTRAIN_FALLBACK=warn: {type(self._original_module).__name__} now runs in PyTorch, "
                       "without onnxtrain's speed-up.")
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            self._settings.log(LogLevel.WARNING, message)
            return self._original_module(*args, **kwargs)
        if self._settings.print_input_density:
            self._print_density(graph.export, inputs)
        if graph.runner.has_backward:
            if self._settings.mem_efficient_grad:
                # The parameters get their gradients during our backward (_hand_over): the anchor
                # only makes the outputs require grad.
                anchor = self.__dict__.get("_grad_anchor")
                if anchor is None:
                    anchor = self.__dict__["_grad_anchor"] = torch.empty(0, requires_grad=True)
                params = [anchor]
            else:
                params = [self._state(name) for kind, name in graph.wrt if kind == "state"]
            flat = _RunGraph.apply(self, graph, len(inputs), *inputs, *params)
        else:
            flat, _, _ = self._run_forward(graph, inputs)
        return _tree.unflatten(graph.export.out_structure, iter(flat))

    # Under torch.compile the call is a graph break (the code around it compiles): _compat.graph_break.
    forward = _compat.graph_break(forward)

    def _hand_over(self, graph: _Graph):
        """The backward's callback under ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1: each parameter's
        gradient, as soon as the backward graph has finished it, goes through a re-entrant
        ``torch.autograd.backward`` on the parameter (a leaf): its AccumulateGrad node adds it to
        ``.grad`` (or adopts it) and runs its hooks, so DistributedDataParallel marks the parameter
        ready and may start its bucket's allreduce while our backward goes on. Returning True
        lets onnxtrain free its reference at once."""
        def on_gradient(index: int, capsule) -> bool:
            kind, where = graph.wrt[index]
            if kind != "state":
                return False  # an input's gradient goes back through autograd as usual
            param, grad = self._state(where), _tensor(capsule)
            # As autograd's own check of a Function's outputs would: the parameter's dtype.
            torch.autograd.backward(param, grad if grad.dtype == param.dtype else grad.to(param.dtype))
            return True
        return on_gradient

    def _state(self, key: str) -> torch.Tensor:
        """The parameter or buffer named ``key`` now (looked up each call: it may have been replaced)."""
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = key.split(".")
        module = self._original_module
        for part in path[:-1]:
            module = module._modules[part]
        value = module._parameters.get(path[-1])
        return value if value is not None else module._buffers[path[-1]]

    def _run_forward(self, graph: _Graph, inputs):
        """Runs the forward graph; writes buffer updates. Returns (outputs, saved, backward feeds)."""
        def source(i):
            kind, where = graph.sources[i]
            return inputs[where] if kind == "input" else self._state(where)

        # Random ops (Dropout) draw from a seed taken from torch's generator: torch.manual_seed
        # reproduces a run, as it does for the plain module (the masks themselves differ from torch's).
        seed = int(torch.randint(0, 2**62, (1,)).item()) if graph.runner.is_random else None
        outs = graph.runner.forward([_capsule(source(i)) for i in graph.forward_feeds], seed)
        outputs = [_tensor(c, dt) for c, dt in zip(outs[: graph.n_outputs], graph.export.out_dtypes)]
        saved = [outputs[i] if i < graph.n_outputs else _tensor(outs[i]) for i in graph.saved]
        feeds = []
        updated = {key for key, _ in graph.buffer_updates}
        for i in graph.backward_feeds:  # a buffer updated below is read by the backward as it was
            kind, where = graph.sources[i]
            feeds.append(self._state(where).clone() if kind == "state" and where in updated else source(i))
        with torch.no_grad():
            for key, i in graph.buffer_updates:
                self._state(key).copy_(_tensor(outs[i]))
            for key in graph.counters:
                self._state(key).add_(1)
        return outputs, saved, feeds

    # ---- export and build, once per schema ----------------------------------------------------

    def _module_signature(self) -> tuple:
        """What an export depends on besides the inputs: each submodule's name and type, and each
        parameter's and buffer's name, shape and dtype."""
        m = self._original_module
        return (tuple((n, type(s)) for n, s in m.named_modules()),
                tuple((n, p.shape, p.dtype) for n, p in m.named_parameters()),
                tuple((n, b.shape, b.dtype) for n, b in m.named_buffers()))

    def _graph_for(self, structure: tuple, inputs: List[torch.Tensor]) -> _Graph:
        for t in inputs:
            if t.device.type != "cpu":
                raise TrainModuleError(f"TrainModule: an input is on {t.device}; onnxtrain runs on the CPU")
        # A layer replaced, added or removed after wrapping, or a parameter reshaped: the graphs of
        # the old structure would run stale, so they go and the module exports again.
        signature = self._module_signature()
        if signature != self.__dict__.get("_signature"):
            if self.__dict__.get("_signature") is not None:
                self._settings.log(LogLevel.INFO, f"TrainModule({type(self._original_module).__name__}): the "
                                   "module's structure changed since its last export: exporting again")
            self._exports.clear()
            self._families.clear()
            self._graphs.clear()
            self.__dict__["_signature"] = signature
        export_key = (_tree.key(structure), tuple((tuple(t.shape), t.dtype) for t in inputs), self.training)
        grad = torch.is_grad_enabled()
        wrt_inputs = tuple(i for i, t in enumerate(inputs) if grad and t.requires_grad)
        wrt_params = tuple(n for n, p in self._original_module.named_parameters() if grad and p.requires_grad)
        mode = self._mixed_precision_now()
        with torch.autocast("cpu", enabled=False):  # the export is fp32; the pass lowers it
            schema_key, export, fixed_dims = self._export_for(structure, inputs, export_key)
        graph_key = (schema_key, wrt_inputs, wrt_params, mode)
        graph = self._graphs.get(graph_key)
        if graph is None:
            label_sparsity, padding_index = self._sparsity_choice(export, inputs)
            graph = self._graphs[graph_key] = self._build(export, wrt_inputs, wrt_params, len(self._graphs), mode,
                                                          label_sparsity, padding_index, fixed_dims)
        return graph

    def _export_for(self, structure: tuple, inputs: List[torch.Tensor], export_key):
        """(key of the graphs, export, symbolic dims to build at a size) for this call: the
        schema's symbolic export once its sizes vary (the module docstring), else this shape's."""
        if self._settings.dynamic_shapes:
            shapes, sizes, axes = _symbolic_dims(inputs)
            family_key = (export_key[0], shapes, export_key[2])
            family = self._families.get(family_key) if sizes else None
            if sizes and family is None:
                family = self._families[family_key] = _Family(self._export(structure, inputs, axes), export_key, sizes)
                self._exports[export_key] = (family.export, sizes)  # built at this shape's sizes
            if family is not None and family.generic:
                unseen = {sym for sym, size in sizes.items() if size != family.sizes[sym]} - family.varied
                if unseen:
                    # A size not seen before: the export at it must be the program exported before.
                    other = self._export(structure, inputs, axes)
                    difference = self._export_difference(family.export, other, self._state_names())
                    if difference is not None:
                        self._shape_by_shape(family, family_key, difference)
                        self._exports[export_key] = (other, sizes)
                    else:
                        family.varied |= unseen
                        if not family.symbolic:  # from now on every size runs the symbolic graphs
                            family.symbolic = True
                            self._exports.pop(family.export_key, None)
                            for key in [k for k in self._graphs if k[0] == ("shape", family.export_key)]:
                                del self._graphs[key]
                if family.generic and family.symbolic:
                    return ("symbolic", family_key), family.export, {}
        found = self._exports.get(export_key)
        if found is None:
            found = self._exports[export_key] = (self._export(structure, inputs), {})
        return ("shape", export_key), found[0], found[1]

    def _state_names(self) -> set:
        """The export's initializer names of the module's parameters and buffers."""
        return {_PREFIX + k for k in self._original_module.state_dict(keep_vars=True)}

    @staticmethod
    def _export_difference(first: _Export, other: _Export, state_names: set) -> Optional[str]:
        """None when two exports at different sizes are the same program with the same outputs
        (the parameters' values aside: the optimizer may have stepped between them)."""
        if _tree.key(first.out_structure) != _tree.key(other.out_structure) or first.out_dtypes != other.out_dtypes:
            return "the outputs' structure (or a non-tensor output) differs"
        return _C.torch_bridge.export_difference(first.data, other.data, state_names) or None

    def _shape_by_shape(self, family: _Family, family_key, difference: str) -> None:
        """The trace of this schema depends on a size: each shape exports on its own from now on
        (the graphs built with the symbols, if any, serve no shape)."""
        family.generic = False
        self._exports.setdefault(family.export_key, (family.export, family.sizes))
        for key in [k for k in self._graphs if k[0] == ("symbolic", family_key)]:
            del self._graphs[key]
        self._settings.log(LogLevel.INFO, f"TrainModule({type(self._original_module).__name__}): the export at "
                           f"sizes {sorted(family.sizes.items())} and the one at other sizes are different programs "
                           f"({difference}): each input shape of this schema exports on its own")

    # ---- input sparsity ---------------------------------------------------------------------

    @staticmethod
    def _densities(export: _Export, inputs: List[torch.Tensor]):
        """(label densities, padding densities): per label input, the fraction of labels kept; per
        embedding with a padding index, the fraction of tokens that are not padding."""
        def kept(t: torch.Tensor, skip: int) -> float:
            return float((t != skip).sum().item()) / max(t.numel(), 1)
        labels = [(i, skip, kept(inputs[i], skip)) for i, skip in export.labels]
        padding = [(i, table, pad, kept(inputs[i], pad)) for i, table, pad in export.embeddings]
        return labels, padding

    def _sparsity_choice(self, export: _Export, inputs: List[torch.Tensor]):
        """Whether this schema's graphs take the kept labels only, and which embedding tables
        strip their padding: by the settings and the density of this (the schema's first) batch."""
        labels, padding = self._densities(export, inputs)
        label_sparsity = self._settings.label_sparsity and any(d < DENSITY_THRESHOLD for _, _, d in labels)
        padding_index = {}
        if self._settings.embedding_sparsity:
            padding_index = {table: pad for _, table, pad, d in padding if d < DENSITY_THRESHOLD}
        return label_sparsity, padding_index

    def _print_density(self, export: _Export, inputs: List[torch.Tensor]) -> None:
        labels, padding = self._densities(export, inputs)
        parts = [f"label density (input {i}, ignore_index {skip}) {100 * d:.1f}%" for i, skip, d in labels]
        parts += [f"padding density (input {i}, '{table[len(_PREFIX):]}' padding_idx {pad}) {100 * d:.1f}%"
                  for i, table, pad, d in padding]
        print(f"TrainModule({type(self._original_module).__name__}) step {self._density_step}: "
              + ("; ".join(parts) if parts else "no label or embedding input found"), flush=True)
        self._density_step += 1

    def _export(self, structure: tuple, inputs: List[torch.Tensor],
                dynamic_axes: Optional[Dict[str, Dict[int, str]]] = None) -> _Export:
        module = self._original_module
        name = type(module).__name__
        reason = _compat.unsupported_reason(name)
        if reason is not None:
            raise TrainModuleError(reason)
        if self.training:
            for sub_name, sub in module.named_modules():
                if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats and sub.momentum is None:
                    raise TrainModuleError(
                        f"TrainModule: {name}: BatchNorm '{sub_name}' has momentum=None (a cumulative average of "
                        "the batch statistics), which an ONNX export fixes at its first value; give it a momentum")
        wrapper = _ExportWrapper(module, structure)
        # Tracing runs the module once: keep its buffers (BatchNorm statistics) and the RNG as they were.
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
        rng = torch.random.get_rng_state()
        start = time.perf_counter()
        f = io.BytesIO()
        try:
            # torch.utils.checkpoint calls become marked regions that the backward recomputes.
            with warnings.catch_warnings(record=True) as caught, checkpoints_as_regions():
                warnings.simplefilter("always")
                self._export_count += 1
                _compat.export(wrapper, tuple(inputs), f, self._settings.opset,
                               [_INPUT.format(i) for i in range(len(inputs))], dynamic_axes)
        except Exception as exc:  # the exporter raises many types; its message names the op
            raise TrainModuleError(f"TrainModule: {_compat.exporter_name()} cannot export {name}: "
                                   f"{type(exc).__name__}: {exc}") from exc
        finally:
            with torch.no_grad():
                for b, value in buffers:
                    b.copy_(value)
            torch.random.set_rng_state(rng)
        for w in caught:
            self._settings.log(LogLevel.VERBOSE, f"torch.onnx.export: {w.message}")
        if wrapper.out_structure is None:
            raise TrainModuleError(f"TrainModule: torch.onnx.export did not run {name}'s forward")
        (_, (args, kwargs)) = structure
        found = [(f"input argument {i}", v) for i, c in enumerate(args[1]) for _, v in _tree.opaque_constants(c)]
        found += [(f"input {k}", v) for k, c in zip(kwargs[1], kwargs[2]) for _, v in _tree.opaque_constants(c)]
        found += [(f"output {p}", v) for p, v in _tree.opaque_constants(wrapper.out_structure)]
        for what, value in found:
            hint = (" (a Hugging Face model's key/value cache: pass use_cache=False, which training does not need)"
                    if "Cache" in type(value).__name__ else "")
            raise TrainModuleError(
                f"TrainModule: {name}: the {what} is a {type(value).__name__} holding tensors, which the export "
                f"would fix at their traced values; TrainModule takes and returns tensors, and tuples, lists and "
                f"dicts of them{hint}")
        # The module's parameters and buffers become inputs without data: they are bound from torch
        # at every run, and a kept copy of them (the export's bytes, parsed or not) would double
        # the model's memory (BERT-base: 418 MiB).
        data = f.getvalue()
        f.close()
        data = _C.torch_bridge.initializers_as_inputs(data, self._state_names())
        labels, embeddings = self._sparsity_inputs(data)
        return _Export(data, wrapper.out_structure, wrapper.out_dtypes, time.perf_counter() - start, labels, embeddings)

    def _sparsity_inputs(self, data: bytes):
        """The export's label inputs and embedding lookups (see _Export), mapped to flat input
        indices; an embedding counts only when its nn.Embedding has a padding_idx."""
        label_inputs, embedding_inputs = _C.torch_bridge.sparsity_inputs(data)
        def flat_index(name: str) -> Optional[int]:
            rest = name[len("input_"):]
            return int(rest) if name.startswith("input_") and rest.isdigit() else None
        labels = [(flat_index(n), skip) for n, skip in label_inputs if flat_index(n) is not None]
        pads = {f"{_PREFIX}{name}.weight" if name else f"{_PREFIX}weight": m.padding_idx
                for name, m in self._original_module.named_modules()
                if isinstance(m, nn.Embedding) and m.padding_idx is not None}
        embeddings = [(flat_index(n), table, pads[table]) for n, table in embedding_inputs
                      if flat_index(n) is not None and table in pads]
        return labels, embeddings

    def _mixed_precision_now(self) -> str:
        """The precision mode of this call: the constructor's or the environment's, else that of an
        enclosing torch.autocast on the CPU (bf16 or fp16), else "" (fp32)."""
        if self._mixed_precision:
            return self._mixed_precision
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(_compat.autocast_cpu(), "")

    def _build(self, export: _Export, wrt_inputs, wrt_params, index: int, mixed_precision: str = "",
               label_sparsity: bool = False, padding_index: Optional[Dict[str, int]] = None,
               fixed_dims: Optional[Dict[str, int]] = None) -> _Graph:
        module = self._original_module
        name = type(module).__name__
        state = module.state_dict(keep_vars=True)
        state_names = {_PREFIX + k: k for k in state}
        wrt = [_INPUT.format(i) for i in wrt_inputs] + [_PREFIX + n for n in wrt_params]
        start = time.perf_counter()
        try:
            # Only what the export kept can be bound or differentiated (it drops unused values).
            runner = _C.torch_bridge.Runner(export.data, f"'TrainModule({name})'", list(state_names), wrt,
                                            memory_opt_level=self._settings.memory_opt_level,
                                            memory_opt_config=self._settings.memory_opt_config,
                                            compute_optimizer=self._settings.compute_optimizer,
                                            mixed_precision=mixed_precision, label_sparsity=label_sparsity,
                                            padding_index=padding_index or {}, fixed_dims=fixed_dims or {})
        except _OnnxtrainError as exc:
            raise TrainModuleError(f"TrainModule: onnxtrain cannot build the graphs of {name}: {exc}") from exc
        graph = _Graph(export, runner, state_names)
        graph.build_seconds = time.perf_counter() - start
        # Whether the row pass rewrote a loss (the fused output layer skips ignored rows itself,
        # leaving the pass nothing to do), not merely whether the batch was sparse enough to ask.
        graph.label_sparsity = label_sparsity and runner.kept_label_losses > 0
        graph.padding_index = dict(padding_index or {})
        if label_sparsity or padding_index:
            self._settings.log(LogLevel.INFO, f"TrainModule({name}) schema {index}: label sparsity "
                               f"{'on' if graph.label_sparsity else 'off'}, padding stripped for {sorted(graph.padding_index) or 'none'}")
        self._settings.log(LogLevel.INFO,
                           f"TrainModule({name}) schema {index}: export {export.seconds:.2f} s, build "
                           f"{graph.build_seconds:.2f} s, {'forward + backward' if runner.has_backward else 'forward only'}"
                           f", {len(graph.saved)} saved values")
        if self._settings.memory_opt_level or self._settings.memory_opt_config:
            self._settings.log(LogLevel.INFO, f"TrainModule({name}) schema {index}: {runner.memory_plan}")
        if self._settings.debug.save_onnx:
            self._save(index, export.data, runner)
        return graph

    def _save(self, index: int, exported: bytes, runner) -> None:
        os.makedirs(self._settings.save_path, exist_ok=True)
        stem = os.path.join(self._settings.save_path, f"{self._settings.debug.onnx_prefix}_{index}")
        files = {"exported": exported, "forward": runner.forward_model(), "backward": runner.backward_model()}
        for kind, data in files.items():
            if data is not None:
                with open(f"{stem}_{kind}.onnx", "wb") as f:
                    f.write(data)
        self._settings.log(LogLevel.INFO, f"TrainModule: wrote {stem}_*.onnx")
