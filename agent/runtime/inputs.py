"""What a job reads, opened and checked before any worker trains: the data
source and its validation split, the Hugging Face weights it starts from,
the checkpoint it resumes and where its checkpoints go. Every path is taken
relative to the data root and refused if it leads outside it; the launcher
(or the agent) opens them once to fail early with a clear error, and each
worker opens them again for itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec
from drover.planner.training import SYNTHETIC, Evaluation, Training

from .checkpoint import check_resumable, find_checkpoint
from .data import Shards, Synthetic
from .handoff import inside
from .hf import HfWeights


@dataclass
class Inputs:
    train: Synthetic | Shards
    val: Shards | None
    init: HfWeights | None
    resume: Path | None  # a complete checkpoint
    start_step: int
    checkpoints: Path | None  # where this job's checkpoints go


def check_eval_samples(evaluation: Evaluation, windows: int, global_batch: int) -> None:
    """Evaluation reads whole global batches of distinct windows: past the split's windows it
    read the first ones again and called them more samples."""
    most, samples = windows // global_batch * global_batch, evaluation.samples
    if evaluation.batches(global_batch) * global_batch > windows:
        allowed = (
            f"at most {most} (the val split holds {windows} windows, read in global batches of {global_batch})"
            if most
            else f"a val split of at least one global batch ({global_batch} windows; it holds {windows}): "
            "prepare the shards with a larger --val-fraction"
        )
        raise SpecError("job", "eval.samples", samples, allowed)


def open_inputs(spec: ModelSpec, training: Training, data_root: str | Path) -> Inputs:
    root = Path(data_root)
    if training.data == SYNTHETIC:
        train, val = Synthetic(training.seed, spec.seq_len, spec.vocab), None
    else:
        shards = inside(root, training.data)
        train = Shards(shards, "train", spec.seq_len, spec.vocab, training.seed, spec.global_batch)
        val = None
        if training.eval:
            val = Shards(shards, "val", spec.seq_len, spec.vocab, training.seed, spec.global_batch)
            check_eval_samples(training.eval, val.windows, spec.global_batch)
    init = HfWeights(inside(root, training.init), spec) if training.init else None
    resume, start_step = None, 0
    if training.resume:
        resume = find_checkpoint(inside(root, training.resume))
        start_step = check_resumable(resume, spec, training.steps)
    checkpoints = inside(root, training.checkpoint.dir) if training.checkpoint else None
    if checkpoints is not None and checkpoints.exists() and not checkpoints.is_dir():  # found at the first save
        raise SpecError("job", "checkpoint.dir", training.checkpoint.dir, "a folder (or none yet), not a file")
    return Inputs(train, val, init, resume, start_step, checkpoints)
