"""The reference cost model of spec/cost-model.md, sections 3 to 6.

`validate` checks the rules of a valid plan, `evaluate` computes the step time
exactly as the spec writes it. The planner may search with anything it likes,
but every figure it reports comes from here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

from .cluster import Cluster
from .errors import PlanError
from .model import ModelSpec
from .plan import Plan, Predicted

MEMORY_HEADROOM = 0.9
BYTES_PER_PARAM = 16  # bf16 weight and gradient, fp32 master, Adam m and v


class StageCost(NamedTuple):
    """What the cost model needs of one stage: its group's node, size, speed, memory. (A named
    tuple: the search builds hundreds of thousands, three times faster than a dataclass.)"""

    node: int
    t: int
    speed: float  # min over the group's devices, FLOP/s
    memory: float  # min over the group's devices, bytes
    start: int
    end: int

    @property
    def n(self) -> int:
        return self.end - self.start


# StageCost(...) runs the Python __new__ that namedtuple generates; the search's inner loops make
# their stages with this instead, the same tuple without that call: new_stage(StageCost, (node, t,
# speed, memory, start, end)).
new_stage = tuple.__new__


@dataclass(frozen=True)
class Breakdown:
    pipeline_times_s: list[float]
    dp_sync_time_s: float
    step_time_s: float
    samples_per_s: float
    ideal_samples_per_s: float


def step_flop(model: ModelSpec) -> float:
    """The FLOP of one step: M micro-batches, forward and backward (3x), L blocks and the LM head."""
    return model.micro_batches * 3 * (model.layers * model.block_flops + model.head_flops)


def ideal_samples_per_s(cluster: Cluster, model: ModelSpec) -> float:
    total_speed = sum(cluster.speed(d, model.mfu) for d in cluster.usable)
    return model.global_batch / (step_flop(model) / total_speed)


def stage_costs(plan: Plan, cluster: Cluster, model: ModelSpec) -> list[list[StageCost]]:
    devices = cluster.device_by_id
    out = []
    for p in plan.pipelines:
        row = []
        for s in p.stages:
            ds = [devices[d] for d in s.devices]
            row.append(
                StageCost(
                    node=ds[0].node,
                    t=len(ds),
                    speed=min(cluster.speed(d, model.mfu) for d in ds),
                    memory=min(cluster.memory_bytes(d) for d in ds),
                    start=s.layers[0],
                    end=s.layers[1],
                )
            )
        out.append(row)
    return out


def stage_compute_s(st: StageCost, last: bool, model: ModelSpec, cluster: Cluster) -> float:
    """tau_k: compute (forward + backward) plus tensor-parallel all-reduces."""
    work = st.n * model.block_flops + (model.head_flops if last else 0.0)
    tau = 3 * work / (st.t * st.speed)
    if st.t > 1:
        tau += st.n * 4 * (2 * (st.t - 1) / st.t) * model.activation_bytes / cluster.link_bw(st.node, st.node)
    return tau


def pipeline_terms(stages: list[StageCost], model: ModelSpec, cluster: Cluster) -> tuple[float, float]:
    """(first, each): a pipeline with m micro-batches takes first + (m - 1) * each."""
    last = len(stages) - 1
    # stage_compute_s inlined (the search's innermost loop), the same arithmetic in the same order
    flops, head, tp_bytes, link = model.block_flops, model.head_flops, model.activation_bytes, cluster.link_bw
    taus, sizes, nodes = [], [], []
    for k, (node, t, speed, _, start, end) in enumerate(stages):
        n = end - start
        tau = 3 * (n * flops + (head if k == last else 0.0)) / (t * speed)
        if t > 1:
            tau += n * 4 * (2 * (t - 1) / t) * tp_bytes / link(node, node)
        taus.append(tau)
        sizes.append(t)
        nodes.append(node)
    comms = [2 * tp_bytes / (min(sizes[k], sizes[k + 1]) * link(nodes[k], nodes[k + 1])) for k in range(last)]
    return sum(taus) + sum(comms), max(taus + comms)


def pipeline_time_s(stages: list[StageCost], m: int, model: ModelSpec, cluster: Cluster) -> float:
    """T_p under a one-forward-one-backward schedule with m micro-batches."""
    first, each = pipeline_terms(stages, model, cluster)
    return first + (m - 1) * each


def min_pair_bw(nodes: list[int], cluster: Cluster) -> float:
    """Smallest bwx between any two of a set of stages, given each stage's node.

    Link bandwidth depends only on the two nodes' network profiles, so the
    minimum over all pairs is a minimum over pairs of profiles present. The search asks
    for the same sets many times, in many orders: remembered per cluster by the nodes as
    given, then by the nodes present and those present twice."""
    key = tuple(nodes)
    memo = cluster.pair_bw_memo
    bw = memo.get(key)
    if bw is None:
        distinct = set(key)
        twice: set[int] = set()
        if len(distinct) < len(key):
            seen: set[int] = set()
            for n in key:
                if n in seen:
                    twice.add(n)
                seen.add(n)
        kind = (frozenset(distinct), frozenset(twice))
        bw = memo.get(kind)
        if bw is None:
            bw = memo[kind] = _min_pair_bw(distinct, twice, cluster)
        memo[key] = bw
    return bw


def _min_pair_bw(distinct: set[int], twice: set[int], cluster: Cluster) -> float:
    best = min([cluster.link_bw(n, n) for n in twice], default=math.inf)
    by_profile: dict[tuple, list[int]] = {}
    for n in distinct:
        by_profile.setdefault(cluster.network_profiles[n], []).append(n)
    reps = list(by_profile.values())
    for i, a in enumerate(reps):
        if len(a) > 1:
            best = min(best, cluster.link_bw(a[0], a[1]))
        for b in reps[i + 1 :]:
            best = min(best, cluster.link_bw(a[0], b[0]))
    return best


def sync_runs(costs: list[list[StageCost]], cluster: Cluster) -> tuple[list[int], list, list]:
    """How the blocks of a split sync: (each pipeline's split class, per class a row split so,
    and per run of blocks with the same holders (a, b, each class's stage holding them, the
    bandwidth they sync at: the slowest pair of the holders at the narrowest holder's TP)).
    Pipelines split at the same blocks pay alike, so each class is walked once. A split of
    partition_layers keeps its answer: the re-split reads it first and the score then."""
    walk = getattr(costs, "sync_walk", None)
    if walk is not None:
        return walk
    classes: dict[tuple[int, ...], int] = {}  # block ends -> class
    class_of, rows, holders = [], [], []  # holders: per class, per stage, [narrowest t, nodes]
    for row in costs:
        ends = tuple([s.end for s in row])
        c = classes.get(ends)
        if c is None:
            c = classes[ends] = len(rows)
            rows.append(row)
            holders.append([[s.t, [s.node]] for s in row])
        else:
            for held, s in zip(holders[c], row):
                if s.t < held[0]:
                    held[0] = s.t
                held[1].append(s.node)
        class_of.append(c)
    if len(rows) == 1:  # aligned: stage k holds the same blocks everywhere
        runs = [
            (s.start, s.end, (k,), t * min_pair_bw(nodes, cluster))
            for k, (s, (t, nodes)) in enumerate(zip(rows[0], holders[0]))
        ]
    else:  # the runs between consecutive boundaries of any class have the same holders
        holders = [[(t, tuple(nodes)) for t, nodes in stages] for stages in holders]
        ends = list(classes)  # per class, its stages' ends
        bounds = sorted({0}.union(*ends))  # every stage's start, and the last end
        cursor = [0] * len(rows)
        runs = []
        for a, b in zip(bounds, bounds[1:]):
            narrowest, nodes = math.inf, ()
            for c, class_ends in enumerate(ends):
                k = cursor[c]
                while class_ends[k] <= a:
                    k += 1
                cursor[c] = k
                t, held = holders[c][k]
                if t < narrowest:
                    narrowest = t
                nodes += held
            runs.append((a, b, tuple(cursor), narrowest * min_pair_bw(nodes, cluster)))
    walk = (class_of, rows, runs)
    if hasattr(costs, "sync_walk"):
        costs.sync_walk = walk
    return walk


def stage_sync_bws(costs: list[list[StageCost]], cluster: Cluster) -> list[tuple[float, ...]]:
    """Per pipeline, per stage: the bandwidth its blocks' gradients sync at, as dp_sync_s pays
    it (the slowest of its runs of blocks, sync_runs), put per GPU of the stage's own TP size."""
    class_of, rows, runs = sync_runs(costs, cluster)
    slowest = [[math.inf] * len(row) for row in rows]
    for _, _, holders, bw in runs:
        for row_bw, k in zip(slowest, holders):
            if bw < row_bw[k]:
                row_bw[k] = bw
    return [tuple([bw / s.t for bw, s in zip(slowest[c], row)]) for c, row in zip(class_of, costs)]


def _ends_sync(pipelines: list, model: ModelSpec, cluster: Cluster) -> tuple[float, float, float]:
    """(the ring all-reduce's factor, the embedding's sync, the LM head's sync) of two or more
    pipelines (their stages each with a node and a size t): what dp_sync_s pays at the ends."""
    D = len(pipelines)
    factor = 2 * (D - 1) / D

    def sync(params: int, stages: list) -> float:
        return factor * 2 * params / (min([s.t for s in stages]) * min_pair_bw([s.node for s in stages], cluster))

    return (
        factor,
        sync(model.embedding_params, [p[0] for p in pipelines]),
        sync(model.head_params, [p[-1] for p in pipelines]),
    )


def dp_sync_s(costs: list[list[StageCost]], model: ModelSpec, cluster: Cluster) -> float:
    """T_dp: the largest gradient all-reduce time any device pays."""
    if len(costs) == 1:
        return 0.0
    factor, emb, head = _ends_sync(costs, model, cluster)
    _, rows, runs = sync_runs(costs, cluster)
    paid = [[0.0] * len(row) for row in rows]
    per_params = factor * 2 * model.block_params
    for a, b, holders, bw in runs:
        per_block = per_params / bw
        for row_paid, k in zip(paid, holders):
            row_paid[k] += (b - a) * per_block
    for row_paid in paid:
        row_paid[0] += emb
        row_paid[-1] += head
    return max(max(r) for r in paid)


def dp_sync_floor(pipelines: list, model: ModelSpec, cluster: Cluster) -> float:
    """A lower bound on dp_sync_s under any split of the blocks over these pipelines' stages
    (each with a node and a size t): known before the blocks are split, so a layout that cannot
    beat a bound is not split.

    The embedding and LM head sync as dp_sync_s has them, with a block at least beside them.
    Every block's replicas, one per pipeline, sync at most at the narrowest TP size of the
    widest stages and at the bandwidth of the slowest pipeline's fastest link off its nodes
    (replicas on two nodes or more), or within a node every pipeline has a stage on; the
    shallowest pipeline has a stage of ceil(L / its depth) blocks."""
    D = len(pipelines)
    if D == 1:
        return 0.0
    factor, emb, head = _ends_sync(pipelines, model, cluster)
    out_bw = cluster.fastest_out_bw
    bw = min([max([out_bw[s.node] for s in pipe]) for pipe in pipelines])
    if D <= max(n.gpus for n in cluster.nodes):  # every pipeline may hold a stage on one node
        shared = set.intersection(*[{s.node for s in pipe} for pipe in pipelines])
        bw = max([bw] + [cluster.link_bw(n, n) for n in shared])
    per_block = factor * 2 * model.block_params / (min([max([s.t for s in pipe]) for pipe in pipelines]) * bw)
    deepest_stage = -(-model.layers // min([len(pipe) for pipe in pipelines]))
    return max(emb + per_block, head + per_block, deepest_stage * per_block)


def step_time_s(
    costs: list[list[StageCost]], micro_batches: list[int], model: ModelSpec, cluster: Cluster
) -> tuple[list[float], float, float]:
    """(pipeline times, T_dp, step time) of stages already resolved to costs."""
    times = [pipeline_time_s(row, m, model, cluster) for row, m in zip(costs, micro_batches)]
    dp = dp_sync_s(costs, model, cluster)
    return times, dp, max(times) + dp


def evaluate(plan: Plan, cluster: Cluster, model: ModelSpec) -> Breakdown:
    """The figures of sections 4 and 6 for a plan (assumed valid)."""
    costs = stage_costs(plan, cluster, model)
    times, dp, step = step_time_s(costs, [p.micro_batches for p in plan.pipelines], model, cluster)
    return Breakdown(times, dp, step, model.global_batch / step, ideal_samples_per_s(cluster, model))


def with_prediction(plan: Plan, cluster: Cluster, model: ModelSpec) -> Plan:
    b = evaluate(plan, cluster, model)
    return replace(plan, predicted=Predicted(b.step_time_s, b.samples_per_s, b.ideal_samples_per_s))


def stage_memory_bytes(n: int, k: int, S: int, m: int, t: int, model: ModelSpec) -> float:
    """Bytes one device of stage k (of S, t devices, m micro-batches) holds: section 5."""
    params = n * model.block_params + (k == 0) * model.embedding_params + (k == S - 1) * model.head_params
    in_flight = min(S - k, m)
    return (BYTES_PER_PARAM * params + in_flight * n * model.block_activation_memory) / t


def fits_memory(costs: list[list[StageCost]], micro_batches: list[int], model: ModelSpec) -> bool:
    """Section 5's memory on every stage, with each pipeline's own micro-batches."""
    return all(
        stage_memory_bytes(c.n, k, len(row), m, c.t, model) <= MEMORY_HEADROOM * c.memory
        for row, m in zip(costs, micro_batches)
        for k, c in enumerate(row)
    )


def most_micro_batches(row: list[StageCost], model: ModelSpec) -> int:
    """The most micro-batches a pipeline's memory holds: M if it holds M (past one per stage
    memory stops growing), 0 if not even one. Per stage, a binary search over how many are in
    flight, its cap; the pipeline's is the least."""
    S, M, most = len(row), model.micro_batches, model.micro_batches
    for k, c in enumerate(row):
        limit = MEMORY_HEADROOM * c.memory
        if stage_memory_bytes(c.n, k, S, M, c.t, model) <= limit:
            continue
        if stage_memory_bytes(c.n, k, S, 1, c.t, model) > limit:
            return 0
        lo, hi = 1, min(S - k, M)  # fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if stage_memory_bytes(c.n, k, S, mid, c.t, model) <= limit:
                lo = mid
            else:
                hi = mid
        most = min(most, lo)
    return most


def validate(plan: Plan, cluster: Cluster, model: ModelSpec) -> None:
    """Raise PlanError naming the first rule of section 3 the plan breaks."""
    if (plan.global_batch, plan.micro_batch) != (model.global_batch, model.micro_batch):
        raise PlanError(
            "batch-mismatch",
            f"plan has global_batch={plan.global_batch}, micro_batch={plan.micro_batch}; "
            f"the model has {model.global_batch} and {model.micro_batch}",
        )
    devices = cluster.device_by_id
    used = plan.devices
    for d in used + list(plan.removed):
        if d not in devices:
            raise PlanError("unknown-device", f"device {d!r} is not in cluster {cluster.name!r}")
    for d in used:
        if devices[d].failed:
            raise PlanError("failed-device-used", f"device {d!r} has failed (rate inf) but is in a stage")
    for d in plan.removed:  # rule 1: a failed device may not appear in a plan at all
        if devices[d].failed:
            raise PlanError(
                "failed-device-used", f"device {d!r} has failed (rate inf) and may not be in 'removed' either"
            )
    twice = [d for d, c in Counter(used + list(plan.removed)).items() if c > 1]
    if twice:
        raise PlanError("device-used-twice", f"device {twice[0]!r} appears more than once in the plan")
    listed = set(used) | set(plan.removed)
    missing = [d.id for d in cluster.usable if d.id not in listed]
    if missing:
        raise PlanError(
            "device-neither-used-nor-removed", f"usable device {missing[0]!r} is in no stage and not in 'removed'"
        )
    L = model.layers
    for i, p in enumerate(plan.pipelines):
        expected = 0
        for j, s in enumerate(p.stages):
            where = f"pipelines[{i}].stages[{j}]"
            if len({devices[d].node for d in s.devices}) > 1:
                raise PlanError("tp-group-across-nodes", f"{where} devices {list(s.devices)} span several nodes")
            if not model.tp_divides(len(s.devices)):
                splits = ""
                if model.counted is not None:
                    sizes = model.counted.tp_split_sizes
                    splits = f" and the split dimensions ({', '.join(map(str, sizes))})" if sizes else ""
                    splits += "" if sizes else "; the model declares no tensor-parallel splits (TP 1 only)"
                raise PlanError(
                    "tp-does-not-divide-heads",
                    f"{where} has {len(s.devices)} devices; its TP size must divide heads "
                    f"({model.heads}), ffn_hidden ({model.ffn_hidden}) and kv_heads ({model.kv_heads}){splits}",
                )
            if s.layers[0] < 0:  # not an overlap: no stage comes before the first
                raise PlanError("layers-out-of-range", f"{where} starts at block {s.layers[0]}; blocks are [0, {L})")
            if s.n < 1:
                raise PlanError("empty-stage", f"{where} layers {list(s.layers)} hold no block (n must be >= 1)")
            if s.layers[0] > expected:
                raise PlanError(
                    "layer-gap",
                    f"{where} starts at block {s.layers[0]}; blocks [{expected}, {s.layers[0]}) are held by no stage",
                )
            if s.layers[0] < expected:
                raise PlanError(
                    "layer-overlap",
                    f"{where} starts at block {s.layers[0]}, inside the previous stage (which ends at {expected})",
                )
            expected = s.layers[1]
        if expected < L:
            raise PlanError(
                "layer-gap", f"pipelines[{i}] ends at block {expected}; blocks [{expected}, {L}) are held by no stage"
            )
        if expected > L:
            raise PlanError("layers-out-of-range", f"pipelines[{i}] ends at block {expected}; the model has {L}")
        if p.micro_batches < 1:
            raise PlanError(
                "micro-batches-below-one",
                f"pipelines[{i}] has micro_batches={p.micro_batches}; each pipeline needs at least 1",
            )
    total = sum(p.micro_batches for p in plan.pipelines)
    if total != model.micro_batches:
        raise PlanError(
            "micro-batches-do-not-sum",
            f"pipelines' micro_batches sum to {total}; M = global_batch/micro_batch = {model.micro_batches}",
        )
    for i, p in enumerate(plan.pipelines):
        S = len(p.stages)
        for k, s in enumerate(p.stages):
            need = stage_memory_bytes(s.n, k, S, p.micro_batches, len(s.devices), model)
            for d in s.devices:
                cap = MEMORY_HEADROOM * cluster.memory_bytes(devices[d])
                if need > cap:
                    raise PlanError(
                        "out-of-memory",
                        f"pipelines[{i}].stages[{k}] needs {need / 2**30:.1f} GiB on {d}; "
                        f"the limit is 0.9 x memory = {cap / 2**30:.1f} GiB",
                    )
