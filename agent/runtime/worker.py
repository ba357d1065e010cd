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
import logging
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.errors import SpecError
from drover.planner.plan import Plan, plan_from_dict
from drover.planner.training import lr_at

from . import layout
from .checkpoint import model_meta, save_checkpoint, save_model
from .curves import Curves
from .grad_sync import sync_gradients
from .handoff import WorkerArgs, telemetry_file
from .inputs import open_inputs
from .links import enter_namespace, network_layout
from .model import config_of
from .optim import AdamW, clip_factor, local_sq_norm
from .parts import warm_up
from .recovery import COLLECTIVE_TIMEOUT_S, World, WorldWatch, newest_world, peer_lost, rendezvous_store
from .rejoining import LeftOut, Rejoining
from .schedule import Stats, run_stage
from .switching import Switching
from .tensor_parallel import WaitClock, split_dim

log = logging.getLogger("drover.worker")


class Worker(Rejoining, Switching):
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
        # Every collective and message waited for through the watch: one waiting on a peer that
        # is gone ends once the control plane names the world without it, not at the timeout.
        self.watch = WorldWatch(Path(args.inbox) if args.inbox and torch_device.type == "cpu" else None)
        self.tp_clock = WaitClock(self.watch.wait)  # time in this worker's TP all-reduces
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
        self.die_after_switch = False  # ... or once the switch is done, before the step runs
        self.joining = args.joining is not None  # started to join a running job's bigger world
        if args.joining:
            self.generation, self.joined_version, self.plan, self.ranks = args.joining
        self.filling = False  # parts are being filled from a checkpoint
        self.checkpointed_at: int | None = None  # the steps done at the newest checkpoint saved
        self.outputs: dict[str, object] = {}
        self.curves = Curves(args.out_dir, self.training.tensorboard)  # rank 0's TensorBoard files
        warm_up(self.cfg)  # pay for meta-device modules now, not inside a switch
        # Named by device, not rank: ranks change when the world shrinks or grows.
        self.telemetry = open(telemetry_file(Path(args.out_dir), self.device_id, "jsonl"), "a")

    # -- the step loop ---------------------------------------------------------

    def run(self) -> None:
        steps = self.training.steps
        self.committed = self.inputs.start_step  # steps done: the update of each is its commit
        # A newcomer's world is the one it joins (self.ranks are the world's before it, until _rejoin).
        self.watch.enter(self.generation, self.args.ranks if self.joining else self.ranks)
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
        self.watch.wait(dist.all_reduce(loss, async_op=True))  # the vote: whoever completes it commits the step
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

    def _evaluate(self, done: int, out) -> None:
        """Validation loss after `done` steps: the first eval.samples windows of the val split,
        in global batches, forward only through the current plan; every worker calls this."""
        batches = self.training.eval.batches(self.spec.global_batch)
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
        self.watch.wait(dist.all_reduce(loss, async_op=True))
        if out:
            out.write(json.dumps({"step": done, "val_loss": loss.item(), "samples": batches * self.spec.global_batch}))
            out.write("\n")
            out.flush()
            self.curves.evaluation(done, loss.item())

    def _checkpoint(self, done: int) -> None:
        self.checkpointed_at = done
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
            self.watch.wait,
        )

    def _read_inbox(self, inbox: Path) -> None:
        for path in inbox.glob("plan-*.json"):
            match = re.fullmatch(r"plan-(\d+)\.json", path.name)
            version = int(match.group(1)) if match else 0
            if match and version not in self.received:  # agents write these atomically (rename)
                self.received[version] = plan_from_dict(json.loads(path.read_text()), str(path))
        die = inbox / f"die-{self.device_id.replace('/', '_')}.json"
        if die.exists() and not self.die_at_switch:
            wanted = json.loads(die.read_text() or "{}")
            self.die_at_switch = wanted.get("scope", "worker")
            self.die_after_switch = wanted.get("when", "during") == "after"
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
        self.watch.wait(dist.all_reduce(newest, op=dist.ReduceOp.MIN, async_op=True))
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
        sync_gradients(self.sync_pgs, self.parts, role, self.torch_device, self.watch.wait)
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
        self.watch.wait(dist.all_reduce(sq, async_op=True))
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
