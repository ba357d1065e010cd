"""How a job trains, besides the model and the plans: steps and seed, the
optimizer and learning-rate schedule, the data, the starting weights,
checkpoints, evaluation and precision. Parsed from a job file and checked
here, in the layer both processes import (the control plane checks a job,
the agent reads what StartJob carries; agent/runtime applies it), with no torch.

    steps, seed
    optimizer:  {lr, betas: [b1, b2], eps, weight_decay, clip_norm}
    schedule:   {warmup_steps, decay: constant | cosine, min_lr}
    data:       synthetic | DIR          (token shards: drover data prepare)
    init:       DIR                      (a Hugging Face Llama directory)
    checkpoint: {dir, every_steps, keep}
    eval:       {every_steps, samples}   (validation loss on the shards' val split)
    precision:  fp32 | bf16              (bf16: CUDA compute, fp32 master weights)

Paths (data, init, checkpoint.dir, a resume directory) are relative to the
data root of whoever runs the workers: an agent's --data-root, or the
directory `drover train` runs in. They never leave it (no absolute paths, no
`..`), so a job from the network names no host path.

Every field but steps is optional. clip_norm (default none: no clipping) bounds the
global gradient norm over every parameter element of the model, counted
once whatever the plan. The learning rate at a step is a pure function of
(optimizer, schedule, step, the job's steps): `lr_at`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

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
    """The `optimizer` and `schedule` keys of a job file."""
    opt_fields = f.mapping("optimizer") if "optimizer" in f.data else None
    optimizer = optimizer_from(opt_fields)
    sched_fields = f.mapping("schedule") if "schedule" in f.data else None
    return optimizer, schedule_from(sched_fields, optimizer)


SYNTHETIC = "synthetic"
PRECISIONS = ("fp32", "bf16")
MAX_PATH = 1024


@dataclass(frozen=True)
class Checkpointing:
    dir: str
    every_steps: int = 0  # 0: only after the last step
    keep: int = 2  # the newest K complete checkpoints stay


@dataclass(frozen=True)
class Evaluation:
    every_steps: int
    samples: int = 64  # the first N windows of the validation split, the same each time

    def batches(self, global_batch: int) -> int:
        """The whole global batches an evaluation reads: `samples` rounded up."""
        return -(-self.samples // global_batch)


@dataclass(frozen=True)
class Training:
    steps: int
    seed: int = 0
    optimizer: Optimizer = field(default_factory=Optimizer)
    schedule: Schedule = field(default_factory=Schedule)
    data: str = SYNTHETIC
    init: str | None = None
    checkpoint: Checkpointing | None = None
    eval: Evaluation | None = None
    precision: str = "fp32"
    resume: str | None = None  # a checkpoint directory (or a directory of them: the newest)
    tensorboard: bool = True  # training curves as TensorBoard event files in OUT/tensorboard

    def to_dict(self) -> dict:
        """The job-file mapping `training_from_job` reads back."""
        d = {"steps": self.steps, "seed": self.seed, "optimizer": self.optimizer.to_dict()}
        d["schedule"] = self.schedule.to_dict()
        d["data"] = self.data
        if self.init:
            d["init"] = self.init
        if self.checkpoint:
            d["checkpoint"] = asdict(self.checkpoint)
        if self.eval:
            d["eval"] = asdict(self.eval)
        d["precision"] = self.precision
        if self.resume:
            d["resume"] = self.resume
        d["tensorboard"] = self.tensorboard
        return d


TRAINING_KEYS = {
    *("steps", "seed", "optimizer", "schedule", "data", "init", "checkpoint", "eval", "precision", "resume"),
    "tensorboard",
}


def relative_path(f: Fields, key: str, value=None) -> str:
    """A path inside the data root: relative, without `..`, of bounded length."""
    value = f.get(key) if value is None else value
    allowed = f"a relative path inside the data root (no leading '/', no '..', at most {MAX_PATH} printable characters)"
    if not isinstance(value, str) or not value or len(value) > MAX_PATH or not value.isprintable():
        raise f.error(key, value, allowed)
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise f.error(key, value, allowed)
    return value


def training_from_job(f: Fields) -> Training:
    """The training keys of a job file (the caller rejects keys it does not know)."""
    optimizer, schedule = training_from(f)
    data = f.get("data", SYNTHETIC)
    if data != SYNTHETIC:
        data = relative_path(f, "data")
    checkpoint = evaluation = None
    if "checkpoint" in f.data:
        c = f.mapping("checkpoint")
        c.reject_unknown({"dir", "every_steps", "keep"})
        checkpoint = Checkpointing(
            relative_path(c, "dir"), c.integer("every_steps", 0, minimum=0), c.integer("keep", 2, maximum=1000)
        )
    if "eval" in f.data:
        e = f.mapping("eval")
        e.reject_unknown({"every_steps", "samples"})
        if data == SYNTHETIC:
            raise f.error("eval", e.data, "only with data: DIR (token shards with a validation split)")
        evaluation = Evaluation(e.integer("every_steps"), e.integer("samples", 64, maximum=1 << 20))
    tensorboard = f.get("tensorboard", True)
    if not isinstance(tensorboard, bool):
        raise f.error("tensorboard", tensorboard, "true or false")
    precision = f.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise f.error("precision", precision, f"one of {', '.join(PRECISIONS)}")
    return Training(
        steps=f.integer("steps"),  # at most MAX_INTEGER, as every integer
        seed=f.integer("seed", 0, minimum=0, maximum=(1 << 63) - 1),
        optimizer=optimizer,
        schedule=schedule,
        data=data,
        init=relative_path(f, "init") if "init" in f.data else None,
        checkpoint=checkpoint,
        eval=evaluation,
        precision=precision,
        resume=relative_path(f, "resume") if "resume" in f.data else None,
        tensorboard=tensorboard,
    )
