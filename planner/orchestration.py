"""Phase 2: pipeline orchestration.

Arranges groups into pipelines (their number and length may differ), then
gives each stage a contiguous block range sized to its speed, its memory, its
tensor-parallel overhead, the LM head on the last stage, and the gradient
sync its links will pay.

NIC awareness (Holmes): groups are ordered by the network their node's
data-parallel traffic can use (InfiniBand, RoCE, Ethernet only) and dealt so
that stage k of every pipeline comes from one slice of that order. The
replicas of a block then sit on one RDMA type where the counts allow, and
only pipeline boundaries cross between InfiniBand and RoCE, where traffic
falls back to TCP.
"""

from __future__ import annotations

import heapq
import math

from .assignment import assign_micro_batches
from .cluster import Cluster
from .cost import BYTES_PER_PARAM, MEMORY_HEADROOM, StageCost, dp_sync_floor, min_pair_bw, new_stage, pipeline_terms
from .grouping import Group
from .model import ModelSpec

ARRANGEMENTS = ("columns", "ranked", "rows", "sized", "blocks")
# The depths of a layout's pipelines: all about equal (None), or all `stages` deep but the last,
# which takes the rest and this many pipelines' groups more (see depths).
ODD_PIPELINES = (None, 0, 1, 2)


def depths(groups: int, stages: int, max_pipelines: int, odd: int | None = None) -> list[int]:
    """How many groups each pipeline takes.

    Depths about equal make pipelines alike, but each stage holds a whole number of blocks, and
    a pipeline waits on its fullest stage. 32 groups for 32 blocks: five pipelines of 6 or 7
    stages wait on stages of 6 blocks; three of 7 and one of 11 on stages of 5 and 3, and the
    deep one takes more micro-batches. One odd pipeline holds the groups a good depth leaves."""
    count = max(1, min(round(groups / stages), max_pipelines))
    odd_count = -(-groups // stages) - (odd or 0)
    if odd is None or odd_count < 2 or odd_count > max_pipelines:  # no room for an odd one
        return [groups // count + (p < groups % count) for p in range(count)]
    return [stages] * (odd_count - 1) + [groups - (odd_count - 1) * stages]


def arrange(
    groups: list[Group], stages: int, how: str, cluster: Cluster, max_pipelines: int, odd: int | None = None
) -> list[list[Group]]:
    """Deal groups into pipelines of about `stages` stages (at most `max_pipelines`,
    one per micro-batch; with fewer, the pipelines grow longer), or with one `odd` pipeline
    last (see depths): dealt by columns, a short one takes groups of the first slices only, a
    deep one all of the last slices; by rows, it takes the last groups of the order.

    columns: in network then file order, stage k of every pipeline from the
      k-th slice, so a straggler lands in one pipeline and replicas of a block
      share a network.
    ranked: columns in network then group-speed (speed x size) order:
      pipeline p takes the p-th fastest group of every slice, so stragglers
      of different slices share the last pipelines.
    rows: in network then speed order, each pipeline a run of consecutive
      groups, so slow groups share pipelines (which then get fewer
      micro-batches) instead of slowing many.
    sized: rows in network then group-speed order: where groups differ in
      size, a pipeline of wide groups and one of narrow ones, not a mix.
    blocks: columns, but where pipelines differ in depth the stages take the
      groups in the order of the blocks they will about hold (stage k of S
      holds those about (k + 1/2) / S of the way through): the stages that
      hold a block's replicas then sit on one node where they fit, and sync
      there. Columns gives a deep pipeline's later stages the last groups.
    """
    return deal(in_order(groups, how, cluster), stages, how, max_pipelines, odd)


def in_order(groups: list[Group], how: str, cluster: Cluster) -> list[Group]:
    """The groups in the order an arrangement deals them (see arrange)."""
    rank = cluster.nic_order
    cls = [rank[cluster.nodes[g.node].nic_class] for g in groups]
    if how in ("columns", "blocks"):
        order = sorted(range(len(groups)), key=lambda i: (cls[i], groups[i].node))
    elif how in ("ranked", "sized"):
        order = sorted(range(len(groups)), key=lambda i: (cls[i], -groups[i].speed * groups[i].t, groups[i].node))
    else:
        order = sorted(range(len(groups)), key=lambda i: (cls[i], -groups[i].speed, groups[i].node))
    return [groups[i] for i in order]


def deal(groups: list[Group], stages: int, how: str, max_pipelines: int, odd: int | None = None) -> list[list[Group]]:
    """Groups already in_order dealt into pipelines (see arrange)."""
    ordered = iter(groups)
    sizes = depths(len(groups), stages, max_pipelines, odd)
    if how in ("rows", "sized"):
        return [[next(ordered) for _ in range(size)] for size in sizes]
    out: list[list[Group]] = [[] for _ in sizes]
    if how == "blocks":  # stages in the order of the blocks they hold (ties: pipeline order)
        for _, p in sorted([((k + 0.5) / size, p) for p, size in enumerate(sizes) for k in range(size)]):
            out[p].append(next(ordered))
        return out
    for k in range(max(sizes)):  # slice k: stage k of every pipeline that deep
        for pipe, size in zip(out, sizes):
            if size > k:
                pipe.append(next(ordered))
    return out


def partition_layers(
    pipelines: list[list[Group]],
    model: ModelSpec,
    cluster: Cluster,
    in_flight: int = 0,
    crossings: tuple[int, ...] | None = None,
    sync_bws: list[tuple[float, ...]] | None = None,
) -> Partition | None:
    """Blocks per stage for every pipeline (with each pipeline's terms, see Partition), or
    None if some pipeline cannot hold the model.
    Memory is counted with `in_flight` micro-batches at most (0: M, so any split of the
    micro-batches fits; fewer lets a small GPU hold a stage of a pipeline given few).
    crossings: where every pipeline passes from one network's stages to the next's (see
    network_crossings), the blocks of each network's run of stages fixed by them.
    sync_bws: per pipeline, per stage, the bandwidth its gradients sync at (cost.stage_sync_bws
    of an earlier split); without it, the slowest link between the stages of the same index.

    Per pipeline, minimises max_k (n_k * w_k + e_k), where w_k is the stage's
    time per block (compute, tensor-parallel all-reduces, and its share of the
    gradient sync spread over the expected micro-batches) and e_k the LM head.
    Adding blocks one at a time to the stage that stays fastest is optimal for
    this min-max because every stage's time grows with its block count.
    """
    D = len(pipelines)
    depth = max([len(p) for p in pipelines])
    mu = model.micro_batches / D + depth - 1  # how many tau a pipeline's step lasts
    sync_factor = 2 * (D - 1) / D * 2 * model.block_params if D > 1 else 0.0
    nodes_of = [tuple([g.node for g in pipe]) for pipe in pipelines]
    if sync_bws is None:
        holders = [[nodes[k] for nodes in nodes_of if len(nodes) > k] for k in range(depth)]
        positions = tuple(min_pair_bw(nodes, cluster) if len(nodes) > 1 else float("inf") for nodes in holders)
    out = Partition()
    # Most pipelines look alike, within a layout and across the layouts a search scores: each
    # kind is solved once per cluster and model, its blocks and its pipeline terms.
    memo = _memo(cluster, model)
    solved, blocks = memo.solved, memo.blocks
    for p, pipe in enumerate(pipelines):
        at = sync_bws[p] if sync_bws is not None else positions[: len(pipe)]
        kinds = tuple([g.kind for g in pipe])
        nodes = nodes_of[p]
        hops = pipeline_hops(nodes, cluster)  # the terms depend on them
        runs = network_runs(nodes, cluster) if crossings else None
        answer = solved.get((kinds, hops, at, runs, crossings, mu, sync_factor, in_flight))
        if answer is None:  # the blocks, then, may be known without the hops
            key = (kinds, at, runs, crossings, mu, sync_factor, in_flight)
            if key not in blocks:
                shape = [kind + (bw,) for kind, bw in zip(kinds, at)]
                caps = memo.caps_of(kinds, in_flight or model.micro_batches)
                terms = stage_terms(shape, model, mu, sync_factor, in_flight or model.micro_batches, caps)
                blocks[key] = _blocks_per_stage(terms, model.layers, runs, crossings)
            answer = solved[(kinds, hops) + key[1:]] = [blocks[key], None]
        counts = answer[0]
        if counts is None:
            return None
        row, start = [], 0
        for g, n in zip(pipe, counts):
            row.append(new_stage(StageCost, (g.node, g.t, g.speed, g.memory, start, start + n)))
            start += n
        if answer[1] is None:
            answer[1] = pipeline_terms(row, model, cluster)
        out.append(row)
        out.terms.append(answer[1])
    return out


def step_floor(
    pipelines: list[list[Group]], model: ModelSpec, cluster: Cluster, in_flight: int = 0, past: float = math.inf
) -> float | None:
    """A lower bound on the step time of these pipelines under any split of the blocks
    (slowest_floor + cost.dp_sync_floor), known before they are split; None if some pipeline
    cannot hold the model. Where slowest_floor alone is past `past`, it is returned as it is:
    the sync's floor is not worked out, as a caller that asks only whether the floor passes
    `past` has its answer."""
    slowest = slowest_floor(pipelines, model, cluster, in_flight)
    if slowest is None or slowest > past:
        return slowest
    return slowest + dp_sync_floor(pipelines, model, cluster)


def slowest_floor(pipelines: list[list[Group]], model: ModelSpec, cluster: Cluster, in_flight: int = 0) -> float | None:
    """A lower bound on how long the slowest pipeline takes (what candidate.score holds against
    its bound) under any split of the blocks, micro-batches given to finish earliest; None if
    some pipeline cannot hold the model. It needs no gradient sync, so it is known per kind of
    pipeline without the layout's other pipelines: a layout past its bound is not partitioned.
    Memory is counted as partition_layers counts it: with `in_flight` micro-batches at most
    (0: M, as the splits of partition_layers; 1: as any split that fits at all).

    Per pipeline, (first, each) of cost.pipeline_terms are bounded below by the split that
    minimises the slowest stage's compute and tensor-parallel time (the greedy of split_blocks,
    optimal for that min-max), and by one block per stage and the rest on the fastest stage.
    The fastest finish of micro-batches only grows with first and each."""
    memo = _memo(cluster, model)
    floors = memo.floors
    in_flight = in_flight or model.micro_batches
    firsts, eaches = [], []
    for pipe in pipelines:
        kinds = tuple([g.kind for g in pipe])
        hops = pipeline_hops(tuple([g.node for g in pipe]), cluster)
        floor = floors.get((kinds, hops, in_flight), False)
        if floor is False:
            floor = floors[kinds, hops, in_flight] = _pipeline_floor(kinds, hops, model, in_flight, memo)
        if floor is None:
            return None
        firsts.append(floor[0])
        eaches.append(floor[1])
    counts = assign_micro_batches(firsts, eaches, model.micro_batches)
    if counts is None:
        return None
    return max(f + (m - 1) * e for f, e, m in zip(firsts, eaches, counts))


def _pipeline_floor(kinds: tuple, hops: tuple, model: ModelSpec, in_flight: int, memo: _Memo):
    """(first, each) bounded below for stages of these kinds, these links between them (None if
    they cannot hold the model): their stage_terms without gradient sync. The compute part is
    the same whatever the links: worked out once per kind of pipeline."""
    compute = memo.floor_compute.get((kinds, in_flight), False)
    if compute is False:
        shape = [kind + (math.inf,) for kind in kinds]
        weights, extras, caps = stage_terms(shape, model, 1.0, 0.0, in_flight, memo.caps_of(kinds, in_flight))
        counts = split_blocks(weights, extras, caps, model.layers)
        compute = memo.floor_compute[kinds, in_flight] = (
            None
            if counts is None
            else (
                sum(weights) + (model.layers - len(kinds)) * min(weights) + extras[-1],
                max([n * w + e for n, w, e in zip(counts, weights, extras)]),
            )
        )
    if compute is None:
        return None
    comms = [2 * model.activation_bytes / (min(a[0], b[0]) * bw) for a, b, bw in zip(kinds, kinds[1:], hops)]
    return compute[0] + sum(comms), max([compute[1]] + comms)


class _Memo:
    """What partition_layers and slowest_floor work out per cluster and model (the model is kept
    with its answers, so its id cannot be reused while they are)."""

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self.solved: dict[tuple, list] = {}  # per kind of pipeline and its links: [blocks, terms]
        self.blocks: dict[tuple, list[int] | None] = {}  # per kind of pipeline: blocks per stage
        self.floors: dict[tuple, tuple[float, float] | None] = {}  # slowest_floor's per pipeline
        self.floor_compute: dict[tuple, tuple[float, float] | None] = {}  # _pipeline_floor's without links
        self.caps: dict[tuple, list[int]] = {}

    def caps_of(self, kinds: tuple, in_flight: int) -> list[int]:
        caps = self.caps.get((kinds, in_flight))
        if caps is None:
            caps = self.caps[kinds, in_flight] = _block_caps(kinds, self.model, in_flight)
        return caps


def _memo(cluster: Cluster, model: ModelSpec) -> _Memo:
    memo = cluster.partition_memo.get(id(model))
    if memo is None:
        memo = cluster.partition_memo[id(model)] = _Memo(model)
    return memo


class Partition(list):
    """partition_layers's answer: per pipeline, its stages' costs; and in `terms`, each
    pipeline's (first, each) of cost.pipeline_terms, solved once per kind of pipeline; and
    in `sync_walk`, cost.sync_runs's answer once asked."""

    def __init__(self) -> None:
        super().__init__()
        self.terms: list[tuple[float, float]] = []
        self.sync_walk: tuple | None = None


def network_crossings(costs: list[list[StageCost]], cluster: Cluster, every: bool = True) -> list[tuple[int, ...]]:
    """Common blocks at which every pipeline could pass between networks, where its pipelines
    pass through the same networks in the same order but at different blocks. A block held on
    InfiniBand in one pipeline and on RoCE in another syncs over TCP; at a common crossing each
    block's replicas share one network. Tried: the earliest, median and latest crossing (the
    median alone unless `every`)."""
    if len(cluster.nic_order) < 2:  # one network: nothing to cross
        return []
    runs = [network_runs(tuple([c.node for c in row]), cluster) for row in costs]
    if len({tuple(cls for cls, _ in r) for r in runs}) != 1 or len(runs[0]) < 2:
        return []
    ends = []
    for row, r in zip(costs, runs):
        stage_ends = [sum(n for _, n in r[: i + 1]) - 1 for i in range(len(r) - 1)]
        ends.append(tuple(row[k].end for k in stage_ends))
    if len(set(ends)) == 1:
        return []
    at = sorted(ends)
    return sorted({at[0], at[len(at) // 2], at[-1]}) if every else [at[len(at) // 2]]


def networks_in_one_order(pipelines: list[list[Group]], cluster: Cluster) -> list[list[Group]] | None:
    """The pipelines with each one's stages grouped by network, the networks in one order for all
    (by the mean place their stages have in their pipelines, then fastest first), each network's
    stages in the order they had; None if that changes nothing. Pipelines that pass through the
    networks in unlike orders share no crossing (network_crossings), so their blocks held on
    Ethernet in one and on InfiniBand in another sync over TCP."""
    places: dict[str, list[float]] = {}
    for pipe in pipelines:
        for i, g in enumerate(pipe):
            places.setdefault(cluster.nodes[g.node].nic_class, []).append(i / max(1, len(pipe) - 1))
    rank = {cls: (sum(at) / len(at), cluster.nic_order[cls]) for cls, at in places.items()}
    out = [sorted(pipe, key=lambda g: rank[cluster.nodes[g.node].nic_class]) for pipe in pipelines]
    return None if all([a == b for a, b in zip(out, pipelines)]) else out


def pipeline_hops(nodes: tuple[int, ...], cluster: Cluster) -> tuple[float, ...]:
    """The link bandwidths between consecutive stages of a pipeline on these nodes."""
    hops = cluster.hops_memo.get(nodes)
    if hops is None:
        hops = cluster.hops_memo[nodes] = tuple([cluster.link_bw(a, b) for a, b in zip(nodes, nodes[1:])])
    return hops


def network_runs(nodes: tuple[int, ...], cluster: Cluster) -> tuple[tuple[str, int], ...]:
    """Consecutive stages on one network: (class, how many), in pipeline order, of a pipeline
    whose stages are on these nodes."""
    runs = cluster.runs_memo.get(nodes)
    if runs is None:
        out: list[list] = []
        for cls in [cluster.nodes[n].nic_class for n in nodes]:
            if out and out[-1][0] == cls:
                out[-1][1] += 1
            else:
                out.append([cls, 1])
        runs = cluster.runs_memo[nodes] = tuple((cls, n) for cls, n in out)
    return runs


def stage_terms(shape: tuple, model: ModelSpec, mu: float, sync_factor: float, in_flight: int, caps=None):
    """Per stage of a shape of (t, speed, memory, intra-node bandwidth, sync bandwidth): time per
    block w_k, the LM head's time e_k, and the most blocks memory holds (with `in_flight`
    micro-batches at most; `caps` if already known)."""
    S = len(shape)
    weights, extras = [], []
    for k, (t, speed, _, intra_bw, sync_bw) in enumerate(shape):
        w = 3 * model.block_flops / (t * speed)
        if t > 1:
            w += 4 * (2 * (t - 1) / t) * model.activation_bytes / intra_bw
        w += sync_factor / (t * sync_bw) / mu
        weights.append(w)
        extras.append(3 * model.head_flops / (t * speed) if k == S - 1 else 0.0)
    return weights, extras, _block_caps(shape, model, in_flight) if caps is None else caps


def _block_caps(kinds: tuple, model: ModelSpec, in_flight: int) -> list[int]:
    """Per stage, of its group kind (t, speed, memory, ...), the most blocks its memory holds:
    section 5's memory solved for n, with `in_flight` micro-batches at most."""
    S = len(kinds)
    caps = []
    for k, (t, _, memory, *_) in enumerate(kinds):
        fixed = BYTES_PER_PARAM * (model.embedding_params * (k == 0) + model.head_params * (k == S - 1))
        per_block = BYTES_PER_PARAM * model.block_params + min(S - k, in_flight) * model.block_activation_memory
        caps.append(int((MEMORY_HEADROOM * memory * t - fixed) // per_block))
    return caps


def holds_model(pipe: list[Group], model: ModelSpec) -> bool:
    """Whether one pipeline alone holds the model, every micro-batch in flight: what
    partition_layers([pipe]) is not None says, without splitting the blocks."""
    return _room_for(_block_caps(tuple(g.kind for g in pipe), model, model.micro_batches), model.layers)


def holding_order(pipe: list[Group], model: ModelSpec) -> list[Group]:
    """The pipeline's groups in an order that holds the model, if its own does not and one with
    the two groups of most memory at the ends does (the first stage also holds the embedding and
    the most micro-batches in flight, the last the LM head); else as they are. The arrangements
    deal groups by network and speed: with GPUs of unlike memory, a small one can land on an end
    where nothing fits, though the same groups fit in another order."""
    if len(pipe) < 2 or holds_model(pipe, model):
        return pipe
    roomiest = sorted(pipe, key=lambda g: -g.memory * g.t)
    middle = roomiest[2:]
    for order in ([roomiest[0], *middle, roomiest[1]], [roomiest[1], *middle, roomiest[0]]):
        if holds_model(order, model):
            return order
    return pipe


def _room_for(caps: list[int], blocks: int) -> bool:
    """Whether stages of these caps hold `blocks` blocks, each stage at least one."""
    return len(caps) <= blocks and min(caps) >= 1 and sum(caps) >= blocks


def _blocks_per_stage(terms, layers: int, runs=None, crossings=None) -> list[int] | None:
    """The L blocks over the stages; with crossings, each run of stages gets the blocks
    between its crossings."""
    weights, extras, caps = terms
    if not crossings:
        return split_blocks(weights, extras, caps, layers)
    if len(crossings) != len(runs) - 1:
        return None  # not this pipeline's networks
    bounds, out, k = (0, *crossings, layers), [], 0
    for (_, n), a, b in zip(runs, bounds, bounds[1:]):
        part = split_blocks(weights[k : k + n], extras[k : k + n], caps[k : k + n], b - a)
        if part is None:
            return None
        out += part
        k += n
    return out


def split_blocks(weights: list[float], extras: list[float], caps: list[int], blocks: int) -> list[int] | None:
    """Blocks per stage minimising max_k (n_k * w_k + e_k) with 1 <= n_k <= caps[k] (None if they
    cannot hold `blocks`): as adding them one at a time where the time stays lowest."""
    S = len(weights)
    if not _room_for(caps, blocks):
        return None
    # Blocks go one at a time to the stage whose time stays lowest. A stage's times only grow, so
    # the blocks are added in order of the times they make: those at or below the level where the
    # stages balance unclamped come first, and are counted at once (exactly as the heap would).
    level = (blocks + sum([e / w for w, e in zip(weights, extras)])) / sum([1 / w for w in weights])
    counts = []
    for w, e, cap in zip(weights, extras, caps):
        c = max(1, min(cap, int((level - e) / w)))
        while c > 1 and c * w + e > level:
            c -= 1
        while c < cap and (c + 1) * w + e <= level:
            c += 1
        counts.append(c)
    if sum(counts) > blocks:  # one block each already overshoots: from the bottom
        counts = [1] * S
    heap = [((counts[k] + 1) * weights[k] + extras[k], k) for k in range(S) if counts[k] < caps[k]]
    heapq.heapify(heap)
    for _ in range(blocks - sum(counts)):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        if counts[k] < caps[k]:
            heapq.heappush(heap, ((counts[k] + 1) * weights[k] + extras[k], k))
    return counts
