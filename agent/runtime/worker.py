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
import gc
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan, plan_from_dict
from drover.planner.training import Training, lr_at

from . import layout
from .checkpoint import complete_checkpoints, find_checkpoint, load_checkpoint, model_meta, save_checkpoint, save_model
from .checkpoint import read_meta as read_checkpoint_meta
from .curves import Curves
from .grad_sync import sync_gradients
from .inputs import open_inputs
from .links import bound_to, enter_namespace, interface_for, network_layout
from .migration import migrate, summarize
from .model import build_part, config_of
from .optim import AdamW, clip_factor, local_sq_norm
from .parts import empty_part, warm_up
from .recovery import World, newest_world, peer_lost, rendezvous_store, wait_for_world
from .schedule import Stats, run_stage
from .tensor_parallel import WaitClock, join_group, split_dim

COLLECTIVE_TIMEOUT_S = 300
_HELD = object()  # _switch's default: what the current plan holds
log = logging.getLogger("drover.worker")


def new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines a worker appended to `path` after byte `offset`, and the offset
    after them (a line still being written waits for the next call)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def telemetry_file(out: Path, device: str, suffix: str) -> Path:
    """OUT/telemetry/DEVICE.SUFFIX, the device id with '_' for '/' (node-1/0 -> node-1_0.jsonl)."""
    return out / "telemetry" / f"{device.replace('/', '_')}.{suffix}"


def _die() -> None:
    """Emulation (die-DEVICE.json in the inbox): a device lost in the middle of a switch."""
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_node() -> None:
    """Emulation (die-DEVICE.json with {"scope": "node"}): the whole node lost in the middle of
    a switch: the worker's process group, which is its agent's (drover up starts each agent in
    a group of its own)."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


class LeftOut(Exception):
    """The new world has no place for this device: it leaves the job."""


@dataclass
class WorkerArgs:
    rank: int
    world: int
    init_method: str
    spec: ModelSpec
    training: Training
    plans: list[tuple[int, Plan]]  # (step it arrives, plan); versions are 1, 2, ... in this order
    out_dir: str
    data_root: str = "."  # the job's paths (data, init, checkpoints, resume) are relative to it
    slow: tuple[float, int] | None = None  # emulated straggler: (rate, from step)
    pace: float = 0.0  # a paced device's FLOP/s (the emulated GPU's tflops x mfu); 0: not paced
    netns: str = ""  # an emulated network's namespace to run in (a local run; agents start inside theirs)
    env: dict | None = None  # set before anything else (an emulated network's gloo interface and layout)
    ranks: dict[str, int] | None = None  # device id -> rank; default local/0..N-1
    # A directory an agent drops files into while the job runs: plan-V.json
    # (plan version V) and slow-NODE_INDEX.json ({"rate", "from_step"}, emulation).
    inbox: str | None = None
    # A job growing onto this device: (the world's generation, the version of plans[0] in it, the
    # plan the job's workers hold and their ranks before it). It joins and receives its parts.
    joining: tuple[int, int, Plan, dict[str, int]] | None = None
    log_file: str = ""  # stdout and stderr go here (an agent's workers: agent/logs.py); "": inherited


class Worker:
    def __init__(self, args: WorkerArgs, torch_device: torch.device):
        self.args, self.rank = args, args.rank
        self.spec, self.cfg = args.spec, config_of(args.spec)
        self.ranks = args.ranks or {f"local/{i}": i for i in range(args.world)}
        self.device_id = next(d for d, r in self.ranks.items() if r == self.rank)  # e.g. node-1/0
        self.torch_device = torch_device
        self.training, self.optim = args.training, AdamW.of(args.training.optimizer)
        self.inputs = open_inputs(self.spec, self.training, args.data_root)
        self.bf16 = self.training.precision == "bf16"
        if self.bf16 and torch_device.type != "cuda":
            raise SpecError(self.spec.name, "precision", "bf16", "fp32 on CPU devices (bf16 runs on CUDA)")
        self.tp_clock = WaitClock()  # time in this worker's TP all-reduces
        self.network = network_layout()  # an emulated network's nodes and networks; {}: none
        self.p2p_pgs: dict = {}  # (rank, rank) -> the group neighbouring stages send on (emulated networks)
        self.slow = args.slow
        self.received: dict[int, Plan] = {}  # version -> plan
        self.version, self.plan = 0, None
        self.roles: dict[int, layout.Role] = {}
        self.groups: dict[tuple[int, ...], object] = {}  # process groups by their ranks
        self.parts: dict[layout.Part, torch.nn.Module] = {}
        self.norm_parts: set[layout.Part] = set()  # parts whose gradients this worker counts in the norm
        self.state: dict[layout.Part, dict[str, dict[str, torch.Tensor]]] = {}
        self.world, self.generation = args.world, 0  # world size; generation of the world (0: the first)
        self.committed, self.pending = 0, None  # steps done; a step whose gradients await its vote
        self.previous: tuple | None = None  # what was held before a switch in the uncommitted step
        # Emulation: SIGKILL this worker ("worker") or its node ("node") in the middle of its next switch.
        self.die_at_switch: str | bool = False
        self.joining = args.joining is not None  # started to join a running job's bigger world
        if args.joining:
            self.generation, self.joined_version, self.plan, self.ranks = args.joining
        self.filling = False  # parts are being filled from a checkpoint
        self.outputs: dict[str, object] = {}
        self.curves = Curves(args.out_dir, self.training.tensorboard)  # rank 0's TensorBoard files
        warm_up(self.cfg)  # pay for meta-device modules now, not inside a switch
        # Named by device, not rank: ranks change when the world shrinks or grows.
        self.telemetry = open(telemetry_file(Path(args.out_dir), self.device_id, "jsonl"), "a")

    # -- the step loop ---------------------------------------------------------

    def run(self) -> None:
        steps = self.training.steps
        self.committed = self.inputs.start_step  # steps done: the update of each is its commit
        if self.joining:
            plan = self.args.plans[0][1]
            self._rejoin(
                World(self.generation, self.args.init_method, self.args.ranks, self.joined_version, plan),
                time.perf_counter(),
            )
        if self.rank == 0:  # present from the start, even empty
            self._output("trace.jsonl")
            self._output("migrations.jsonl")
        while self.committed < steps:
            try:
                self._step(self.committed)
                continue
            except RuntimeError as exc:
                if not (self.args.inbox and peer_lost(exc)):
                    raise
                log.warning("worker %s: a peer is gone (%s); waiting for a new world", self.device_id, str(exc)[:120])
            # Outside the except block: its traceback would keep the broken groups, and so their
            # sockets, alive, and peers blocked on them would never learn the world is gone.
            self._recover()
        self.telemetry.close()
        self.curves.close()
        out = Path(self.args.out_dir)
        save_model(out, self.rank, self.world, self.roles.get(self.rank), self.parts, self.spec.layers, self.spec)

    def _output(self, name: str):
        """Rank 0's job-wide files, opened on first use: truncated by the first rank 0 of the job,
        appended to by a worker that became rank 0 in a later world."""
        if name not in self.outputs:
            mode = "w" if self.generation == 0 else "a"
            self.outputs[name] = open(Path(self.args.out_dir) / name, mode)
        return self.outputs[name]

    def _step(self, step: int) -> None:
        steps = self.training.steps
        started, wall_start = time.perf_counter(), time.time()
        for version, (arrives, plan) in enumerate(self.args.plans, start=1):
            if arrives <= step:
                self.received.setdefault(version, plan)
        if self.args.inbox:
            self._read_inbox(Path(self.args.inbox))
        agreed, generation = self._agree()
        if generation > self.generation:  # the job grows: everyone moves to the new world now
            self._recover(planned=True)
            return  # the step runs in the new world
        if agreed > self.version:
            record = self._switch(agreed, step)
            if self.rank == 0 and record["plan_version"] > 1:
                self._output("migrations.jsonl").write(json.dumps(record) + "\n")
                self._output("migrations.jsonl").flush()
        stats = self._train_step(step) if self.rank in self.roles else Stats()
        grad_norm = self._clip() if self.optim.clip_norm is not None else None
        self.pending = step  # this step's final gradients are held: it can be rolled forward
        loss = torch.tensor([stats.loss], device=self.torch_device)
        dist.all_reduce(loss)  # the vote: whoever completes it commits the step
        if self.rank in self.roles:
            self._update(step)
        self.pending, self.committed, self.previous = None, step + 1, None
        elapsed = time.perf_counter() - started
        if self.rank == 0:
            row = {
                "step": step,
                "loss": loss.item(),
                "plan_version": self.version,
                "lr": lr_at(self.optim, self.training.schedule, step, steps),
                "step_time_s": elapsed,
                "samples_per_s": self.spec.global_batch / elapsed,
                "wall_start": wall_start,
                "wall_end": time.time(),
            }
            row |= {"grad_norm": grad_norm} if grad_norm is not None else {}
            trace = self._output("trace.jsonl")
            trace.write(json.dumps(row) + "\n")
            trace.flush()
            self.curves.step(row)
        self.telemetry.write(json.dumps({"device": self.device_id, **stats.to_dict(step, self.version)}) + "\n")
        self.telemetry.flush()
        done = step + 1
        evaluation = self.training.eval
        if evaluation and (done % evaluation.every_steps == 0 or done == steps):
            self._evaluate(done, self._output("eval.jsonl") if self.rank == 0 else None)
        checkpoint = self.training.checkpoint
        if checkpoint and ((checkpoint.every_steps and done % checkpoint.every_steps == 0) or done == steps):
            self._checkpoint(done)

    # -- surviving lost peers (recovery.py) ------------------------------------------------

    def _recover(self, planned: bool = False) -> None:
        """Leave the world (broken, or `planned`: the job grows), join the next one the inbox
        names, and continue there."""
        lost_at = time.perf_counter()
        self._leave_world()
        stalled = Path(self.args.inbox) / f"stalled-{self.device_id.replace('/', '_')}.json"
        if not planned:
            stalled.write_text(json.dumps({"generation": self.generation}))  # the agent reports it
        while True:
            world = wait_for_world(Path(self.args.inbox), self.generation, COLLECTIVE_TIMEOUT_S)
            self.generation = world.generation
            if self.device_id not in world.ranks:
                raise LeftOut(f"{self.device_id} has no place in world {world.generation}")
            try:
                dist.init_process_group(
                    "nccl" if self.torch_device.type == "cuda" else "gloo",
                    store=rendezvous_store(
                        world.init_method, world.ranks[self.device_id], world.size, COLLECTIVE_TIMEOUT_S
                    ),
                    rank=world.ranks[self.device_id],
                    world_size=world.size,
                    timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                )
                record = self._rejoin(world, lost_at)
                stalled.unlink(missing_ok=True)
                if self.rank == 0:
                    self._output("migrations.jsonl").write(json.dumps(record) + "\n")
                    self._output("migrations.jsonl").flush()
                return
            except RuntimeError as exc:  # lost another peer while regrouping: the next world
                if not peer_lost(exc):
                    raise
            self._leave_world()

    def _leave_world(self) -> None:
        """Close every group, so that peers still waiting on this worker fail fast too."""
        self.groups, self.tp_pg, self.sync_pgs, self.p2p_pgs = {}, None, [], {}
        for module in self.parts.values():  # TP hooks hold their group
            if hasattr(module, "enter"):
                module.enter, module.exit = torch.nn.Identity(), torch.nn.Identity()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group may fail to close; it is gone either way
            pass
        gc.collect()  # the groups' sockets close when the last reference goes

    def _rejoin(self, world: World, lost_at: float) -> dict:
        """Agree on the step, take the new plan's parts, and return the recovery's record."""
        old_plan, old_ranks = self.plan, self.ranks
        self.rank, self.ranks, self.world = world.ranks[self.device_id], world.ranks, world.size
        # The step commit protocol: agree on the newest committed step, roll forward if behind.
        newest = torch.tensor([self.committed], dtype=torch.int64, device=self.torch_device)
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        newest = int(newest)
        if self.joining:  # a newcomer holds nothing yet: it starts where the others are
            self.committed, self.joining = newest, False
        elif newest == self.committed + 1 and self.pending == self.committed:
            self._update(self.committed)
            self.committed = newest
        elif newest != self.committed:
            raise RuntimeError(f"{self.device_id} is at step {self.committed}, the world at {newest}: cannot recover")
        elif self.previous is not None:
            # Nobody committed this step, so a switch begun in it may have finished on some workers
            # and not on others: all go back to what they held before it, unchanged since.
            self.plan, self.version, self.parts, self.state, self.roles, self.norm_parts = self.previous
        self.pending, self.previous = None, None
        for module in self.parts.values():
            for p in module.parameters():
                p.grad = None
        before = layout.surviving_holdings(old_plan, old_ranks, world.ranks, self.spec.layers)
        lost = layout.lost_parts(before)
        self.received[world.plan_version] = world.plan
        if not lost:
            record = self._switch(world.plan_version, self.committed, before=before, started=lost_at)
            if set(old_ranks) <= set(world.ranks):  # nobody lost: the job grew
                return record | {"joined": sorted(set(world.ranks) - set(old_ranks))}
            return record | {"recovered_from": "replicas", "steps_redone": 0}
        if not self.inputs.checkpoints or not complete_checkpoints(self.inputs.checkpoints):
            raise RuntimeError(f"parts {lost[:5]} were lost with every copy, and the job has no checkpoint")
        checkpoint = find_checkpoint(self.inputs.checkpoints)
        self.parts, self.state = {}, {}  # every worker rolls back to the same step
        record = self._switch(world.plan_version, self.committed, before=None, fill_from=checkpoint, started=lost_at)
        redone = self.committed - read_checkpoint_meta(checkpoint)["step"]
        self.committed -= redone
        self.curves.close()  # reopened at the step now redone, which purges what was logged from it on
        return record | {"step": self.committed, "recovered_from": "checkpoint", "steps_redone": redone}

    def _evaluate(self, done: int, out) -> None:
        """Validation loss after `done` steps: the first eval.samples windows of the val split,
        in global batches, forward only through the current plan; every worker calls this."""
        batches = -(-self.training.eval.samples // self.spec.global_batch)
        total = 0.0
        for i in range(batches):
            if self.rank in self.roles:
                stats = run_stage(
                    self.roles[self.rank],
                    self.parts,
                    self.spec,
                    self.inputs.val,
                    i,
                    self.torch_device,
                    self.tp_clock,
                    None,
                    self.bf16,
                    forward_only=True,
                    pace=self.args.pace,
                    p2p_groups=self.p2p_pgs,
                    tp_group=self.tp_pg,
                )
                total += stats.loss
        loss = torch.tensor([total / batches], device=self.torch_device)
        dist.all_reduce(loss)
        if out:
            out.write(json.dumps({"step": done, "val_loss": loss.item(), "samples": batches * self.spec.global_batch}))
            out.write("\n")
            out.flush()
            self.curves.evaluation(done, loss.item())

    def _checkpoint(self, done: int) -> None:
        meta = {"model": model_meta(self.spec), "training": self.training.to_dict(), "plan": self.plan.to_dict()}
        save_checkpoint(
            self.inputs.checkpoints,
            done,
            self.training.checkpoint.keep,
            self.rank,
            self.plan,
            self.ranks,
            self.parts,
            self.state,
            self.tp_pg,
            meta,
            self.torch_device,
        )

    def _read_inbox(self, inbox: Path) -> None:
        for path in inbox.glob("plan-*.json"):
            match = re.fullmatch(r"plan-(\d+)\.json", path.name)
            version = int(match.group(1)) if match else 0
            if match and version not in self.received:  # agents write these atomically (rename)
                self.received[version] = plan_from_dict(json.loads(path.read_text()), str(path))
        die = inbox / f"die-{self.device_id.replace('/', '_')}.json"
        if die.exists() and not self.die_at_switch:
            self.die_at_switch = json.loads(die.read_text() or "{}").get("scope", "worker")
        slow = inbox / f"slow-{self.device_id.replace('/', '_')}.json"
        if slow.exists():
            wanted = json.loads(slow.read_text())
            self.slow = (float(wanted["rate"]), int(wanted["from_step"]))

    def _agree(self) -> tuple[int, int]:
        """The newest plan version and world generation every worker holds (MIN of each):
        a switch, or a move to a bigger world, happens once all hold it."""
        world = newest_world(Path(self.args.inbox), self.generation) if self.args.inbox else None
        held = [max(self.received, default=0), world.generation if world else self.generation]
        newest = torch.tensor(held, dtype=torch.int64, device=self.torch_device)
        dist.all_reduce(newest, op=dist.ReduceOp.MIN)
        return int(newest[0]), int(newest[1])

    def _train_step(self, step: int) -> Stats:
        role = self.roles[self.rank]
        stats = run_stage(
            role,
            self.parts,
            self.spec,
            self.inputs.train,
            step,
            self.torch_device,
            self.tp_clock,
            self.slow,
            self.bf16,
            pace=self.args.pace,
            p2p_groups=self.p2p_pgs,
            tp_group=self.tp_pg,
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
            if role.tp_rank == 0 or split_dim(self.parts[part], name) is not None
        ]
        sq = local_sq_norm(grads, self.torch_device)
        dist.all_reduce(sq)
        factor = clip_factor(sq.item(), self.optim.clip_norm)
        if factor < 1.0 and role is not None:
            for module in self.parts.values():
                for p in module.parameters():
                    p.grad.mul_(factor)
        return sq.item() ** 0.5

    def _update(self, step: int) -> None:
        lr = lr_at(self.optim, self.training.schedule, step, self.training.steps)
        for part, module in self.parts.items():
            for name, p in module.named_parameters():
                self.optim.update(p.data, p.grad, self.state[part][name], step + 1, lr)
                p.grad = None

    # -- plan switches -----------------------------------------------------------

    def _switch(
        self, version: int, step: int, before=_HELD, fill_from: Path | None = None, started: float | None = None
    ) -> dict:
        """Start plan `version` at this step; move only the parts that change owner. `before`:
        what every worker holds now (default: the current plan's holdings); `fill_from`: a
        checkpoint that fills every part instead (the job's resume, or a rollback); `started`:
        when the switch began, for its record (a recovery: when the loss was noticed)."""
        started = time.perf_counter() if started is None else started
        if self.previous is None:
            self.previous = (self.plan, self.version, self.parts, self.state, self.roles, self.norm_parts)
        new_plan = self.received[version]
        self.roles = layout.roles(new_plan, self.ranks)
        self.norm_parts = layout.norm_parts(new_plan, self.ranks, self.rank)
        role = self.roles.get(self.rank)
        if before is _HELD:
            before = layout.holdings(self.plan, self.ranks, self.spec.layers) if self.plan else None
        if self.plan is None and self.inputs.resume:
            fill_from = self.inputs.resume
        self.filling = fill_from is not None
        migrated = migrate(
            before,
            new_plan,
            self.ranks,
            self.rank,
            role,
            self.cfg,
            self.parts,
            self.state,
            self._origin,
            self.torch_device,
            fault=(_die_with_node if self.die_at_switch == "node" else _die) if self.die_at_switch else None,
        )
        self.parts, self.state = migrated.parts, migrated.state
        # Everyone alive and here before groups are made: new_group waits on the rendezvous store,
        # where a lost peer is only noticed at the timeout, while a collective notices at once.
        dist.barrier()
        self._build_groups(new_plan)
        if fill_from is not None:
            args = (self.rank, new_plan, self.ranks, self.parts, self.state, self.tp_pg, self.torch_device)
            load_checkpoint(fill_from, *args)
        if role and len(role.group) > 1:
            for part, module in self.parts.items():
                if isinstance(part, int):
                    join_group(module, self.tp_pg, self.tp_clock)
        self.plan, self.version = new_plan, version
        return summarize(step, version, migrated, started, self.torch_device)

    def _origin(self, part: layout.Part) -> torch.nn.Module:
        """A part under the first plan: empty for a checkpoint to fill, from the Hugging Face
        weights, or built from (seed, part)."""
        if self.filling:
            return empty_part(self.cfg, part, 1, 0, torch.device("cpu"))
        if self.inputs.init:
            return self.inputs.init.module(self.cfg, part)
        return build_part(self.cfg, part, self.training.seed)

    def _build_groups(self, plan: Plan) -> None:
        """Every worker creates every new group, in the same order, as torch.distributed
        requires; a group of ranks seen in an earlier plan is reused, never made twice."""
        self.tp_pg, self.sync_pgs, self.p2p_pgs = None, [], {}
        if self.network:  # neighbouring stages talk on the network they share, not the default group's
            for pair in layout.p2p_pairs(plan, self.ranks):
                pg = self._group(pair)
                if self.rank in pair:
                    self.p2p_pgs[pair] = pg
        for ranks in layout.tp_groups(plan, self.ranks):
            pg = self._group(ranks)
            if self.rank in ranks:
                self.tp_pg = pg
        for group in layout.sync_groups(plan, self.ranks, self.spec.layers):
            pg = self._group(group.ranks)
            if self.rank in group.ranks:
                self.sync_pgs.append((group, pg))

    def _group(self, ranks: tuple[int, ...]):
        """The process group of these ranks, on the network their nodes share (links.py)."""
        key = tuple(sorted(ranks))
        if key not in self.groups:
            nodes = {device.split("/")[0] for device, rank in self.ranks.items() if rank in key}
            with bound_to(interface_for(nodes, self.network)):
                self.groups[key] = dist.new_group(list(key))
        return self.groups[key]


def torch_device_of(args: WorkerArgs) -> torch.device:
    """cuda (NCCL) where there are GPUs, the one whose index the device id names; else cpu (gloo)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    ranks = args.ranks or {}
    index = next((int(d.rsplit("/", 1)[1]) for d, r in ranks.items() if r == args.rank), args.rank)
    return torch.device("cuda", index % torch.cuda.device_count())


def capture_output(path: str) -> None:
    """This process's stdout and stderr, file descriptors included (C++ warnings, a traceback on
    the way out), appended to `path`, a line at a time."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def worker_main(args: WorkerArgs) -> None:
    if args.log_file:
        capture_output(args.log_file)
    if args.netns:
        enter_namespace(args.netns)
    os.environ.update(args.env or {})
    torch.set_num_threads(1)  # one core per worker; the host has few
    os.makedirs(Path(args.out_dir) / "telemetry", exist_ok=True)
    torch_device = torch_device_of(args)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    # A lost peer must fail the job in minutes, not the default half hour.
    dist.init_process_group(
        "nccl" if torch_device.type == "cuda" else "gloo",
        store=rendezvous_store(args.init_method, args.rank, args.world, COLLECTIVE_TIMEOUT_S),
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        Worker(args, torch_device).run()
    except LeftOut as exc:  # not an error: the job goes on without this device
        log.info("%s", exc)
    except Exception as exc:
        # The cause, for the agent to report with the exit code (the traceback stays in its log).
        device = next((d for d, r in (args.ranks or {}).items() if r == args.rank), f"local/{args.rank}")
        error = telemetry_file(Path(args.out_dir), device, "error")
        error.write_text(f"{type(exc).__name__}: {str(exc)[:400]}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
