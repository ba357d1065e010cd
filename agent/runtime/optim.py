"""AdamW written out, so its state is plain tensors a worker can send to a
peer. Element-wise, so a tensor-parallel shard updates exactly as the same
slice of the full tensor would; the math is that of torch.optim.AdamW.

Gradient clipping by the global norm: every worker adds the squares of the
gradient elements it counts (`local_sq_norm`), the sum over all workers is the
squared norm of the whole model's gradient, and every worker scales by the
same factor (`clip_factor`). The reference counts every parameter once."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from drover.planner.training import Optimizer

CLIP_EPS = 1e-6


@dataclass(frozen=True)
class AdamW(Optimizer):
    @classmethod
    def of(cls, optimizer: Optimizer) -> AdamW:
        return cls(**{k: getattr(optimizer, k) for k in Optimizer.__dataclass_fields__})

    @staticmethod
    def new_state(param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param)}

    @torch.no_grad()
    def update(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, torch.Tensor],
        step: int,
        lr: float | None = None,
    ) -> None:
        """One update; `step` counts from 1 and is the same for every parameter; `lr` is the
        schedule's for this step (default: the optimizer's lr)."""
        lr = self.lr if lr is None else lr
        param.mul_(1 - lr * self.weight_decay)
        state["exp_avg"].lerp_(grad, 1 - self.beta1)
        state["exp_avg_sq"].mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        bias1 = 1 - self.beta1**step
        bias2_sqrt = math.sqrt(1 - self.beta2**step)
        denom = (state["exp_avg_sq"].sqrt() / bias2_sqrt).add_(self.eps)
        param.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)


def local_sq_norm(grads: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of the given gradients, in float64 (a one-element tensor on `device`)."""
    total = torch.zeros(1, dtype=torch.float64, device=device)
    for g in grads:
        total += torch.linalg.vector_norm(g, dtype=torch.float64) ** 2
    return total


def clip_factor(sq_norm: float, clip_norm: float) -> float:
    """The factor every gradient is scaled by: min(1, clip_norm / (norm + 1e-6))."""
    return min(1.0, clip_norm / (math.sqrt(sq_norm) + CLIP_EPS))


STATE_KEYS = ("exp_avg", "exp_avg_sq")
