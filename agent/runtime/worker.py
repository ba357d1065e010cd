"""One worker process per device: the step loop that executes its part of a
plan and switches plans live.

Each step: take in plans that arrived (from the launcher's list or the
agent's inbox), agree with every worker on the plan version (all-reduce MIN
of the newest version each holds; switch once all hold it), switch if needed
(migration.py), run the stage's micro-batches (schedule.py), sum gradients
across the pipelines holding each part (grad_sync.py), clip by the global
gradient norm if asked (every worker, idle ones too, joins the all-reduce of
the squares it counts: layout.norm_parts), update with AdamW at the
schedule's learning rate (planner/training.py), and write the step's trace
and telemetry lines. A device with no role in the plan idles through the
step's collectives, ready to rejoin. After the last step: the checkpoint if
asked for, and the gathered model (checkpoint.py).

The torch device is chosen once in worker_main and handed down explicitly.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan, plan_from_dict
from drover.planner.training import Schedule, lr_at

from . import layout
from .checkpoint import save_checkpoint, save_model
from .grad_sync import sync_gradients
from .migration import migrate, summarize
from .model import FAMILIES, GPTConfig
from .optim import AdamW, clip_factor, local_sq_norm
from .parts import warm_up
from .schedule import Stats, run_stage
from .tensor_parallel import WaitClock, join_group, split_dim

COLLECTIVE_TIMEOUT_S = 300


@dataclass
class WorkerArgs:
    rank: int
    world: int
    init_method: str
    spec: ModelSpec
    seed: int
    steps: int
    plans: list[tuple[int, Plan]]  # (step it arrives, plan); versions are 1, 2, ... in this order
    out_dir: str
    slow: tuple[float, int] | None = None  # emulated straggler: (rate, from step)
    optim: AdamW = field(default_factory=AdamW)
    start_step: int = 0
    checkpoint_dir: str | None = None  # save every shard here after the last step
    resume_dir: str | None = None  # load the first plan's shards from here instead of (seed, part)
    ranks: dict[str, int] | None = None  # device id -> rank; default local/0..N-1
    # A directory an agent drops files into while the job runs: plan-V.json
    # (plan version V) and slow-NODE_INDEX.json ({"rate", "from_step"}, emulation).
    inbox: str | None = None
    schedule: Schedule = field(default_factory=Schedule)


def config_of(spec: ModelSpec) -> GPTConfig:
    if spec.family not in FAMILIES:
        raise SpecError(spec.name, "family", spec.family, f"one of {', '.join(FAMILIES)}")
    return GPTConfig(
        spec.layers, spec.hidden, spec.ffn_hidden, spec.heads, spec.seq_len, spec.vocab, spec.family, spec.kv_heads
    )


class Worker:
    def __init__(self, args: WorkerArgs, torch_device: torch.device):
        self.args, self.rank = args, args.rank
        self.spec, self.cfg = args.spec, config_of(args.spec)
        self.ranks = args.ranks or {f"local/{i}": i for i in range(args.world)}
        self.device_id = next(d for d, r in self.ranks.items() if r == self.rank)  # e.g. node-1/0
        self.torch_device = torch_device
        self.tp_clock = WaitClock()  # time in this worker's TP all-reduces
        self.slow = args.slow
        self.received: dict[int, Plan] = {}  # version -> plan
        self.version, self.plan = 0, None
        self.roles: dict[int, layout.Role] = {}
        self.groups: dict[tuple[int, ...], object] = {}  # process groups by their ranks
        self.parts: dict[layout.Part, torch.nn.Module] = {}
        self.norm_parts: set[layout.Part] = set()  # parts whose gradients this worker counts in the norm
        self.state: dict[layout.Part, dict[str, dict[str, torch.Tensor]]] = {}
        warm_up(self.cfg)  # pay for meta-device modules now, not inside a switch
        self.telemetry = open(Path(args.out_dir) / "telemetry" / f"worker-{self.rank}.jsonl", "a")

    # -- the step loop ---------------------------------------------------------

    def run(self) -> None:
        out = Path(self.args.out_dir)
        trace = open(out / "trace.jsonl", "w") if self.rank == 0 else None
        migrations = open(out / "migrations.jsonl", "w") if self.rank == 0 else None
        for step in range(self.args.start_step, self.args.steps):
            started, wall_start = time.perf_counter(), time.time()
            for version, (arrives, plan) in enumerate(self.args.plans, start=1):
                if arrives <= step:
                    self.received.setdefault(version, plan)
            if self.args.inbox:
                self._read_inbox(Path(self.args.inbox))
            agreed = self._agree_on_version()
            if agreed > self.version:
                record = self._switch(agreed, step)
                if migrations and self.version > 1:
                    migrations.write(json.dumps(record) + "\n")
                    migrations.flush()
            stats = self._train_step(step) if self.rank in self.roles else Stats()
            grad_norm = self._clip() if self.args.optim.clip_norm is not None else None
            if self.rank in self.roles:
                self._update(step)
            loss = torch.tensor([stats.loss], device=self.torch_device)
            dist.all_reduce(loss)
            elapsed = time.perf_counter() - started
            if trace:
                trace.write(
                    json.dumps(
                        {
                            "step": step,
                            "loss": loss.item(),
                            "plan_version": self.version,
                            "lr": lr_at(self.args.optim, self.args.schedule, step, self.args.steps),
                            "step_time_s": elapsed,
                            "samples_per_s": self.spec.global_batch / elapsed,
                            "wall_start": wall_start,
                            "wall_end": time.time(),
                        }
                        | ({"grad_norm": grad_norm} if grad_norm is not None else {})
                    )
                    + "\n"
                )
                trace.flush()
            self.telemetry.write(json.dumps({"device": self.device_id, **stats.to_dict(step, self.version)}) + "\n")
            self.telemetry.flush()
        self.telemetry.close()
        if self.args.checkpoint_dir:
            save_checkpoint(
                Path(self.args.checkpoint_dir),
                self.rank,
                self.plan,
                self.ranks,
                self.spec.layers,
                self.parts,
                self.state,
            )
        save_model(
            out / "model.pt", self.rank, self.args.world, self.roles.get(self.rank), self.parts, self.spec.layers
        )

    def _read_inbox(self, inbox: Path) -> None:
        for path in inbox.glob("plan-*.json"):
            match = re.fullmatch(r"plan-(\d+)\.json", path.name)
            version = int(match.group(1)) if match else 0
            if match and version not in self.received:  # agents write these atomically (rename)
                self.received[version] = plan_from_dict(json.loads(path.read_text()), str(path))
        slow = inbox / f"slow-{self.device_id.replace('/', '_')}.json"
        if slow.exists():
            wanted = json.loads(slow.read_text())
            self.slow = (float(wanted["rate"]), int(wanted["from_step"]))

    def _agree_on_version(self) -> int:
        newest = torch.tensor([max(self.received, default=0)], dtype=torch.int64, device=self.torch_device)
        dist.all_reduce(newest, op=dist.ReduceOp.MIN)
        return int(newest)

    def _train_step(self, step: int) -> Stats:
        role = self.roles[self.rank]
        stats = run_stage(
            role, self.parts, self.spec, self.args.seed, step, self.torch_device, self.tp_clock, self.slow
        )
        t0 = time.perf_counter()
        sync_gradients(self.sync_pgs, self.parts, role, self.torch_device)
        stats.sync_s = time.perf_counter() - t0
        return stats

    def _clip(self) -> float:
        """Scale every gradient so the whole model's gradient norm is at most clip_norm;
        the norm before clipping. Each element is counted once (layout.norm_parts)."""
        role = self.roles.get(self.rank)
        grads = [
            p.grad
            for part in self.norm_parts
            for name, p in self.parts[part].named_parameters()
            if role.tp_rank == 0 or split_dim(part, name) is not None
        ]
        sq = local_sq_norm(grads, self.torch_device)
        dist.all_reduce(sq)
        factor = clip_factor(sq.item(), self.args.optim.clip_norm)
        if factor < 1.0 and role is not None:
            for module in self.parts.values():
                for p in module.parameters():
                    p.grad.mul_(factor)
        return sq.item() ** 0.5

    def _update(self, step: int) -> None:
        lr = lr_at(self.args.optim, self.args.schedule, step, self.args.steps)
        for part, module in self.parts.items():
            for name, p in module.named_parameters():
                self.args.optim.update(p.data, p.grad, self.state[part][name], step + 1, lr)
                p.grad = None

    # -- plan switches -----------------------------------------------------------

    def _switch(self, version: int, step: int) -> dict:
        """Start plan `version` at this step; move only the parts that change owner."""
        started = time.perf_counter()
        new_plan = self.received[version]
        self.roles = layout.roles(new_plan, self.ranks)
        self.norm_parts = layout.norm_parts(new_plan, self.ranks, self.rank)
        role = self.roles.get(self.rank)
        migrated = migrate(
            self.plan,
            new_plan,
            self.ranks,
            self.rank,
            role,
            self.cfg,
            self.parts,
            self.state,
            self.args.seed,
            self.args.resume_dir,
            self.torch_device,
        )
        self.parts, self.state = migrated.parts, migrated.state
        self._build_groups(new_plan)
        if role and len(role.group) > 1:
            for part, module in self.parts.items():
                if isinstance(part, int):
                    join_group(module, self.tp_pg, self.tp_clock)
        self.plan, self.version = new_plan, version
        return summarize(step, version, migrated, started, self.torch_device)

    def _build_groups(self, plan: Plan) -> None:
        """Every worker creates every new group, in the same order, as torch.distributed
        requires; a group of ranks seen in an earlier plan is reused, never made twice."""
        self.tp_pg, self.sync_pgs = None, []
        for ranks in layout.tp_groups(plan, self.ranks):
            pg = self._group(ranks)
            if self.rank in ranks:
                self.tp_pg = pg
        for group in layout.sync_groups(plan, self.ranks, self.spec.layers):
            pg = self._group(group.ranks)
            if self.rank in group.ranks:
                self.sync_pgs.append((group, pg))

    def _group(self, ranks: tuple[int, ...]):
        key = tuple(sorted(ranks))
        if key not in self.groups:
            self.groups[key] = dist.new_group(list(key))
        return self.groups[key]


def torch_device_of(args: WorkerArgs) -> torch.device:
    """cuda (NCCL) where there are GPUs, the one whose index the device id names; else cpu (gloo)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    ranks = args.ranks or {}
    index = next((int(d.rsplit("/", 1)[1]) for d, r in ranks.items() if r == args.rank), args.rank)
    return torch.device("cuda", index % torch.cuda.device_count())


def worker_main(args: WorkerArgs) -> None:
    torch.set_num_threads(1)  # one core per worker; the host has few
    os.makedirs(Path(args.out_dir) / "telemetry", exist_ok=True)
    torch_device = torch_device_of(args)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    # A lost peer must fail the job in minutes, not the default half hour.
    dist.init_process_group(
        "nccl" if torch_device.type == "cuda" else "gloo",
        init_method=args.init_method,
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        Worker(args, torch_device).run()
    finally:
        dist.destroy_process_group()
