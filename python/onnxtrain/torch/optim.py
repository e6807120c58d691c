"""Fused optimizers for torch modules, running onnxtrain's multi-tensor C++ kernels.

``FusedAdam`` is a drop-in ``torch.optim.Optimizer``: each ``step()`` runs ONE multi-tensor pass
over all parameters of a group (the parameters, gradients and moments cross to C++ as numpy views of
the torch CPU tensors: no copies). Its state uses torch's names (``step``, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq``), so ``state_dict()`` round-trips with ``torch.optim.AdamW``.

Modes:
  ``"adamw"``    torch.optim.AdamW: decoupled decay ``p *= 1 - lr * wd`` (``adam_w_mode=True``)
  ``"adam_l2"``  torch.optim.Adam: L2 decay ``g += wd * p`` (``adam_w_mode=False``)
  ``"hf"``       transformers' AdamW: eps outside the bias correction, ``correct_bias`` flag
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import _C

_MODES = {"adamw": "adamw", "adam_l2": "adam", "adam": "adam", "hf": "hf_adamw", "hf_adamw": "hf_adamw"}


def _as_numpy(t: torch.Tensor, what: str):
    if t.device.type != "cpu":
        raise RuntimeError(f"FusedAdam: {what} is on {t.device}; onnxtrain's fused update runs on CPU tensors")
    if t.is_sparse:
        raise RuntimeError(f"FusedAdam: {what} is sparse; sparse gradients are not supported")
    return t.detach().numpy()


class FusedAdam(torch.optim.Optimizer):
    """Adam/AdamW with one fused multi-tensor C++ update per parameter group.

    Args:
        params: parameters or parameter groups.
        lr, betas, eps, weight_decay: as torch.optim.AdamW (defaults 1e-3, (0.9, 0.999), 1e-8, 1e-2).
        adam_w_mode: True for decoupled weight decay (torch AdamW), False for L2 (torch Adam).
        mode: overrides adam_w_mode: "adamw", "adam_l2" or "hf" (transformers' AdamW).
        amsgrad: torch's amsgrad (modes "adamw" and "adam_l2").
        correct_bias: bias correction of mode "hf".
        max_grad_norm: when > 0, clips the group's global gradient norm first, as
            torch.nn.utils.clip_grad_norm_ would (the .grad tensors are left unscaled).
        maximize: maximize the objective (torch's maximize).

    float16/bfloat16 parameters get fp32 moments and an fp32 master copy (state "master_param")
    that the update steps; the parameter holds its rounding after each step.
    """

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, adam_w_mode: bool = True, mode: Optional[str] = None,
                 amsgrad: bool = False, correct_bias: bool = True, max_grad_norm: float = 0.0,
                 maximize: bool = False):
        if mode is None:
            mode = "adamw" if adam_w_mode else "adam_l2"
        if mode not in _MODES:
            raise ValueError(f"FusedAdam: unknown mode {mode!r}; expected 'adamw', 'adam_l2' or 'hf'")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, mode=mode, amsgrad=amsgrad,
                        correct_bias=correct_bias, max_grad_norm=max_grad_norm, maximize=maximize)
        super().__init__(params, defaults)

    def _config(self, group: Dict[str, Any]):
        mode = _MODES[group["mode"]]
        kw = dict(lr=float(group["lr"]), betas=tuple(float(b) for b in group["betas"]), eps=float(group["eps"]),
                  weight_decay=float(group["weight_decay"]), max_grad_norm=float(group["max_grad_norm"]))
        if mode == "hf_adamw":
            kw["correct_bias"] = bool(group["correct_bias"])
        else:
            kw["amsgrad"] = bool(group["amsgrad"])
            kw["maximize"] = bool(group["maximize"])
        return _C.optim.OptimizerConfig(mode, **kw)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            config = self._config(group)
            names = config.state_names()
            # Parameters are stepped together when they share a step count and a dtype (always,
            # unless some parameters missed updates): one C++ pass per bucket.
            buckets: Dict[Tuple[int, torch.dtype], List[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
                    raise RuntimeError(f"FusedAdam: parameters must be float32, float64, float16 or bfloat16, "
                                       f"got {p.dtype}")
                if not p.is_contiguous():
                    raise RuntimeError("FusedAdam: parameters must be contiguous to be updated in place")
                state = self.state[p]
                # Half parameters: fp32 moments and an fp32 master copy ("master_param") that the
                # update steps; the parameter is then its rounding.
                half = p.dtype in (torch.float16, torch.bfloat16)
                sdt = torch.float32 if half else p.dtype
                if half and "master_param" not in state:
                    state["master_param"] = p.detach().float().contiguous()
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                for name in names:
                    if name not in state:  # fresh, or e.g. amsgrad switched on after a restore
                        state[name] = torch.zeros_like(p, dtype=sdt, memory_format=torch.contiguous_format)
                    elif not state[name].is_contiguous() or state[name].dtype != sdt:
                        state[name] = state[name].to(dtype=sdt).contiguous()
                step = int(state["step"].item()) if torch.is_tensor(state["step"]) else int(state["step"])
                buckets.setdefault((step, sdt), []).append(p)
            if len(buckets) > 1 and config.max_grad_norm > 0:
                # Clipping is over the whole group: scale the gradients here, as torch would.
                torch.nn.utils.clip_grad_norm_([p for ps in buckets.values() for p in ps], config.max_grad_norm)
                config.max_grad_norm = 0.0
            for (step, _), params in buckets.items():
                masters = [self.state[p].get("master_param", p) for p in params]
                arrays = [_as_numpy(m, "a parameter") for m in masters]
                grads = [_as_numpy(p.grad if m is p else p.grad.float(), "a gradient") for p, m in zip(params, masters)]
                moments = {name: [_as_numpy(self.state[p][name], f"state {name!r}") for p in params]
                           for name in names}
                _C.optim.multi_tensor_step(config, step + 1, arrays, grads, moments)
                for p, m in zip(params, masters):
                    if m is not p:
                        p.copy_(m)
                for p in params:
                    s = self.state[p]
                    if torch.is_tensor(s["step"]):
                        s["step"] += 1
                    else:
                        s["step"] = torch.tensor(float(s["step"] + 1))
        return loss
