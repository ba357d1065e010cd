"""The optimizer's settings and the learning-rate schedule of a job: parsed
from a job file (or `drover train --optimizer FILE`) and checked here, in
the layer both processes import (the control plane checks a job, the agent
reads what StartJob carries; agent/runtime/optim.py applies it), with no torch.

    optimizer: {lr, betas: [b1, b2], eps, weight_decay, clip_norm}
    schedule:  {warmup_steps, decay: constant | cosine, min_lr}

Every field is optional. clip_norm (default none: no clipping) bounds the
global gradient norm over every parameter element of the model, counted
once whatever the plan. The learning rate at a step is a pure function of
(optimizer, schedule, step, the job's steps): `lr_at`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from drover.planner.spec_io import Fields

DECAYS = ("constant", "cosine")
# YAML 1.1 (PyYAML) reads 1e-8, without a dot, as a string: take it as the number it spells.
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _with_exponents(f: Fields, keys: tuple[str, ...]) -> Fields:
    data = {
        k: float(v) if k in keys and isinstance(v, str) and _EXPONENT.fullmatch(v) else v for k, v in f.data.items()
    }
    return Fields(data, f.source, f.prefix)


@dataclass(frozen=True)
class Optimizer:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float | None = None  # global gradient norm bound; None: no clipping

    def to_dict(self) -> dict:
        d = {"lr": self.lr, "betas": [self.beta1, self.beta2], "eps": self.eps, "weight_decay": self.weight_decay}
        return d | ({"clip_norm": self.clip_norm} if self.clip_norm is not None else {})


@dataclass(frozen=True)
class Schedule:
    warmup_steps: int = 0
    decay: str = "constant"
    min_lr: float = 0.0

    def to_dict(self) -> dict:
        """The mapping parse_schedule reads back (min_lr only where it means something)."""
        d = asdict(self)
        return d if self.decay == "cosine" else {k: v for k, v in d.items() if k != "min_lr"}


def lr_at(optimizer: Optimizer, schedule: Schedule, step: int, total_steps: int) -> float:
    """The learning rate of step `step` (from 0) of a job of `total_steps` steps: linear
    warm-up to lr over warmup_steps (lr * (step+1) / warmup_steps), then lr (constant) or
    a cosine from lr down towards min_lr over the remaining steps."""
    lr, warm = optimizer.lr, schedule.warmup_steps
    if step < warm:
        return lr * (step + 1) / warm
    if schedule.decay == "constant":
        return lr
    progress = min(1.0, (step - warm) / max(1, total_steps - warm))
    return schedule.min_lr + (lr - schedule.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_from(f: Fields | None) -> Optimizer:
    """The `optimizer` mapping (None: every default)."""
    if f is None:
        return Optimizer()
    d = Optimizer()
    f = _with_exponents(f, ("lr", "eps", "weight_decay", "clip_norm"))
    f.reject_unknown({"lr", "betas", "eps", "weight_decay", "clip_norm"})
    betas = f.get("betas", [d.beta1, d.beta2])
    allowed = "two numbers [b1, b2], each >= 0 and < 1"
    if not isinstance(betas, list) or len(betas) != 2:
        raise f.error("betas", betas, allowed)
    for b in betas:
        ok = isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and 0 <= b < 1
        if not ok:
            raise f.error("betas", betas, allowed)
    clip = f.get("clip_norm", None)
    return Optimizer(
        lr=f.number("lr", d.lr),
        beta1=float(betas[0]),
        beta2=float(betas[1]),
        eps=f.number("eps", d.eps),
        weight_decay=f.number("weight_decay", d.weight_decay, exclusive=False),
        clip_norm=None if clip is None else f.number("clip_norm"),
    )


def schedule_from(f: Fields | None, optimizer: Optimizer) -> Schedule:
    """The `schedule` mapping (None: every default); min_lr must not exceed the optimizer's lr."""
    if f is None:
        return Schedule()
    f = _with_exponents(f, ("min_lr",))
    f.reject_unknown({"warmup_steps", "decay", "min_lr"})
    decay = f.get("decay", "constant")
    if decay not in DECAYS:
        raise f.error("decay", decay, f"one of {', '.join(DECAYS)}")
    min_lr = f.number("min_lr", 0.0, exclusive=False, maximum=optimizer.lr)
    if decay == "constant" and "min_lr" in f.data:
        raise f.error("min_lr", min_lr, "only with decay: cosine (a constant schedule stays at lr)")
    return Schedule(f.integer("warmup_steps", 0, minimum=0), decay, min_lr)


def training_from(f: Fields) -> tuple[Optimizer, Schedule]:
    """The `optimizer` and `schedule` keys of a mapping (a job file, or an --optimizer file)."""
    opt_fields = f.mapping("optimizer") if "optimizer" in f.data else None
    optimizer = optimizer_from(opt_fields)
    sched_fields = f.mapping("schedule") if "schedule" in f.data else None
    return optimizer, schedule_from(sched_fields, optimizer)


def training_from_dict(data, source: str) -> tuple[Optimizer, Schedule]:
    """An --optimizer file: a mapping with optimizer and/or schedule."""
    f = Fields(data, source)
    f.reject_unknown({"optimizer", "schedule"})
    return training_from(f)
