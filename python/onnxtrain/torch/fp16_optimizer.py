"""FP16_Optimizer: trains a model whose parameters are float16 or bfloat16 with any torch optimizer
stepping fp32 master copies, with (dynamic) loss scaling and overflow skipping.

    model = model.to(torch.float16)                       # or bfloat16; or a TrainModule of it
    optimizer = FP16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), dynamic_loss_scale=True)
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    optimizer.backward(loss)                              # (loss * scale).backward(); grads -> masters
    optimizer.clip_master_grads(1.0)                      # optional, on the unscaled fp32 grads
    optimizer.step()                                      # skipped (optimizer.overflow) on inf/nan

Dynamic loss scaling follows PyTorch's GradScaler and ONNX Runtime: the scale starts at
``init_scale`` (2^16), halves (not below ``min_scale``) and the update is skipped when a gradient
is inf or NaN, and doubles after ``scale_window`` (2000) consecutive finite steps.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

_HALF = (torch.float16, torch.bfloat16)


class DynamicLossScaler:
    """The scale and its counters; ``update(overflow)`` applies one step's outcome."""

    def __init__(self, init_scale: float = 2.0 ** 16, scale_factor: float = 2.0, scale_window: int = 2000,
                 min_scale: float = 1.0):
        if init_scale <= 0 or scale_factor <= 1 or scale_window < 1 or min_scale <= 0:
            raise ValueError("DynamicLossScaler: init_scale and min_scale > 0, scale_factor > 1, scale_window >= 1")
        self.loss_scale = float(init_scale)
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.good_steps = 0      # finite steps since the last change of scale
        self.skipped_steps = 0   # updates skipped for overflow, over the whole run

    def update(self, overflow: bool) -> None:
        if overflow:
            self.loss_scale = max(self.loss_scale / self.scale_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.scale_window:
            self.loss_scale *= self.scale_factor
            self.good_steps = 0

    def state_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


class FP16_Optimizer:
    """Wraps ``init_optimizer`` (any torch.optim.Optimizer, FusedAdam included) built over a model's
    float16/bfloat16 parameters: the wrapped optimizer is re-pointed at fp32 master copies, which
    it steps; the model's parameters are refreshed from them after each update.

    Args:
        init_optimizer: the optimizer over the model's parameters (no state yet).
        static_loss_scale: the fixed scale when ``dynamic_loss_scale`` is False (1.0: none).
        dynamic_loss_scale: scale dynamically (DynamicLossScaler), for fp16.
        dynamic_loss_args: keyword arguments of DynamicLossScaler (init_scale, scale_window, ...).
        verbose: print a line on every skipped step.
    """

    def __init__(self, init_optimizer: torch.optim.Optimizer, static_loss_scale: float = 1.0,
                 dynamic_loss_scale: bool = False, dynamic_loss_args: Optional[Dict[str, Any]] = None,
                 verbose: bool = False):
        if not isinstance(init_optimizer, torch.optim.Optimizer):
            raise TypeError(f"FP16_Optimizer wraps a torch.optim.Optimizer, got {type(init_optimizer).__name__}")
        if any(len(s) for s in init_optimizer.state.values()):
            raise ValueError("FP16_Optimizer: wrap the optimizer before its first step (its state would "
                             "belong to the half-precision parameters)")
        self.optimizer = init_optimizer
        self.model_params: List[List[torch.Tensor]] = []
        self.master_params: List[List[torch.Tensor]] = []
        for group in self.optimizer.param_groups:
            model, master = [], []
            for p in group["params"]:
                model.append(p)
                if p.dtype in _HALF:
                    m = p.detach().clone().float().requires_grad_(p.requires_grad)
                elif p.dtype == torch.float32:
                    m = p  # already fp32: stepped in place
                else:
                    raise TypeError(f"FP16_Optimizer: parameters must be float16, bfloat16 or float32, got {p.dtype}")
                master.append(m)
            group["params"] = master
            self.model_params.append(model)
            self.master_params.append(master)
        self.dynamic = dynamic_loss_scale
        if dynamic_loss_scale:
            self.scaler = DynamicLossScaler(**(dynamic_loss_args or {}))
        else:
            if dynamic_loss_args:
                raise ValueError("FP16_Optimizer: dynamic_loss_args needs dynamic_loss_scale=True")
            self.scaler = DynamicLossScaler(init_scale=static_loss_scale, scale_window=2 ** 62)
        self.verbose = verbose
        self.overflow = False
        self._grads_ready = False

    # ---- the loop ---------------------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        return self.scaler.loss_scale

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for model, master in zip(self.model_params, self.master_params):
            for p, m in zip(model, master):
                for t in {id(p): p, id(m): m}.values():
                    if t.grad is None:
                        continue
                    if set_to_none:
                        t.grad = None
                    else:
                        t.grad.detach_().zero_()
        self._grads_ready = False

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, update_master_grads: bool = True) -> None:
        """(loss * scale).backward(), then the gradients move to the masters, unscaled."""
        (loss.float() * self.loss_scale).backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    @torch.no_grad()
    def update_master_grads(self) -> None:
        """Master grads = model grads / scale, in fp32; sets ``overflow`` when any is inf or NaN."""
        inv = 1.0 / self.loss_scale
        overflow = False
        for model, master in zip(self.model_params, self.master_params):
            for p, m in zip(model, master):
                if p.grad is None:
                    continue
                g = p.grad.float() * inv if m is not p else p.grad.mul_(inv)
                if m is not p:
                    m.grad = g
                overflow = overflow or not bool(torch.isfinite(g).all())
        self.overflow = overflow
        self._grads_ready = True

    def clip_master_grads(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clips the fp32 master gradients' global norm; returns the norm before clipping (-1 on
        overflow, when nothing is clipped)."""
        if not self._grads_ready:
            self.update_master_grads()
        if self.overflow:
            return -1.0
        grads = [m for group in self.master_params for m in group if m.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm, norm_type))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> bool:
        """Steps the wrapped optimizer on the masters and copies them into the model; returns
        False, leaving every parameter as it was, when the gradients overflowed (the scale then
        halves)."""
        if closure is not None:
            raise NotImplementedError("FP16_Optimizer.step: closures are not supported; call backward() first")
        if not self._grads_ready:
            self.update_master_grads()
        self._grads_ready = False
        self.scaler.update(self.overflow)
        if self.overflow:
            if self.verbose:
                print(f"FP16_Optimizer: gradient overflow, update skipped; loss scale now {self.loss_scale:g}")
            return False
        self.optimizer.step()
        for model, master in zip(self.model_params, self.master_params):
            for p, m in zip(model, master):
                if m is not p:
                    p.data.copy_(m.data)
        return True

    # ---- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "dynamic": self.dynamic, "master_params": [[m.detach().clone() for m in g] for g in self.master_params]}

    @torch.no_grad()
    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.dynamic = state["dynamic"]
        for masters, saved, model in zip(self.master_params, state["master_params"], self.model_params):
            for m, s, p in zip(masters, saved, model):
                m.copy_(s)
                if m is not p:
                    p.copy_(s)

    def __repr__(self) -> str:
        return f"FP16_Optimizer({self.optimizer!r}, loss_scale={self.loss_scale:g}, dynamic={self.dynamic})"
