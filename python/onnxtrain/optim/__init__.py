"""Optimizer settings of ONNX Runtime's ORTTrainer (``onnxruntime.training.optim``), mapped onto
onnxtrain's update rules (src/optim). Old scripts keep their configs by changing the import::

    from onnxtrain import optim
    config = optim.LambConfig(lr=1e-3, params=[{"params": ["bert.pooler.bias"], "lambda_coef": 0.0}])

``params`` holds per-parameter groups: dicts with a ``"params"`` list of parameter names and any
of the config's hyperparameters (``lr`` included), which override the config's for those names.

Mapping (names are ONNX Runtime's, update rules are onnxtrain's):

* ``LambConfig``: alpha/beta -> betas, lambda_coef -> weight decay, epsilon, do_bias_correction;
  the update is apex FusedLAMB's (per-tensor trust ratio). ratio_min/ratio_max other than
  -inf/inf (a clamped trust ratio) are not implemented and say so.
* ``AdamConfig``: weight_decay_mode BEFORE_WEIGHT_UPDATE is torch.optim.AdamW (decoupled decay;
  bias correction required), AFTER_WEIGHT_UPDATE is transformers' AdamW (decay after the step,
  do_bias_correction honoured). max_norm_clip is the global gradient-norm clip applied when
  ``ORTTrainerOptions.utils.grad_norm_clip`` is on (the default).
* ``SGDConfig``: plain SGD.
"""
from __future__ import annotations

import enum
import math
from typing import Any, Dict, List, Optional

from .. import _C
from . import lr_scheduler  # noqa: F401  (onnxtrain.optim.lr_scheduler, as in ONNX Runtime)

__all__ = ["LambConfig", "AdamConfig", "SGDConfig", "lr_scheduler"]


class _OptimizerConfig:
    name = ""
    _hyper: Dict[str, Any] = {}

    def __init__(self, params: Optional[List[Dict[str, Any]]], **hyper: Any):
        self.params = list(params or [])
        for k, v in hyper.items():
            setattr(self, k, v)
        if not (isinstance(self.lr, (int, float)) and self.lr >= 0):
            raise ValueError(f"{type(self).__name__}: lr must be a number >= 0, got {self.lr!r}")
        seen = set()
        for i, group in enumerate(self.params):
            if not isinstance(group, dict) or not isinstance(group.get("params"), (list, tuple)):
                raise ValueError(f"{type(self).__name__}: params[{i}] must be a dict with a 'params' list of names")
            for key in group:
                if key != "params" and key not in self._hyper:
                    raise ValueError(f"{type(self).__name__}: params[{i}] sets '{key}', which is not one of "
                                     f"{sorted(self._hyper)}")
            for name in group["params"]:
                if name in seen:
                    raise ValueError(f"{type(self).__name__}: parameter '{name}' is in two groups")
                seen.add(name)
        self._native(self._settings({}))  # validates the hyperparameters now, not at the first step

    def _settings(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: group.get(k, getattr(self, k)) for k in self._hyper}

    def _native(self, s: Dict[str, Any], max_grad_norm: float = 0.0) -> "_C.optim.OptimizerConfig":
        raise NotImplementedError

    def native(self, clip: bool) -> "_C.optim.OptimizerConfig":
        """The onnxtrain config of the default group; ``clip``: apply the config's norm clip."""
        return self._native(self._settings({}), self._clip() if clip else 0.0)

    def native_groups(self, lr_factor: float = 1.0) -> List[tuple]:
        """(names, onnxtrain config) per parameter group, with lr x lr_factor (a schedule's
        multiplier); clipping stays global."""
        out = []
        for g in self.params:
            s = self._settings(g)
            s["lr"] = float(s["lr"]) * lr_factor
            out.append((list(g["params"]), self._native(s)))
        return out

    def _clip(self) -> float:
        return 0.0

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._hyper)
        return f"{type(self).__name__}({args}, params={self.params!r})"


class LambConfig(_OptimizerConfig):
    name = "LambOptimizer"
    _hyper = {"lr": 0.001, "alpha": 0.9, "beta": 0.999, "lambda_coef": 0.0, "ratio_min": -math.inf,
              "ratio_max": math.inf, "epsilon": 1e-6, "do_bias_correction": True}

    def __init__(self, params=None, lr=0.001, alpha=0.9, beta=0.999, lambda_coef=0.0, ratio_min=-math.inf,
                 ratio_max=math.inf, epsilon=1e-6, do_bias_correction=True):
        super().__init__(params, lr=lr, alpha=alpha, beta=beta, lambda_coef=lambda_coef, ratio_min=ratio_min,
                         ratio_max=ratio_max, epsilon=epsilon, do_bias_correction=do_bias_correction)

    def _clip(self) -> float:
        return 1.0  # apex FusedLAMB's max_grad_norm

    def _native(self, s, max_grad_norm=0.0):
        if s["ratio_min"] != -math.inf or s["ratio_max"] != math.inf:
            raise NotImplementedError("LambConfig: a clamped trust ratio (ratio_min/ratio_max) is not implemented; "
                                      "onnxtrain's LAMB is apex FusedLAMB's")
        return _C.optim.OptimizerConfig("lamb", lr=float(s["lr"]), betas=(float(s["alpha"]), float(s["beta"])),
                                        eps=float(s["epsilon"]), weight_decay=float(s["lambda_coef"]),
                                        correct_bias=bool(s["do_bias_correction"]),
                                        max_grad_norm=float(max_grad_norm))


class AdamConfig(_OptimizerConfig):
    name = "AdamOptimizer"

    class DecayMode(enum.IntEnum):
        BEFORE_WEIGHT_UPDATE = 0
        AFTER_WEIGHT_UPDATE = 1

    _hyper = {"lr": 0.001, "alpha": 0.9, "beta": 0.999, "lambda_coef": 0.0, "epsilon": 1e-8,
              "max_norm_clip": 1.0, "do_bias_correction": True, "weight_decay_mode": 0}

    def __init__(self, params=None, lr=0.001, alpha=0.9, beta=0.999, lambda_coef=0.0, epsilon=1e-8,
                 max_norm_clip=1.0, do_bias_correction=True, weight_decay_mode=DecayMode.BEFORE_WEIGHT_UPDATE):
        super().__init__(params, lr=lr, alpha=alpha, beta=beta, lambda_coef=lambda_coef, epsilon=epsilon,
                         max_norm_clip=max_norm_clip, do_bias_correction=do_bias_correction,
                         weight_decay_mode=AdamConfig.DecayMode(weight_decay_mode))

    def _clip(self) -> float:
        return float(self.max_norm_clip)

    def _native(self, s, max_grad_norm=0.0):
        betas = (float(s["alpha"]), float(s["beta"]))
        common = dict(lr=float(s["lr"]), betas=betas, eps=float(s["epsilon"]), weight_decay=float(s["lambda_coef"]),
                      max_grad_norm=float(max_grad_norm))
        if AdamConfig.DecayMode(s["weight_decay_mode"]) == AdamConfig.DecayMode.AFTER_WEIGHT_UPDATE:
            return _C.optim.OptimizerConfig("hf_adamw", correct_bias=bool(s["do_bias_correction"]), **common)
        if not s["do_bias_correction"]:
            raise NotImplementedError("AdamConfig: do_bias_correction=False needs weight_decay_mode "
                                      "AFTER_WEIGHT_UPDATE (transformers' AdamW); torch's AdamW always corrects")
        return _C.optim.OptimizerConfig("adamw", **common)


class SGDConfig(_OptimizerConfig):
    name = "SGDOptimizer"
    _hyper = {"lr": 0.001}

    def __init__(self, params=None, lr=0.001):
        super().__init__(params, lr=lr)

    def _native(self, s, max_grad_norm=0.0):
        return _C.optim.OptimizerConfig("sgd", lr=float(s["lr"]), weight_decay=0.0, max_grad_norm=float(max_grad_norm))
