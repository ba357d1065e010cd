"""What a plan asks of each worker: pure functions, computed identically by
every worker so that collective calls and transfers line up without talking.

A *part* is a block index, or EMBED / HEAD. A device holds shard (t, r) of a
part: its stage has t devices and it is the r-th.
"""

from __future__ import annotations

from dataclasses import dataclass

from drover.planner.plan import Plan

from .model import EMBED, HEAD

Part = int | str


@dataclass(frozen=True)
class Role:
    """One device's place in a plan."""

    pipeline: int
    stage: int
    num_stages: int
    group: tuple[int, ...]  # ranks of its tensor-parallel group
    tp_rank: int
    blocks: tuple[int, int]
    prev_group: tuple[int, ...]  # ranks of the stage before (empty on a first stage)
    next_group: tuple[int, ...]
    micro_batches: tuple[int, int]  # global micro-batch indices [start, end)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def parts(self) -> list[Part]:
        return ([EMBED] if self.first else []) + list(range(*self.blocks)) + ([HEAD] if self.last else [])


def roles(plan: Plan, ranks: dict[str, int]) -> dict[int, Role]:
    out = {}
    start = 0
    for p, pipeline in enumerate(plan.pipelines):
        groups = [tuple(ranks[d] for d in s.devices) for s in pipeline.stages]
        for k, stage in enumerate(pipeline.stages):
            for r, rank in enumerate(groups[k]):
                out[rank] = Role(
                    p,
                    k,
                    len(groups),
                    groups[k],
                    r,
                    stage.layers,
                    groups[k - 1] if k > 0 else (),
                    groups[k + 1] if k + 1 < len(groups) else (),
                    (start, start + pipeline.micro_batches),
                )
        start += pipeline.micro_batches
    return out


def part_order(layers: int) -> list[Part]:
    return [EMBED, *range(layers), HEAD]


def holdings(plan: Plan, ranks: dict[str, int], layers: int) -> dict[Part, dict[int, tuple[int, int]]]:
    """part -> {rank: (t, r)} for every device holding it."""
    held: dict[Part, dict[int, tuple[int, int]]] = {part: {} for part in part_order(layers)}
    for rank, role in roles(plan, ranks).items():
        for part in role.parts:
            held[part][rank] = (len(role.group), role.tp_rank)
    return held


@dataclass(frozen=True)
class SyncGroup:
    """Devices that sum the gradients of some parts.

    shard: every holder has the same TP size; ranks are the r-th devices of
      each holding stage and sum their shards directly.
    full: holders differ in TP size; every device of every holding stage
      sums full-size gradients (its shard in place, zeros elsewhere).
    """

    parts: tuple[Part, ...]
    ranks: tuple[int, ...]
    mode: str


def sync_groups(plan: Plan, ranks: dict[str, int], layers: int) -> list[SyncGroup]:
    """Groups for summing gradients across pipelines, per range of blocks
    with the same holders (pipelines may split the blocks differently)."""
    stage_of: list[dict[Part, tuple[int, ...]]] = [{} for _ in plan.pipelines]
    for role in roles(plan, ranks).values():
        for part in role.parts:
            stage_of[role.pipeline][part] = role.group
    if len(stage_of) == 1:
        return []
    # Consecutive parts with the same holding stages share one all-reduce.
    runs: list[tuple[list[Part], tuple]] = []
    for part in part_order(layers):
        holders = tuple(s[part] for s in stage_of)
        if runs and runs[-1][1] == holders and isinstance(part, int) and isinstance(runs[-1][0][-1], int):
            runs[-1][0].append(part)
        else:
            runs.append(([part], holders))
    out = []
    for parts, holders in runs:
        sizes = {len(g) for g in holders}
        if len(sizes) == 1:
            for r in range(sizes.pop()):
                out.append(SyncGroup(tuple(parts), tuple(g[r] for g in holders), "shard"))
        else:
            out.append(SyncGroup(tuple(parts), tuple(x for g in holders for x in g), "full"))
    return out


def p2p_pairs(plan: Plan, ranks: dict[str, int]) -> list[tuple[int, int]]:
    """The pairs of ranks that exchange activations and their gradients between neighbouring
    stages (schedule.py: member j of a stage receives from member j mod t of the one before,
    and the reverse for gradients), sorted, each once."""
    pairs = set()
    for p in plan.pipelines:
        for before, after in zip(p.stages, p.stages[1:]):
            prev, nxt = [ranks[d] for d in before.devices], [ranks[d] for d in after.devices]
            pairs |= {tuple(sorted((prev[j % len(prev)], dst))) for j, dst in enumerate(nxt)}
            pairs |= {tuple(sorted((nxt[r % len(nxt)], dst))) for r, dst in enumerate(prev)}
    return sorted(pairs)


def tp_groups(plan: Plan, ranks: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(ranks[d] for d in s.devices) for p in plan.pipelines for s in p.stages if len(s.devices) > 1]


@dataclass(frozen=True)
class Transfer:
    """Send shard (t, r) of a part from src to dst at a plan switch (src may be
    dst: a device re-slicing what it already holds)."""

    part: Part
    src: int
    dst: int
    t: int
    r: int


def transfers(old: Plan, new: Plan, ranks: dict[str, int], layers: int) -> list[Transfer]:
    """Only parts that change owner move, each straight from a current owner.

    A new owner takes its exact shard from an old holder of that shard; if
    the TP size changed, it takes every shard of one old group and slices
    its own. A device keeps what it already holds.
    """
    return transfers_between(holdings(old, ranks, layers), holdings(new, ranks, layers), layers)


def surviving_holdings(
    plan: Plan, old_ranks: dict[str, int], new_ranks: dict[str, int], layers: int
) -> dict[Part, dict[int, tuple[int, int]]]:
    """What the devices of a new world still hold of an old plan, under their new ranks:
    the holdings of `plan` with every device missing from new_ranks (lost) left out."""
    device_of = {r: d for d, r in old_ranks.items()}
    return {
        part: {new_ranks[device_of[r]]: shard for r, shard in held.items() if device_of[r] in new_ranks}
        for part, held in holdings(plan, old_ranks, layers).items()
    }


def one_node_parts(plan: Plan, layers: int) -> list[Part]:
    """Parts every copy of which is on one node (a device's node is its id's prefix): lost with
    that node, they come back only from a checkpoint. A copy is one stage's, and a stage's TP
    group lies on one node (cost.validate's rule tp-group-across-nodes)."""
    ranks = {device: i for i, device in enumerate(plan.devices)}
    node_of = {i: device.split("/")[0] for device, i in ranks.items()}
    return [part for part, held in holdings(plan, ranks, layers).items() if len({node_of[r] for r in held}) == 1]


def lost_parts(before: dict[Part, dict[int, tuple[int, int]]]) -> list[Part]:
    """Parts of which no complete copy survives: for no TP size are all its shards held."""
    return [part for part, held in before.items() if not _complete_sizes(held)]


def _complete_sizes(held: dict[int, tuple[int, int]]) -> list[int]:
    sizes: dict[int, set[int]] = {}
    for t, r in held.values():
        sizes.setdefault(t, set()).add(r)
    return sorted(t for t, rs in sizes.items() if len(rs) == t)


def transfers_between(
    before: dict[Part, dict[int, tuple[int, int]]], after: dict[Part, dict[int, tuple[int, int]]], layers: int
) -> list[Transfer]:
    """transfers() over holdings: part -> {rank: (t, r)} before and after."""
    out = []
    for part in part_order(layers):
        old_holders = before[part]
        for dst in sorted(after[part]):
            want = after[part][dst]
            if old_holders.get(dst) == want:
                continue
            exact = sorted(rank for rank, shard in old_holders.items() if shard == want)
            if exact:
                # Prefer a holder that does not also hold it in the new plan: it has nothing else to do.
                src = min(exact, key=lambda rank: (rank in after[part], rank))
                out.append(Transfer(part, src, dst, *want))
            else:
                out.extend(Transfer(part, src, dst, t, r) for src, (t, r) in _one_of_each_shard(old_holders, dst))
    return out


def _one_of_each_shard(holders: dict[int, tuple[int, int]], dst: int) -> list[tuple[int, tuple[int, int]]]:
    """A holder of each shard of one old TP size: dst's own if it held the part
    (its shard then comes from itself, without the network), else the smallest
    size (fewest messages). Replicas are identical after a step, so shards
    from different pipelines combine."""
    by_size: dict[int, dict[int, int]] = {}
    for rank, (t, r) in sorted(holders.items(), key=lambda item: (item[0] != dst, item[0])):
        by_size.setdefault(t, {}).setdefault(r, rank)
    complete = _complete_sizes(holders)  # after a loss some sizes may miss a shard
    t = holders[dst][0] if dst in holders and holders[dst][0] in complete else min(complete)
    return [(by_size[t][r], (t, r)) for r in range(t)]


def norm_parts(plan: Plan, ranks: dict[str, int], rank: int) -> set[Part]:
    """The parts whose gradients `rank` counts in the global gradient norm: those its
    pipeline is the first to hold (after the sync every holder has the same gradient),
    so each part is counted by one pipeline; within its TP group each device counts its
    own shard of split tensors and member 0 alone counts the replicated ones."""
    all_roles = roles(plan, ranks)
    first: dict[Part, int] = {}
    for role in all_roles.values():
        for part in role.parts:
            first[part] = min(first.get(part, role.pipeline), role.pipeline)
    role = all_roles.get(rank)
    return {part for part in role.parts if first[part] == role.pipeline} if role else set()
