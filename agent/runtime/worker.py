"""One worker process per device: executes its part of a plan and switches
plans live.

Each step: agree with every worker on the plan version (all-reduce MIN of the
newest version each holds; switch once all hold it), run the stage's
micro-batches one-forward-one-backward with point-to-point sends between
stages, sum gradients across the pipelines holding each part, update with
AdamW. A device with no role in the plan idles through the step's collectives,
ready to rejoin.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan, plan_from_dict

from . import data, layout
from .model import GPTConfig, build_part, loss_sum, part_prefix
from .optim import STATE_KEYS, AdamW
from .parts import empty_part, pack, unpack, warm_up
from .tensor_parallel import WaitClock, join_group, shard, shard_block, split_dim, unshard

COLLECTIVE_TIMEOUT_S = 300
DEVICE = torch.device("cpu")  # set once per worker process in worker_main: cuda (NCCL) or cpu (gloo)
SWITCH_TAG = 1 << 20  # point-to-point tags of a migration; activations use 2 * micro-batch (+1)


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


def config_of(spec: ModelSpec) -> GPTConfig:
    if spec.family != "gpt":
        raise SpecError(spec.name, "family", spec.family, "gpt (the training runtime builds gpt blocks only)")
    return GPTConfig(spec.layers, spec.hidden, spec.ffn_hidden, spec.heads, spec.seq_len, spec.vocab)


class Worker:
    def __init__(self, args: WorkerArgs):
        self.args, self.rank = args, args.rank
        self.spec, self.cfg = args.spec, config_of(args.spec)
        self.ranks = args.ranks or {f"local/{i}": i for i in range(args.world)}
        self.device = next(d for d, r in self.ranks.items() if r == self.rank)
        self.slow = args.slow
        self.received: dict[int, Plan] = {}  # version -> plan
        self.version, self.plan = 0, None
        self.roles: dict[int, layout.Role] = {}
        self.groups: dict[tuple[int, ...], object] = {}  # process groups by their ranks
        self.parts: dict[layout.Part, torch.nn.Module] = {}
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
            loss = torch.tensor([stats.loss], device=DEVICE)
            dist.all_reduce(loss)
            elapsed = time.perf_counter() - started
            if trace:
                trace.write(json.dumps({"step": step, "loss": loss.item(), "plan": self.version,
                                        "step_time_s": elapsed, "samples_per_s": self.spec.global_batch / elapsed,
                                        "wall_start": wall_start, "wall_end": time.time()}) + "\n")
                trace.flush()
            self.telemetry.write(json.dumps({"device": self.device, **stats.to_dict(step, self.version)}) + "\n")
            self.telemetry.flush()
        self.telemetry.close()
        if self.args.checkpoint_dir:
            self._save_checkpoint(Path(self.args.checkpoint_dir))
        self._save_model(out / "model.pt")

    def _read_inbox(self, inbox: Path) -> None:
        for path in inbox.glob("plan-*.json"):
            match = re.fullmatch(r"plan-(\d+)\.json", path.name)
            version = int(match.group(1)) if match else 0
            if match and version not in self.received:  # agents write these atomically (rename)
                self.received[version] = plan_from_dict(json.loads(path.read_text()), str(path))
        slow = inbox / f"slow-{self.device.replace('/', '_')}.json"
        if slow.exists():
            wanted = json.loads(slow.read_text())
            self.slow = (float(wanted["rate"]), int(wanted["from_step"]))

    def _agree_on_version(self) -> int:
        newest = torch.tensor([max(self.received, default=0)], dtype=torch.int64, device=DEVICE)
        dist.all_reduce(newest, op=dist.ReduceOp.MIN)
        return int(newest)

    def _train_step(self, step: int) -> "Stats":
        role, spec, stats = self.roles[self.rank], self.spec, Stats()
        b = spec.micro_batch
        first_mb, end_mb = role.micro_batches
        m = end_mb - first_mb
        warmup = min(role.num_stages - role.stage - 1, m)
        blocks = [self.parts[i] for i in range(*role.blocks)]
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        sends = []

        def compute(fn):
            t0, waited = time.perf_counter(), WaitClock.seconds
            result = fn()
            spent = time.perf_counter() - t0 - (WaitClock.seconds - waited)  # own work, not a TP partner's
            if self.slow and step >= self.slow[1]:
                time.sleep((self.slow[0] - 1) * spent)  # emulation only: RATE times slower
            stats.compute_s += time.perf_counter() - t0 - (WaitClock.seconds - waited)
            stats.tp_wait_s += WaitClock.seconds - waited
            return result

        def recv(shape, src, tag):
            buf = torch.empty(shape, device=DEVICE)
            t0 = time.perf_counter()
            dist.recv(buf, src, tag=tag)
            stats.p2p_wait_s += time.perf_counter() - t0
            stats.bytes_recv[src] += buf.numel() * buf.element_size()
            return buf

        t = len(role.group)

        def send(tensor, group, tag):
            # Every member of a TP group holds the same activation, so the sends are shared:
            # member r serves the receivers j with j mod t == r.
            tensor = tensor.contiguous()
            for j, dst in enumerate(group):
                if j % t == role.tp_rank:
                    sends.append((dist.isend(tensor, dst, tag=tag), tensor))
                    stats.bytes_sent[dst] += tensor.numel() * tensor.element_size()

        def sender(group):  # who of a neighbouring TP group sends to this member
            return group[role.tp_rank % len(group)]

        shape = (b, spec.seq_len, spec.hidden)

        def forward(i: int) -> None:
            mb = first_mb + i
            inputs, targets = (x.to(DEVICE) for x in data.batch(self.args.seed, step, mb * b, b, spec.seq_len,
                                                                 spec.vocab))
            x_in = None if role.first else recv(shape, sender(role.prev_group), 2 * mb).requires_grad_()

            def run():
                x = self.parts[layout.EMBED](inputs) if role.first else x_in
                for block in blocks:
                    x = block(x)
                if role.last:
                    return loss_sum(self.parts[layout.HEAD](x), targets) / spec.global_batch
                return x
            out = compute(run)
            saved[i] = (x_in, out)
            if role.last:
                stats.loss += out.item() if role.tp_rank == 0 else 0.0
            else:
                send(out.detach(), role.next_group, 2 * mb)

        def backward(i: int) -> None:
            mb = first_mb + i
            x_in, out = saved.pop(i)
            grad = None if role.last else recv(shape, sender(role.next_group), 2 * mb + 1)
            compute(lambda: torch.autograd.backward(out, grad))
            if not role.first:
                send(x_in.grad, role.prev_group, 2 * mb + 1)

        for i in range(warmup):
            forward(i)
        for i in range(m - warmup):
            forward(warmup + i)
            backward(i)
        for i in range(m - warmup, m):
            backward(i)
        for handle, _ in sends:
            handle.wait()
        t0 = time.perf_counter()
        self._sync_gradients()
        stats.sync_s = time.perf_counter() - t0
        self._update(step + 1)
        # Work in block units: the embedding and head count by their FLOP against a block's, so a
        # stage holding the head with one block does not look slow for it.
        stats.blocks = (role.blocks[1] - role.blocks[0]) + role.last * spec.head_flops / spec.block_flops
        stats.micro_batches = m
        return stats

    # -- gradients and the optimizer -----------------------------------------

    def _sync_gradients(self) -> None:
        """Sum each part's gradient over the pipelines that hold it."""
        role = self.roles[self.rank]
        for group, pg in self.sync_pgs:
            params = [(part, name, p) for part in group.parts for name, p in self.parts[part].named_parameters()]
            if group.mode == "shard":
                flat = torch.cat([p.grad.flatten() for _, _, p in params])
                dist.all_reduce(flat, group=pg)
                offset = 0
                for _, _, p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
                continue
            # Holders differ in TP size: sum full-size gradients, own shard in place.
            t, r = len(role.group), role.tp_rank
            fulls = []
            for part, name, p in params:
                dim = split_dim(part, name)
                full = torch.zeros(_full_shape(p.shape, dim, t), device=DEVICE)
                if dim is not None:
                    full.narrow(dim, r * p.shape[dim], p.shape[dim]).copy_(p.grad)
                elif r == 0:  # replicated in the TP group: count it once
                    full.copy_(p.grad)
                fulls.append(full)
            flat = torch.cat([f.flatten() for f in fulls])
            dist.all_reduce(flat, group=pg)
            offset = 0
            for (part, name, p), full in zip(params, fulls):
                summed = flat[offset:offset + full.numel()].view_as(full)
                p.grad.copy_(shard(summed, part, name, t, r))
                offset += full.numel()

    def _update(self, step: int) -> None:
        for part, module in self.parts.items():
            for name, p in module.named_parameters():
                self.args.optim.update(p.data, p.grad, self.state[part][name], step)
                p.grad = None

    # -- plan switches -----------------------------------------------------------

    def _switch(self, version: int, step: int) -> dict:
        """Start plan `version` at this step; move only the parts that change owner."""
        started = time.perf_counter()
        new_plan = self.received[version]
        L = self.spec.layers
        moved_bytes, moved_blocks = 0, 0
        if self.plan is None:
            kept, received = {}, {}
        else:
            moves = layout.transfers(self.plan, new_plan, self.ranks, L)
            outgoing = []
            for index, move in enumerate(moves):
                if move.src == self.rank != move.dst:
                    buf = pack(self.parts[move.part], self.state[move.part])
                    outgoing.append((dist.isend(buf, move.dst, tag=SWITCH_TAG + index), buf))
            received = defaultdict(dict)
            for index, move in enumerate(moves):
                if move.dst == self.rank == move.src:
                    module = self.parts[move.part]
                    received[move.part][(move.t, move.r)] = (
                        {n: p.data for n, p in module.named_parameters()}, self.state[move.part])
                elif move.dst == self.rank:
                    template = empty_part(self.cfg, move.part, move.t, move.r, DEVICE)
                    buf = torch.empty(sum(3 * p.numel() for p in template.parameters()), device=DEVICE)
                    dist.recv(buf, move.src, tag=SWITCH_TAG + index)
                    received[move.part][(move.t, move.r)] = unpack(template, buf)
                    moved_bytes += buf.numel() * buf.element_size()
                    moved_blocks += isinstance(move.part, int)
            for handle, _ in outgoing:
                handle.wait()
            kept = {part: (self.parts[part], self.state[part]) for part in self.parts}
        self._build_groups(new_plan)
        self.parts, self.state = {}, {}
        role = self.roles.get(self.rank)
        held_before = layout.holdings(self.plan, self.ranks, L) if self.plan else {}
        for part in role.parts if role else []:
            t, r = len(role.group), role.tp_rank
            old = held_before[part].get(self.rank) if held_before else None
            if old == (t, r):
                module, state = kept[part]
            elif part in received:
                module, state = _assemble(self.cfg, part, t, r, received[part])
            elif self.args.resume_dir:
                module, state = _load_part(self.cfg, Path(self.args.resume_dir), part, t, r)
            else:  # the first plan: build from (seed, part)
                module = build_part(self.cfg, part, self.args.seed).to(DEVICE)
                if isinstance(part, int):
                    shard_block(module, t, r)
                state = {name: AdamW.new_state(p) for name, p in module.named_parameters()}
            if isinstance(part, int) and t > 1:
                join_group(module, self.tp_pg)
            self.parts[part], self.state[part] = module, state
        self.plan, self.version = new_plan, version
        totals = torch.tensor([float(moved_bytes), float(moved_blocks)], dtype=torch.float64, device=DEVICE)
        dist.all_reduce(totals)
        seconds = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=DEVICE)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return {"step": step, "plan": version, "bytes_moved": int(totals[0]), "blocks_moved": int(totals[1]),
                "seconds": float(seconds[0])}

    def _build_groups(self, plan: Plan) -> None:
        """Every worker creates every new group, in the same order, as torch.distributed
        requires; a group of ranks seen in an earlier plan is reused, never made twice."""
        self.roles = layout.roles(plan, self.ranks)
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

    # -- checkpoints (the baseline that live switching replaces) ------------------

    def _save_checkpoint(self, directory: Path) -> None:
        """One file per part shard, written by the lowest rank holding it."""
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            for old in directory.glob("*.pt"):  # a reused directory must not mix runs
                old.unlink()
        dist.barrier()
        held = layout.holdings(self.plan, self.ranks, self.spec.layers)
        for part, module in self.parts.items():
            shard_key = held[part][self.rank]
            if min(rank for rank, key in held[part].items() if key == shard_key) == self.rank:
                params = {n: p.data.cpu() for n, p in module.named_parameters()}
                state = {n: {k: v.cpu() for k, v in moments.items()} for n, moments in self.state[part].items()}
                torch.save({"params": params, "state": state},
                           directory / _checkpoint_name(part, *shard_key))
        dist.barrier()

    # -- the final model ---------------------------------------------------------

    def _save_model(self, path: Path) -> None:
        role = self.roles.get(self.rank)
        mine = {part: ((len(role.group), role.tp_rank), {n: p.data.cpu() for n, p in module.named_parameters()})
                for part, module in self.parts.items()} if role else {}
        gathered = [None] * self.args.world if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank != 0:
            return
        shards: dict = defaultdict(dict)  # part -> (t, r) -> params
        for held in gathered:
            for part, (key, params) in held.items():
                shards[part].setdefault(key, params)
        state = {}
        for part in layout.part_order(self.spec.layers):
            t = min(t for t, _ in shards[part])
            pieces = [shards[part][(t, r)] for r in range(t)]
            for name in pieces[0]:
                state[part_prefix(part) + name] = unshard([piece[name] for piece in pieces], part, name).clone()
        torch.save(state, path)


def _full_shape(shape: torch.Size, dim: int | None, t: int) -> list[int]:
    full = list(shape)
    if dim is not None:
        full[dim] *= t
    return full


def _assemble(cfg: GPTConfig, part, t: int, r: int, pieces: dict) -> tuple[torch.nn.Module, dict]:
    """A part's module and optimizer state for shard (t, r) from received shards."""
    module = empty_part(cfg, part, t, r, DEVICE)
    if (t, r) in pieces:
        params, state = pieces[(t, r)]
    else:  # TP size changed: rebuild the full tensors, keep our slice
        t_old = next(iter(pieces))[0]
        ordered = [pieces[(t_old, i)] for i in range(t_old)]
        def reslice(pieces, name):  # a copy: replicated tensors would otherwise pin a whole received buffer
            return shard(unshard(pieces, part, name), part, name, t, r).clone()
        params = {n: reslice([o[0][n] for o in ordered], n) for n in ordered[0][0]}
        state = {n: {k: reslice([o[1][n][k] for o in ordered], n) for k in STATE_KEYS} for n in ordered[0][0]}
    for name, p in module.named_parameters():
        p.data = params[name]  # adopt the received tensors rather than copy them
    return module, state


def _checkpoint_name(part, t: int, r: int) -> str:
    return f"{part}-{t}-{r}.pt"


def _load_part(cfg: GPTConfig, directory: Path, part, t: int, r: int) -> tuple[torch.nn.Module, dict]:
    """Shard (t, r) of a part from a checkpoint, re-slicing if it was saved at another TP size."""
    def load(size: int, i: int) -> tuple[dict, dict]:
        saved = torch.load(directory / _checkpoint_name(part, size, i), map_location=DEVICE)
        return saved["params"], saved["state"]
    if (directory / _checkpoint_name(part, t, r)).exists():
        return _assemble(cfg, part, t, r, {(t, r): load(t, r)})
    sizes = [int(f.name.split("-")[-2]) for f in directory.glob(f"{part}-*-*.pt")]
    if not sizes:
        raise FileNotFoundError(f"checkpoint {directory} holds no shard of part {part!r}")
    saved_t = min(sizes)
    return _assemble(cfg, part, t, r, {(saved_t, i): load(saved_t, i) for i in range(saved_t)})


@dataclass
class Stats:
    """Telemetry of one step on one worker."""
    loss: float = 0.0
    compute_s: float = 0.0
    p2p_wait_s: float = 0.0
    tp_wait_s: float = 0.0
    sync_s: float = 0.0
    blocks: float = 0.0  # blocks' worth of work, the head included
    micro_batches: int = 0
    bytes_sent: dict = field(default_factory=lambda: defaultdict(int))
    bytes_recv: dict = field(default_factory=lambda: defaultdict(int))

    def to_dict(self, step: int, version: int) -> dict:
        per_piece = self.compute_s / (self.blocks * self.micro_batches) if self.blocks and self.micro_batches else None
        return {"step": step, "plan": version, "compute_s": self.compute_s,
                "compute_s_per_block_per_micro_batch": per_piece, "p2p_wait_s": self.p2p_wait_s,
                "tp_wait_s": self.tp_wait_s,
                "grad_sync_s": self.sync_s, "bytes_sent": dict(self.bytes_sent), "bytes_recv": dict(self.bytes_recv)}


def worker_main(args: WorkerArgs) -> None:
    torch.set_num_threads(1)  # one core per worker; the host has few
    os.makedirs(Path(args.out_dir) / "telemetry", exist_ok=True)
    global DEVICE
    if torch.cuda.is_available():  # NCCL on GPUs: the device is the one whose index the device id names
        ranks = args.ranks or {}
        index = next((int(d.rsplit("/", 1)[1]) for d, r in ranks.items() if r == args.rank), args.rank)
        DEVICE = torch.device("cuda", index % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    # A lost peer must fail the job in minutes, not the default half hour.
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo", init_method=args.init_method,
                            rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        Worker(args).run()
    finally:
        dist.destroy_process_group()
