"""ONNX Runtime ORTTrainer's learning-rate schedulers: lr = base lr x factor(x), x = optimizer
steps done / total_steps, with linear warmup over the first ``warmup`` fraction of the steps."""
from __future__ import annotations

import math

__all__ = ["LRScheduler", "ConstantWarmupLRScheduler", "CosineWarmupLRScheduler", "LinearWarmupLRScheduler",
           "PolyWarmupLRScheduler"]


class LRScheduler:
    def __init__(self, total_steps: int, warmup: float = 0.002):
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be an int >= 1, got {total_steps!r}")
        if not 0 <= warmup < 1:
            raise ValueError(f"warmup is a fraction of total_steps in [0, 1), got {warmup!r}")
        self.total_steps = total_steps
        self.warmup = warmup

    def factor(self, step: int) -> float:
        """The multiplier of the base learning rate after ``step`` optimizer steps."""
        x = step / self.total_steps
        if x < self.warmup:
            return x / self.warmup
        return self._decay(x)

    def _decay(self, x: float) -> float:
        raise NotImplementedError


class ConstantWarmupLRScheduler(LRScheduler):
    def _decay(self, x):
        return 1.0


class CosineWarmupLRScheduler(LRScheduler):
    def __init__(self, total_steps: int, cycles: float = 0.5, warmup: float = 0.002):
        super().__init__(total_steps, warmup)
        self.cycles = cycles

    def _decay(self, x):
        return 0.5 * (1.0 + math.cos(math.pi * 2.0 * self.cycles * x))


class LinearWarmupLRScheduler(LRScheduler):
    def _decay(self, x):
        return max((x - 1.0) / (self.warmup - 1.0), 0.0)


class PolyWarmupLRScheduler(LRScheduler):
    def __init__(self, total_steps: int, warmup: float = 0.002, power: float = 1.0):
        super().__init__(total_steps, warmup)
        self.power = power

    def _decay(self, x):
        return max(1.0 - x, 0.0) ** self.power
