"""AdamW written out, so its state is plain tensors a worker can send to a
peer. Element-wise, so a tensor-parallel shard updates exactly as the same
slice of the full tensor would; the math is that of torch.optim.AdamW."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdamW:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01

    @staticmethod
    def new_state(param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param)}

    @torch.no_grad()
    def update(self, param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], step: int) -> None:
        """One update; `step` counts from 1 and is the same for every parameter."""
        param.mul_(1 - self.lr * self.weight_decay)
        state["exp_avg"].lerp_(grad, 1 - self.beta1)
        state["exp_avg_sq"].mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        bias1 = 1 - self.beta1**step
        bias2_sqrt = math.sqrt(1 - self.beta2**step)
        denom = (state["exp_avg_sq"].sqrt() / bias2_sqrt).add_(self.eps)
        param.addcdiv_(state["exp_avg"], denom, value=-self.lr / bias1)


STATE_KEYS = ("exp_avg", "exp_avg_sq")
