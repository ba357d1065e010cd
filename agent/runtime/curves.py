"""Training curves as TensorBoard event files, where users look for them.

Rank 0 writes OUT/tensorboard: per step train/loss, train/lr,
train/samples_per_s, train/step_time_s, train/grad_norm (with clipping) and
plan/version; eval/val_loss after each evaluation. A writer opened at step N
(0 for a new job; later for a resumed job, a new rank 0 after a recovery, a
rollback) purges whatever an earlier writer in the folder logged from step N
on, so steps run again are shown once, and an earlier job's curves in a
reused out dir are hidden.
"""

from __future__ import annotations

from pathlib import Path


class Curves:
    """Opened on first use by whichever worker is rank 0 (ranks change with the world)."""

    def __init__(self, out_dir: str | Path, enabled: bool):
        self.folder, self.enabled = Path(out_dir) / "tensorboard", enabled
        self.writer = None

    def _open(self, step: int):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: rank 0 only

            self.writer = SummaryWriter(str(self.folder), purge_step=step, flush_secs=10)
        return self.writer

    def step(self, row: dict) -> None:
        if not self.enabled:
            return
        writer, step = self._open(row["step"]), row["step"]
        for key in ("loss", "lr", "samples_per_s", "step_time_s", "grad_norm"):
            if key in row:
                writer.add_scalar(f"train/{key}", row[key], step)
        writer.add_scalar("plan/version", row["plan_version"], step)

    def evaluation(self, done: int, val_loss: float) -> None:
        if self.enabled:
            self._open(done).add_scalar("eval/val_loss", val_loss, done)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
