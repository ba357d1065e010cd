"""Moving to a new plan: each worker ends up holding the part shards its new
role needs, with their AdamW state, and only shards that change owner move.

`layout.transfers(old, new)` lists the moves identically on every worker, so
nobody negotiates: each move is a (part, shard, source, destination) and its
index in the list is its message tag. A source packs parameters and both
moments into one buffer (parts.pack) and sends it with `isend`; every worker
posts all its sends before any blocking `recv`, so no cycle of moves can
deadlock. Received buffers are adopted as views, not copied. If the TP size
changed, the new owner receives one of each old shard and re-slices
(parts.assemble).

A part nobody holds yet, only under the first plan, comes from `origin`:
built from (seed, part) like the single-process model, read from a Hugging
Face directory, or left empty for a checkpoint to fill (checkpoint.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from drover.planner.plan import Plan

from . import layout
from .model import DecoderConfig
from .optim import AdamW
from .parts import assemble, empty_part, pack, unpack
from .tensor_parallel import shard_block, wait_unwatched

SWITCH_TAG = 1 << 20  # above every activation tag (2 * micro-batch + 1), so the two never mix


@dataclass
class Migrated:
    """A worker's parts and optimizer state under the new plan, and what it received to get them."""

    parts: dict[layout.Part, torch.nn.Module]
    state: dict[layout.Part, dict[str, dict[str, torch.Tensor]]]
    bytes_received: int = 0
    blocks_received: int = 0


def migrate(
    before: dict | None,
    new_plan: Plan,
    ranks: dict[str, int],
    rank: int,
    role: layout.Role | None,
    cfg: DecoderConfig,
    parts: dict,
    state: dict,
    origin: Callable[[layout.Part], torch.nn.Module],
    device: torch.device,
    seed: int,
    fault: Callable[[], None] | None = None,
    wait=wait_unwatched,
) -> Migrated:
    """Exchange the shards that change owner and build this worker's parts for `role`
    (None: no role in the new plan, so it holds nothing). `before` is what every worker holds
    now (layout.holdings of the old plan, or what survives of it after a loss; None under the
    first plan). `wait(work, group)` waits for each send and receive. Every worker calls this."""
    if before is None:
        received, out, old_shards = {}, Migrated({}, {}), {}
    else:
        moves = layout.transfers_between(before, layout.holdings(new_plan, ranks, cfg.layers), cfg.layers)
        received, moved_bytes, moved_blocks = _exchange(moves, rank, parts, state, cfg, device, fault, wait)
        out = Migrated({}, {}, moved_bytes, moved_blocks)
        old_shards = before
    for part in role.parts if role else []:
        t, r = len(role.group), role.tp_rank
        old = old_shards[part].get(rank) if old_shards else None
        if old == (t, r):
            module, part_state = parts[part], state[part]
        elif part in received:
            module, part_state = assemble(cfg, part, t, r, received[part], device, seed)
        else:  # the first plan: the whole part from its origin, then our slice
            module = origin(part).to(device)
            if isinstance(part, int):
                shard_block(module, t, r)
            part_state = {name: AdamW.new_state(p) for name, p in module.named_parameters()}
        out.parts[part], out.state[part] = module, part_state
    return out


def _exchange(
    moves: list, rank: int, parts: dict, state: dict, cfg: DecoderConfig, device: torch.device, fault, wait
) -> tuple[dict, int, int]:
    """Send and receive this worker's moves. Returns part -> {(t, r): (params, state)} of the
    shards it is to build its parts from (its own included where it re-slices one it keeps),
    and the bytes and blocks it received."""
    outgoing = []
    for index, move in enumerate(moves):
        if move.src == rank != move.dst:
            buf = pack(parts[move.part], state[move.part])
            outgoing.append((dist.isend(buf, move.dst, tag=SWITCH_TAG + index), buf))
    if fault:  # emulation: lost with its sends posted, some received and some not
        fault()
    received = defaultdict(dict)
    moved_bytes, moved_blocks = 0, 0
    for index, move in enumerate(moves):
        if move.dst == rank == move.src:
            module = parts[move.part]
            received[move.part][(move.t, move.r)] = (
                {n: p.data for n, p in module.named_parameters()},
                state[move.part],
            )
        elif move.dst == rank:
            template = empty_part(cfg, move.part, move.t, move.r, device)
            buf = torch.empty(sum(3 * p.numel() for p in template.parameters()), device=device)
            wait(dist.irecv(buf, move.src, tag=SWITCH_TAG + index))
            received[move.part][(move.t, move.r)] = unpack(template, buf)
            moved_bytes += buf.numel() * buf.element_size()
            moved_blocks += isinstance(move.part, int)
    for handle, _ in outgoing:
        wait(handle)
    return received, moved_bytes, moved_blocks


def summarize(
    step: int, version: int, migrated: Migrated, started: float, device: torch.device, wait=wait_unwatched
) -> dict:
    """The job-wide line of migrations.jsonl: bytes and blocks moved over all workers, and the
    slowest worker's seconds since `started`. Every worker calls this."""
    totals = torch.tensor(
        [float(migrated.bytes_received), float(migrated.blocks_received)], dtype=torch.float64, device=device
    )
    wait(dist.all_reduce(totals, async_op=True))
    seconds = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
    wait(dist.all_reduce(seconds, op=dist.ReduceOp.MAX, async_op=True))
    return {
        "step": step,
        "plan_version": version,
        "bytes_moved": int(totals[0]),
        "blocks_moved": int(totals[1]),
        "seconds": float(seconds[0]),
    }
