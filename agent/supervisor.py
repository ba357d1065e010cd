"""A job's worker processes on this node: start them, hand them plans and
emulated slowdowns through their inbox, read their telemetry, watch them."""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

from drover.planner.model import ModelSpec, model_from_dict
from drover.planner.plan import Plan
from drover.planner.spec_io import Fields
from drover.planner.training import TRAINING_KEYS, Training, training_from_job

from .logs import JOB_ID, log_file
from .runtime.handoff import (
    WorkerArgs,
    check_inputs,
    inside,
    new_lines,
    no_links_out,
    pace,
    start_worker,
    telemetry_file,
    worker_context,
)

# A control plane stores a job's history in batches (every second): the steps of the newest
# batch are lost with it if it is killed. An agent sends this many newest steps again on a new
# stream; the control plane keeps each step once.
RESENT_STEPS = 256
RESENT_BYTES = 64 * 1024  # of a trace a new rank 0's agent reads again: a few hundred steps


def line_near_end(path: Path, span: int) -> int:
    """The offset of the first whole line within the last `span` bytes of a file (0 if none)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - span)
            f.seek(start)
            head = f.read(span)
    except OSError:
        return 0
    if start == 0:
        return 0
    cut = head.find(b"\n")
    return size if cut < 0 else start + cut + 1


def worker_job(payload: dict, steps: int, seed: int) -> tuple[ModelSpec, Training]:
    """StartJob.model_yaml, parsed: the job with its model inline (JobSpec.workers_json),
    or the model alone (what a control plane before optimizers sends)."""
    if not (isinstance(payload, dict) and isinstance(payload.get("model"), dict)):
        return model_from_dict(payload, "job model"), Training(steps, seed)
    f = Fields({"steps": steps, "seed": seed} | payload, "start_job.model_yaml")
    f.reject_unknown({"model"} | TRAINING_KEYS)
    return model_from_dict(payload["model"], "job model"), training_from_job(f)


def allow_entry_point(entry_point: str, model_modules: tuple[str, ...]) -> None:
    """A job names the code its workers import: only modules this agent's operator allowed."""
    module = entry_point.partition(":")[0]
    if not any(module == m or module.startswith(m + ".") for m in model_modules):
        allowed = ", ".join(model_modules) if model_modules else "none"
        raise ValueError(
            f"model entry_point {entry_point[:200]!r}: module {module[:200]} is not one this agent may import "
            f"(drover agent --model-modules; allowed: {allowed})"
        )


class FailedHere:
    """A job this agent could not run (an out dir that is unusable or fills up, a bad name,
    its files not what they should be): reported failed with the cause, like workers that
    exited, while the agent serves its other jobs."""

    def __init__(self, detail: str):
        self.detail, self.local, self.step, self.active_version, self.latest = detail, {}, -1, 0, {}
        self.recent_steps: deque[dict] = deque()
        self.progress: dict | None = None

    def alive(self) -> int:
        return 0

    def state(self) -> tuple[str, str]:
        return "failed", self.detail

    def new_telemetry(self) -> list[dict]:
        return []

    def new_migrations(self) -> list[dict]:
        return []

    def new_progress(self) -> list[dict]:
        return []

    def stalled(self) -> list[str]:
        return []

    def lost_devices(self) -> list[str]:
        return []

    def stop_devices(self, devices: list[str]) -> None:
        pass

    def recover(self, world: dict, ranks: dict[str, int]) -> None:
        pass

    def hand_plan(self, version: int, plan: Plan) -> None:
        pass

    def straggle(self, device: str, rate: float, from_step: int) -> bool:
        return False

    def stop(self) -> None:
        pass


def write_atomically(path: Path, data: dict) -> None:
    """Workers poll these files: they must never see half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class JobWorkers:
    def __init__(
        self,
        job_id: str,
        model: dict,
        steps: int,
        seed: int,
        world: int,
        ranks: dict[str, int],
        master: str,
        plan: Plan,
        out_dir: Path,
        node: str,
        inbox_root: Path,
        data_root: Path,
        joining: tuple | None = None,
        model_modules: tuple[str, ...] = (),
        paced: dict[str, tuple[float, float]] | None = None,
    ):
        """joining: (generation, plan version, plan held, ranks) when the job grows onto this node;
        model_modules: the Python modules (and their submodules) a custom model may be built by;
        paced: an emulated node's devices, {device: (tflops, rate from the start)}."""
        self.job_id, self.out_dir, self.node = job_id, out_dir, node
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"job id {job_id[:80]!r}: letters, digits, '_', '.' and '-' only")
        self.inbox = inside(inbox_root, job_id)
        (self.inbox / "logs").mkdir(parents=True, exist_ok=True)
        self.local = {d: r for d, r in ranks.items() if d.startswith(node + "/")}
        self.hosts_rank0 = 0 in self.local.values()
        spec, training = worker_job(model, steps, seed)
        if spec.family == "custom":
            allow_entry_point(spec.entry_point, model_modules)
        check_inputs(spec, training, data_root)  # a missing or bad input fails the job here, with its cause
        no_links_out(data_root, self.out_dir)
        if training.checkpoint is not None:
            no_links_out(data_root, inside(data_root, training.checkpoint.dir))
        (self.out_dir / "telemetry").mkdir(parents=True, exist_ok=True)
        ctx = worker_context()
        if self.hosts_rank0:  # rank 0 rewrites these; an earlier job's must not be read meanwhile
            for name in ("migrations.jsonl", "trace.jsonl", "eval.jsonl"):
                (self.out_dir / name).unlink(missing_ok=True)
        self.tokens_per_sample = spec.seq_len
        self.progress: dict | None = None
        # The newest steps' figures new_progress gave: sent again on a new stream, since the
        # control plane may have lost those it had not yet stored (it keeps each step once).
        self.recent_steps: deque[dict] = deque(maxlen=RESENT_STEPS)
        self.procs = {}
        self.dropped: set[str] = set()  # devices reported lost: the job goes on without them
        for device, rank in sorted(self.local.items(), key=lambda item: item[1]):
            telemetry_file(self.out_dir, device, "jsonl").unlink(missing_ok=True)  # an earlier job's
            telemetry_file(self.out_dir, device, "error").unlink(missing_ok=True)
            tflops, rate = (paced or {}).get(device, (0.0, 1.0))
            args = WorkerArgs(
                rank,
                world,
                master,
                spec,
                training,
                [(0, plan)],
                str(self.out_dir),
                str(data_root),
                (rate, 0) if rate > 1.0 else None,
                pace(tflops, spec),
                ranks=ranks,
                inbox=str(self.inbox),
                joining=joining,
                log_file=str(log_file(self.inbox, device)),
            )
            self.procs[device] = start_worker(ctx, args, f"{job_id}-{device}")
        self._offsets: dict[Path, int] = {}
        self.latest: dict[str, dict] = {}  # device -> its newest telemetry line

    def recover(self, world: dict, ranks: dict[str, int]) -> None:
        """A new world for the job's workers after a loss (recovery.py reads it from the inbox)."""
        hosted = 0 in {r for d, r in ranks.items() if d.startswith(self.node + "/")}
        if hosted and not self.hosts_rank0:  # rank 0's files are ours to tail from here on
            for name in ("migrations.jsonl", "eval.jsonl"):
                path = self.out_dir / name
                self._offsets[path] = path.stat().st_size if path.exists() else 0
            # The trace's last lines again (the control plane keeps each step once): the steps the
            # lost rank 0's agent had not sent yet, where the two share the file (one machine).
            self._offsets[self.out_dir / "trace.jsonl"] = line_near_end(self.out_dir / "trace.jsonl", RESENT_BYTES)
        self.hosts_rank0 = hosted
        write_atomically(self.inbox / f"world-{world['generation']}.json", world)

    def stop_devices(self, devices: list[str]) -> None:
        """Kill these devices' workers (the control plane found them silent); the job goes on
        without them, so they are neither reported lost nor a failure."""
        for device in devices:
            proc = self.procs.get(device)
            if proc is not None and proc.is_alive():
                proc.kill()
            self.dropped.add(device)

    def lost_devices(self) -> list[str]:
        """Local devices whose workers died without raising (a signal, a crash), not reported
        before: lost devices for the control plane to recover from, not the job's failure."""
        lost = [
            d
            for d, p in self.procs.items()
            if p.exitcode not in (None, 0) and d not in self.dropped and not self._cause(d)
        ]
        self.dropped.update(lost)
        return lost

    def stalled(self) -> list[str]:
        """Local devices whose workers lost a peer and wait for a new world."""
        return [d for d in self.local if (self.inbox / f"stalled-{d.replace('/', '_')}.json").exists()]

    def hand_plan(self, version: int, plan: Plan) -> None:
        write_atomically(self.inbox / f"plan-{version}.json", plan.to_dict())

    def straggle(self, device: str, rate: float, from_step: int) -> bool:
        if device not in self.local:
            return False
        write_atomically(self.inbox / f"slow-{device.replace('/', '_')}.json", {"rate": rate, "from_step": from_step})
        return True

    def new_telemetry(self) -> list[dict]:
        rows = []
        for device in self.local:
            for row in self._tail(telemetry_file(self.out_dir, device, "jsonl")):
                self.latest[device] = row
                rows.append(row)
        return rows

    def new_progress(self) -> list[dict]:
        """Rank 0's figures after each step that ended since the last call (loss, lr, tokens/s,
        and the newest validation loss), oldest first; [] when none did, and on every other node."""
        if not self.hosts_rank0:
            return []
        steps, evals = self._tail(self.out_dir / "trace.jsonl"), self._tail(self.out_dir / "eval.jsonl")
        progress, out = dict(self.progress or {}), []
        if evals:
            progress |= {"val_loss": evals[-1]["val_loss"], "val_step": evals[-1]["step"]}
        for row in steps:
            progress |= {
                "step": row["step"],
                "loss": row["loss"],
                "lr": row["lr"],
                "samples_per_s": row["samples_per_s"],
                "tokens_per_s": row["samples_per_s"] * self.tokens_per_sample,
            }
            out.append(dict(progress))
        if evals and not steps and "step" in progress:
            out.append(dict(progress))  # a new validation loss for the step already reported
        self.progress = progress
        self.recent_steps.extend(out)
        return out

    def new_migrations(self) -> list[dict]:
        return self._tail(self.out_dir / "migrations.jsonl") if self.hosts_rank0 else []

    def _tail(self, path: Path) -> list[dict]:
        """Complete lines added since the last call."""
        rows, self._offsets[path] = new_lines(path, self._offsets.get(path, 0))
        return rows

    def _in_the_job(self) -> list[str]:
        """The local devices whose workers still take part: not lost, not stopped, not left out of
        the world (exited); all of them once every worker has ended."""
        ended = not any(p.is_alive() for p in self.procs.values())
        return [d for d in self.local if d not in self.dropped and (ended or self.procs[d].is_alive())]

    @property
    def active_version(self) -> int:
        """The plan version every local worker in the job has run (the observed generation). A
        worker lost or left out is not waited for: its last line named an older version for good,
        and the control plane saw a rollout that never ended (no replanning after a lost worker)."""
        devices = self._in_the_job()
        if not devices or any(d not in self.latest for d in devices):
            return 0
        return min(self.latest[d]["plan_version"] for d in devices)

    @property
    def step(self) -> int:
        return max((row["step"] for row in self.latest.values()), default=-1)

    def alive(self) -> int:
        """Worker processes of this job still running here."""
        return sum(p.is_alive() for d, p in self.procs.items() if d not in self.dropped)

    def state(self) -> tuple[str, str]:
        """(running | completed | failed, detail)."""
        codes = {device: p.exitcode for device, p in self.procs.items() if device not in self.dropped}
        failed = {d: c for d, c in codes.items() if c not in (None, 0)}
        if failed:
            return "failed", ", ".join(f"worker {d} exited with {c}{self._cause(d)}" for d, c in sorted(failed.items()))
        if all(c == 0 for c in codes.values()):
            return "completed", ""
        return "running", ""

    def _cause(self, device: str) -> str:
        error = telemetry_file(self.out_dir, device, "error")
        try:
            return f" ({error.read_text()[:300]})" if error.exists() else ""
        except OSError:
            return ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs.values():
            proc.join(timeout=10)
