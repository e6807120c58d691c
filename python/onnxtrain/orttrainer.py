"""ONNX Runtime's original trainer API (``onnxruntime.training.ORTTrainer``) over onnxtrain, so
old scripts migrate by changing imports::

    from onnxtrain import optim, orttrainer
    model_desc = {"inputs": [("x", ["batch", 784]), ("label", ["batch"])],
                  "outputs": [("loss", [], True), ("probability", ["batch", 10])]}
    trainer = orttrainer.ORTTrainer(model, model_desc, optim.LambConfig(lr=1e-3), loss_fn=my_loss,
                                    options=orttrainer.ORTTrainerOptions({"batch": {"gradient_accumulation_steps": 4}}))
    loss, probability = trainer.train_step(x, label)
    trainer.save_as_onnx("trained.onnx")

It is the same engine as the on-device API: the torch module (with ``loss_fn`` when given) is
exported to ONNX on the first step, ``_internal_use.extra_postprocess`` edits that ModelProto,
``onnxtrain.artifacts.generate_artifacts`` builds the training graphs, and
``onnxtrain.api.Module``/``Optimizer`` run them. With ``distributed.world_size`` > 1 (processes
started by mpirun; :func:`setup_with_mpi`) the optimizer averages gradients over the ranks; each
rank feeds its own shard of every batch.

Semantics kept from ONNX Runtime: gradients of ``gradient_accumulation_steps`` calls are summed,
then one optimizer step runs; the learning-rate scheduler sets lr = base x factor(optimizer steps
done / total_steps) before each optimizer step, for every parameter group; ``train_step`` returns
the model_desc outputs as torch tensors (the loss alone when it is the only one).
"""
from __future__ import annotations

import copy
import inspect
import io
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import artifacts as _artifacts
from . import distributed as _distributed
from .api import CheckpointState, Module, Optimizer
from .optim import _OptimizerConfig
from .optim.lr_scheduler import LRScheduler

__all__ = ["ORTTrainer", "ORTTrainerOptions", "ModelDescription", "IODescription", "setup_with_mpi"]


class IODescription:
    """One input or output of the model: name, shape (ints and symbolic strings), dtype,
    num_classes (for integer labels)."""

    def __init__(self, name: str, shape: Sequence[Any], dtype: Any = None, num_classes: Optional[int] = None):
        self.name_ = name
        self.shape_ = list(shape)
        self.dtype_ = dtype
        self.num_classes_ = num_classes

    name = property(lambda self: self.name_)
    shape = property(lambda self: self.shape_)
    dtype = property(lambda self: self.dtype_)
    num_classes = property(lambda self: self.num_classes_)


class ModelDescription:
    """Inputs and outputs of the model, the older form of ``model_desc``. The loss is the output
    named in ``loss`` or, by default, the first output."""

    def __init__(self, inputs: Sequence[IODescription], outputs: Sequence[IODescription], loss: Optional[str] = None):
        self.inputs_ = list(inputs)
        self.outputs_ = list(outputs)
        if not self.outputs_:
            raise ValueError("ModelDescription: no outputs (the loss must be one)")
        self.loss_ = loss or self.outputs_[0].name_
        if self.loss_ not in [o.name_ for o in self.outputs_]:
            raise ValueError(f"ModelDescription: the loss '{self.loss_}' is not an output")

    inputs = property(lambda self: self.inputs_)
    outputs = property(lambda self: self.outputs_)


def _model_description(desc: Any) -> ModelDescription:
    if isinstance(desc, ModelDescription):
        return desc
    if not isinstance(desc, dict) or set(desc) - {"inputs", "outputs"} or "inputs" not in desc or "outputs" not in desc:
        raise ValueError("model_desc must be a ModelDescription or a dict with 'inputs': [(name, shape)] and "
                         "'outputs': [(name, shape[, is_loss])]")
    inputs = []
    for i in desc["inputs"]:
        if not (isinstance(i, (tuple, list)) and len(i) == 2 and isinstance(i[0], str)):
            raise ValueError(f"model_desc input {i!r}: expected (name, shape)")
        inputs.append(IODescription(i[0], i[1]))
    outputs, losses = [], []
    for o in desc["outputs"]:
        if not (isinstance(o, (tuple, list)) and len(o) in (2, 3) and isinstance(o[0], str)):
            raise ValueError(f"model_desc output {o!r}: expected (name, shape[, is_loss])")
        outputs.append(IODescription(o[0], o[1]))
        if len(o) == 3 and o[2]:
            losses.append(o[0])
    if len(losses) != 1:
        raise ValueError(f"model_desc: exactly one output must be the loss (is_loss True), got {len(losses)}")
    return ModelDescription(inputs, outputs, loss=losses[0])


_DEFAULT_OPTIONS: Dict[str, Any] = {
    "batch": {"gradient_accumulation_steps": 1},
    "device": {"id": "cpu", "mem_limit": 0},
    "distributed": {"world_rank": 0, "world_size": 1, "local_rank": 0, "allreduce_post_accumulation": False,
                    "bucket_size_mb": 25.0, "timeout_seconds": 300.0},
    "lr_scheduler": None,
    "mixed_precision": {"enabled": False, "loss_scaler": None},
    "utils": {"frozen_weights": [], "grad_norm_clip": True},
    "debug": {"deterministic_compute": False},
    "_internal_use": {"extra_postprocess": None, "onnx_opset_version": 17},
}


class _Section:
    def __init__(self, path: str, values: Dict[str, Any]):
        for k, v in values.items():
            setattr(self, k, _Section(f"{path}.{k}", v) if isinstance(v, dict) else v)

    def __repr__(self):
        return repr(self.__dict__)


def _merge(path: str, defaults: Dict[str, Any], given: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.copy(defaults)
    for k, v in given.items():
        if k not in defaults:
            raise ValueError(f"ORTTrainerOptions: unknown option '{path}{k}' (known: {sorted(defaults)})")
        out[k] = _merge(f"{path}{k}.", defaults[k], v) if isinstance(defaults[k], dict) and isinstance(v, dict) else v
    return out


class ORTTrainerOptions:
    """Settings as a nested dict, read as attributes (``options.batch.gradient_accumulation_steps``).
    Unknown keys raise.

    * batch.gradient_accumulation_steps: train_step calls per optimizer step (gradients summed).
    * device.id: "cpu" (other devices raise: onnxtrain trains on the CPU).
    * distributed.world_rank / world_size / local_rank: with world_size > 1 the optimizer averages
      gradients over the MPI ranks (they must match :func:`setup_with_mpi`); bucket_size_mb and
      timeout_seconds tune the allreduce. allreduce_post_accumulation: onnxtrain always reduces
      once per optimizer step, after accumulation; False (reduce every micro-step, as ONNX Runtime
      did) would give the same sum at K times the traffic, so both settings run the same way.
    * lr_scheduler: one of onnxtrain.optim.lr_scheduler's (constant, cosine, linear, poly; warmup).
    * mixed_precision.enabled: raises NotImplementedError until mixed precision exists.
    * utils.frozen_weights: parameter names kept fixed; utils.grad_norm_clip: clip the global
      gradient norm (AdamConfig.max_norm_clip; LAMB: 1.0, as apex).
    * debug.deterministic_compute: accepted; onnxtrain's CPU kernels give the same results run to
      run for a fixed thread count, with or without it.
    * _internal_use.extra_postprocess: a function over the exported onnx.ModelProto (edit it in
      place or return a new one), run before the training graphs are built; onnx_opset_version:
      the export's opset (default 17).
    """

    def __init__(self, options: Optional[Dict[str, Any]] = None):
        merged = _merge("", _DEFAULT_OPTIONS, dict(options or {}))
        for k, v in merged.items():
            setattr(self, k, _Section(k, v) if isinstance(v, dict) else v)
        accum = self.batch.gradient_accumulation_steps
        if not isinstance(accum, int) or accum < 1:
            raise ValueError(f"batch.gradient_accumulation_steps must be an int >= 1, got {accum!r}")
        if self.lr_scheduler is not None and not isinstance(self.lr_scheduler, LRScheduler):
            raise ValueError("lr_scheduler must be one of onnxtrain.optim.lr_scheduler's schedulers")
        if self.mixed_precision.enabled:
            raise NotImplementedError("ORTTrainerOptions: mixed_precision.enabled is not implemented in onnxtrain yet")
        if self.device.id not in ("cpu",) and not str(self.device.id).startswith("cpu"):
            raise NotImplementedError(f"ORTTrainerOptions: device '{self.device.id}': onnxtrain trains on the CPU")
        d = self.distributed
        if not (0 <= d.world_rank < d.world_size):
            raise ValueError(f"distributed: world_rank {d.world_rank} is not in [0, world_size {d.world_size})")


def setup_with_mpi() -> Tuple[int, int, int]:
    """Joins the MPI job (mpirun) and returns (world_rank, world_size, local_rank), as ONNX
    Runtime's samples' setup_onnxruntime_with_mpi did. One process outside mpirun: (0, 1, 0)."""
    w = _distributed.init()
    return w.rank, w.size, w.local_rank


def _rename_value(graph: Any, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]
    for out in graph.output:
        if out.name == old:
            out.name = new


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class ORTTrainer:
    """Trains a torch module with onnxtrain (see the module docstring)."""

    def __init__(self, model: Any, model_desc: Any, optim_config: _OptimizerConfig, loss_fn: Any = None,
                 options: Optional[ORTTrainerOptions] = None):
        import torch
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ORTTrainer: model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optim_config, _OptimizerConfig):
            raise TypeError("ORTTrainer: optim_config must be onnxtrain.optim.LambConfig, AdamConfig or SGDConfig")
        self._torch_model = model
        self.model_desc = _model_description(model_desc)
        self.optim_config = optim_config
        self.loss_fn = loss_fn
        self.options = options if options is not None else ORTTrainerOptions()
        if not isinstance(self.options, ORTTrainerOptions):
            self.options = ORTTrainerOptions(self.options)
        self._dir = tempfile.TemporaryDirectory(prefix="orttrainer_")
        self._module: Optional[Module] = None
        self._pending_checkpoint: Optional[str] = None
        self._train_steps = 0          # train_step calls
        self._onnx_names: Dict[str, str] = {}  # torch parameter name -> ONNX initializer name
        d = self.options.distributed
        if d.world_size > 1:
            world = _distributed.init()
            if (world.rank, world.size) != (d.world_rank, d.world_size):
                raise ValueError(f"rank {world.rank} of {world.size}: options.distributed says world_rank "
                                 f"{d.world_rank} of world_size {d.world_size}")

    # ---- building: export -> extra_postprocess -> artifacts -> Module/Optimizer

    def _wrapped(self):
        import torch
        model, loss_fn, desc = self._torch_model, self.loss_fn, self.model_desc
        if loss_fn is None:
            return model
        n_model = len([p for p in inspect.signature(model.forward).parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
        n_model = min(n_model, len(desc.inputs) - 1)

        class WithLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *inputs):
                out = self.model(*inputs[:n_model])
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                return (loss_fn(outs[0] if len(outs) == 1 else out, *inputs[n_model:]), *outs)

        return WithLoss()

    def _export(self, sample: List[np.ndarray]):
        import onnx
        import torch

        from .torch import _compat as _torch_compat
        desc = self.model_desc
        wrapped = self._wrapped()
        dynamic = {}
        for io_desc in list(desc.inputs) + list(desc.outputs):
            axes = {i: str(d) for i, d in enumerate(io_desc.shape) if not isinstance(d, int)}
            if axes:
                dynamic[io_desc.name] = axes
        f = io.BytesIO()
        was_training = wrapped.training
        wrapped.train()
        torch.onnx.export(wrapped, tuple(torch.from_numpy(np.ascontiguousarray(s)) for s in sample), f,
                          input_names=[i.name for i in desc.inputs], output_names=[o.name for o in desc.outputs],
                          opset_version=self.options._internal_use.onnx_opset_version, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING, dynamic_axes=dynamic,
                          **_torch_compat.torchscript_exporter())  # as TrainModule, on torch 1.13 and 2.x
        wrapped.train(was_training)
        proto = onnx.load_from_string(f.getvalue())
        # The wrapper's "model." prefix goes, so initializers keep the torch module's names.
        if self.loss_fn is not None:
            rename = {i.name: i.name[len("model."):] for i in proto.graph.initializer if i.name.startswith("model.")}
            for init in proto.graph.initializer:
                init.name = rename.get(init.name, init.name)
            for node in proto.graph.node:
                node.input[:] = [rename.get(n, n) for n in node.input]
            for inp in proto.graph.input:
                inp.name = rename.get(inp.name, inp.name)
        hook = self.options._internal_use.extra_postprocess
        if hook is not None:
            result = hook(proto)
            if result is not None:
                proto = result
        return proto

    def _build(self, sample: List[np.ndarray]) -> None:
        import onnx
        from onnx import TensorProto, helper
        proto = self._export(sample)
        initializers = {i.name for i in proto.graph.initializer}
        float_types = (TensorProto.FLOAT, TensorProto.DOUBLE)
        float_inits = {i.name for i in proto.graph.initializer if i.data_type in float_types}
        frozen = list(self.options.utils.frozen_weights)
        for name in frozen:
            if name not in initializers:
                raise ValueError(f"ORTTrainer: frozen weight '{name}' is not a parameter of the exported model")
        params = [n for n, p in self._torch_model.named_parameters() if p.requires_grad]
        trainable = [n for n in params if n in float_inits and n not in frozen]
        missing = [n for n in params if n not in initializers and n not in frozen]
        if missing:
            raise ValueError(f"ORTTrainer: parameters {missing} do not appear as initializers of the exported model "
                             "(unused by forward, or renamed by the exporter)")
        for group in self.optim_config.params:
            for name in group["params"]:
                if name not in trainable:
                    raise ValueError(f"ORTTrainer: optimizer group names '{name}', which is not a trainable parameter")
        # The model already computes its loss: the loss the artifacts add is the identity on it.
        # The artifacts name their loss output "loss", so the model's own loss value is renamed.
        loss_name = "orttrainer/model_loss"
        _rename_value(proto.graph, self.model_desc.loss_, loss_name)
        self._exported, self._loss_value = proto, loss_name
        ident = helper.make_model(helper.make_graph(
            [helper.make_node("Identity", ["loss_in"], ["loss_out"])], "identity_loss",
            [helper.make_tensor_value_info("loss_in", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("loss_out", TensorProto.FLOAT, None)]),
            opset_imports=[helper.make_opsetid("", 17)])
        others = [o.name for o in self.model_desc.outputs if o.name != self.model_desc.loss_]
        clip = bool(self.options.utils.grad_norm_clip)
        art = os.path.join(self._dir.name, "artifacts")
        _artifacts.generate_artifacts(proto.SerializeToString(), requires_grad=trainable, frozen_params=frozen,
                                      loss=ident.SerializeToString(), optimizer=self.optim_config.native(clip),
                                      artifact_directory=art, additional_output_names=others,
                                      loss_input_names=[loss_name])
        self._artifacts = art
        self._other_outputs = others
        self._trainable = trainable
        self._open(self._pending_checkpoint or os.path.join(art, "checkpoint"))
        self._pending_checkpoint = None

    def _open(self, checkpoint: str) -> None:
        art = self._artifacts
        self._state = CheckpointState.load_checkpoint(checkpoint)
        self._module = Module(os.path.join(art, "training_model.onnx"), self._state,
                              os.path.join(art, "eval_model.onnx"))
        d = self.options.distributed
        self._optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), self._module,
                                    data_parallel=d.world_size > 1, bucket_bytes=int(d.bucket_size_mb * (1 << 20)),
                                    timeout_seconds=float(d.timeout_seconds),
                                    gradient_accumulation_steps=int(self.options.batch.gradient_accumulation_steps))
        self._base_lr = float(self.optim_config.lr)
        self._set_lr(self._optimizer._optimizer.step_count())
        if "orttrainer.train_steps" in self._state.properties:
            self._train_steps = int(self._state.properties["orttrainer.train_steps"])

    def _set_lr(self, optimizer_steps: int) -> None:
        sched = self.options.lr_scheduler
        factor = sched.factor(optimizer_steps) if sched is not None else 1.0
        self._optimizer.set_learning_rate(self._base_lr * factor)
        if self.optim_config.params:
            self._optimizer._optimizer.set_param_groups(self.optim_config.native_groups(factor))
        self._lr = self._base_lr * factor

    def _inputs(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> List[np.ndarray]:
        names = [i.name for i in self.model_desc.inputs]
        values = list(args)
        for name in names[len(values):]:
            if name not in kwargs:
                raise ValueError(f"ORTTrainer: input '{name}' was not given (model_desc inputs: {names})")
            values.append(kwargs[name])
        if len(values) != len(names):
            raise ValueError(f"ORTTrainer: expected {len(names)} inputs ({names}), got {len(values)}")
        return [np.ascontiguousarray(_to_numpy(v)) for v in values]

    def _outputs(self, outs: Any):
        import torch
        outs = outs if isinstance(outs, list) else [outs]
        tensors = [torch.from_numpy(np.array(o)) for o in outs]
        return tensors[0] if len(tensors) == 1 else tensors

    # ---- ONNX Runtime's methods

    def train_step(self, *args: Any, **kwargs: Any):
        """Forward, backward, gradient accumulation and, every gradient_accumulation_steps calls,
        one optimizer step. Returns the model_desc outputs (loss first) as torch tensors."""
        inputs = self._inputs(args, kwargs)
        if self._module is None:
            self._build(inputs)
        self._module.train()
        outs = self._module(*inputs)
        self._train_steps += 1
        if self._train_steps % self.options.batch.gradient_accumulation_steps == 0:
            self._set_lr(self._optimizer._optimizer.step_count())
            self._optimizer.step()
            self._module.lazy_reset_grad()
        return self._outputs(outs)

    def eval_step(self, *args: Any, **kwargs: Any):
        """Forward and loss in inference mode (Dropout off, BatchNorm running statistics)."""
        inputs = self._inputs(args, kwargs)
        if self._module is None:
            self._build(inputs)
        self._module.eval()
        try:
            return self._outputs(self._module(*inputs))
        finally:
            self._module.train()

    def _require_built(self, what: str) -> None:
        if self._module is None:
            raise RuntimeError(f"ORTTrainer.{what}: the model is exported at the first train_step or eval_step; "
                               "run one first")

    def save_as_onnx(self, path: str) -> None:
        """An inference model with the trained weights: the exported model (plain ONNX ops, after
        extra_postprocess) cut down to the model's own outputs (the loss when it is the only one),
        runnable by onnxtrain.InferenceSession and ONNX Runtime."""
        self._require_built("save_as_onnx")
        from onnx import numpy_helper
        outputs = self._other_outputs or [self._loss_value]
        m = copy.deepcopy(self._exported)  # plain ONNX ops as exported (after extra_postprocess)
        g = m.graph
        needed, keep = set(outputs), []
        for node in reversed(list(g.node)):  # the nodes the outputs depend on
            if needed.intersection(node.output):
                keep.append(node)
                needed.update(n for n in node.input if n)
        del g.node[:]
        g.node.extend(reversed(keep))
        kept_outputs = [o for o in g.output if o.name in outputs]
        del g.output[:]
        g.output.extend(kept_outputs)
        inputs = [i for i in g.input if i.name in needed]
        del g.input[:]
        g.input.extend(inputs)
        params = {n for n, _ in self._state.parameters}
        inits = []
        for init in g.initializer:
            if init.name not in needed:
                continue
            if init.name in params:  # the trained values
                init = numpy_helper.from_array(self._state.parameters[init.name].data, init.name)
            inits.append(init)
        del g.initializer[:]
        g.initializer.extend(inits)
        with open(path, "wb") as f:
            f.write(m.SerializeToString())

    def save_checkpoint(self, path: str, user_dict: Optional[Dict[str, Any]] = None,
                        include_optimizer_states: bool = True) -> None:
        """Parameters, optimizer state (moments, step count) and ``user_dict`` (int, float or str
        values, stored as checkpoint properties), written atomically."""
        self._require_built("save_checkpoint")
        for k, v in (user_dict or {}).items():
            self._state.properties[f"user.{k}"] = v
        self._state.properties["orttrainer.train_steps"] = self._train_steps
        CheckpointState.save_checkpoint(self._state, path, include_optimizer_state=include_optimizer_states)

    def load_checkpoint(self, path: str, strict: bool = False) -> Dict[str, Any]:
        """Restores parameters and optimizer state from ``save_checkpoint``'s file (before the first
        step, it is applied when the model is built). Returns the saved user_dict."""
        state = CheckpointState.load_checkpoint(path)
        user = {k[len("user."):]: v for k, v in state.properties.items() if k.startswith("user.")}
        if self._module is None:
            self._pending_checkpoint = path
        else:
            if strict:
                have = sorted(n for n, _ in self._state.parameters)
                got = sorted(n for n, _ in state.parameters)
                if have != got:
                    raise ValueError(f"ORTTrainer.load_checkpoint: the checkpoint holds {got}, the model {have}")
            self._open(path)
        return user

    def state_dict(self, pytorch_format: bool = False) -> Dict[str, Any]:
        """The parameters: {"model": {"full_precision": {name: array}}, "optimizer": {"step", "lr"}}
        (ONNX Runtime's layout), or {name: torch.Tensor} with pytorch_format. The optimizer moments
        travel with save_checkpoint/load_checkpoint."""
        self._require_built("state_dict")
        weights = {n: p.data for n, p in self._state.parameters}
        if pytorch_format:
            import torch
            return {n: torch.from_numpy(v) for n, v in weights.items()}
        return {"model": {"full_precision": weights},
                "optimizer": {"step": self._optimizer._optimizer.step_count(), "lr": self._lr}}

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> None:
        """Sets parameters from state_dict() (either format)."""
        self._require_built("load_state_dict")
        weights = state_dict.get("model", {}).get("full_precision") if "model" in state_dict else state_dict
        names = {n for n, _ in self._state.parameters}
        if strict and set(weights) != names:
            raise ValueError(f"ORTTrainer.load_state_dict: missing {sorted(names - set(weights))}, "
                             f"unexpected {sorted(set(weights) - names)}")
        for n, v in weights.items():
            if n in names:
                self._state.parameters[n] = np.ascontiguousarray(_to_numpy(v))
