"""A strong reference search for the planner benchmark.

Local search over whole plans (drover.planner.walk: random moves, every candidate scored
exactly with the reference cost model of spec/cost-model.md), started from Drover's plan and
from the uniform and drop baselines, with a budget far above the short descent the planner
ends with. It tells how far Drover's plan is from the best plan a much longer search finds.
The moves are listed in planner/walk_moves.py; the plan returned is re-scored with
cost.evaluate and checked with cost.validate.

Search: a short descent from each start point, then two runs from the best of
them (simulated annealing, then iterated local search with kicks), then a
descent from the best plan seen.

The budget is a number of evaluated candidates: the result is then a function
of the inputs and the seed. Optionally also wall-clock seconds (whichever ends
first; the phases and the annealing schedule then follow the clock, so such a
run depends on the machine's speed and cannot be replayed exactly).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

from drover.planner.cluster import Cluster
from drover.planner.cost import evaluate, stage_compute_s, stage_costs, validate, with_prediction
from drover.planner.errors import PlanError
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan
from drover.planner.search import make_plan
from drover.planner.walk import Walk
from drover.planner.walk_space import Space
from drover.planner.walk_state import State, state_from_plan

ANNEAL = (3e-3, 1e-5)  # temperatures: relative step-time increase accepted with probability 1/e


@dataclass
class Result:
    plan: Plan  # the best plan found, with its prediction, validated
    start: str  # the start point it descends from
    start_samples_per_s: dict[str, float]  # each start point's throughput
    evals: int
    seconds: float
    # move kind -> its net relative step-time gain over the moves on the best plan's path
    # (annealing and kicks take worsening moves too; "kicks" is all kicks together)
    gains: dict[str, float]
    path: list[tuple[str, float]]  # (move kind, relative gain) of the moves taken on that path


def start_plans(cluster: Cluster, model: ModelSpec, drover: Plan | None = None) -> dict[str, Plan]:
    """Drover's plan and the baselines (those that exist)."""
    out = {"drover": drover if drover is not None else make_plan(cluster, model)}
    for name in ("uniform", "drop"):
        try:
            out[name] = make_plan(cluster, model, name)
        except PlanError:
            pass
    return out


def reference_search(
    cluster: Cluster,
    model: ModelSpec,
    *,
    evals: int = 4000,
    seconds: float | None = None,
    seed: int = 0,
    starts: dict[str, Plan] | None = None,
    method: str = "mixed",
    anneal: tuple[float, float] = ANNEAL,
    patience: int = 300,
    restarts: int = 2,
) -> Result:
    """The best plan the search finds from the start plans (Drover's plan and the
    baselines by default) within `evals` evaluated candidates (or `seconds`, if given
    and reached first).

    5% of the budget: a descent from each start point; to 90%: `restarts` runs from
    the best of them, of simulated annealing ("anneal"), iterated local search
    ("ils"), or the two in turn ("mixed", which trial runs found strongest: the two
    often end in different basins); the rest: a descent from the best plan seen."""
    t0 = time.perf_counter()
    sp = Space(cluster, model)
    rng = random.Random(seed)
    if starts is None:
        starts = start_plans(cluster, model)
    run = Walk(sp, rng, evals, seconds)
    found = []
    start_samples = {}
    for i, (name, plan) in enumerate(starts.items()):
        st = state_from_plan(sp, plan)
        start_samples[name] = model.global_batch / st.step
        snap, path, step = run.search(st, 0.05 * (i + 1), [])
        found.append((step, name, snap, path))
    step, name, snap, path = min(found, key=lambda f: f[0])
    first = (snap, path)
    runs = []
    for r in range(restarts):  # independent runs from the best start point
        until = 0.05 * len(starts) + (0.9 - 0.05 * len(starts)) * (r + 1) / restarts
        st = State(sp, *first[0])
        if method == "anneal" or (method == "mixed" and r % 2 == 0):
            runs.append(run.search(st, until, list(first[1]), *anneal))
        else:
            runs.append(run.search(st, until, list(first[1]), patience=patience))
    snap, path, _ = min(runs, key=lambda b: b[2])
    snap, path, _ = run.search(State(sp, *snap), 1.0, path)
    st = State(sp, *snap)
    plan = with_prediction(st.to_plan(model), cluster, model)
    validate(plan, cluster, model)
    check = evaluate(plan, cluster, model).step_time_s
    if abs(check - st.step) > 1e-9 * check:
        raise AssertionError(f"incremental score {st.step} != cost model {check}")
    gains: dict[str, float] = {}
    for kind, gain in path:
        kind = "kicks" if kind.startswith("kick:") else kind
        gains[kind] = gains.get(kind, 1.0) * (1 + gain)
    return Result(
        plan, name, start_samples, run.evals, time.perf_counter() - t0, {k: v - 1 for k, v in gains.items()}, path
    )


# -- describing plans ----------------------------------------------------------------------


def describe(plan: Plan, cluster: Cluster, model: ModelSpec) -> dict:
    """The shape of a plan: what a reader compares between Drover's and the reference's."""
    dev = cluster.device_by_id
    rate = {d.id: d.rate for d in cluster.devices}
    b = evaluate(plan, cluster, model)
    tp = Counter(len(s.devices) for p in plan.pipelines for s in p.stages)
    depth = Counter(len(p.stages) for p in plan.pipelines)
    micro = [p.micro_batches for p in plan.pipelines]
    stragglers = {}
    for p in plan.pipelines:
        for s in p.stages:
            slow = [d for d in s.devices if rate[d] > 1.0]
            for d in slow:
                stragglers[d] = f"rate {rate[d]:g} in TP{len(s.devices)} ({s.n} blocks)"
    for d in plan.removed:
        if rate[d] > 1.0:
            stragglers[d] = f"rate {rate[d]:g} removed"
    healthy_removed = [d for d in plan.removed if rate[d] == 1.0]
    # Links without a common RDMA type (InfiniBand to RoCE, Ethernet-only nodes) fall back to TCP.
    costs = stage_costs(plan, cluster, model)

    def tcp(x: int, y: int) -> bool:
        return x != y and not (cluster.nodes[x].rdma_types & cluster.nodes[y].rdma_types)

    tcp_hops = Counter()  # min TP size at each stage boundary over TCP
    worst_each, bottleneck = 0.0, ""
    finish = []
    for row, p in zip(costs, plan.pipelines):
        last = len(row) - 1
        taus = [stage_compute_s(st, k == last, model, cluster) for k, st in enumerate(row)]
        comms = [
            2 * model.activation_bytes / (min(x.t, y.t) * cluster.link_bw(x.node, y.node)) for x, y in zip(row, row[1:])
        ]
        for x, y in zip(row, row[1:]):
            if tcp(x.node, y.node):
                tcp_hops[min(x.t, y.t)] += 1
        first, each = sum(taus) + sum(comms), max(taus + comms)
        finish.append((first + (p.micro_batches - 1) * each, each, max(taus) >= max(comms, default=0.0)))
    _, worst_each, compute_bound = max(finish)
    bottleneck = "compute" if compute_bound else "p2p"
    tcp_blocks = 0
    if len(costs) > 1:
        for layer in range(model.layers):
            nodes = {next(s.node for s in row if s.start <= layer < s.end) for row in costs}
            tcp_blocks += any(tcp(x, y) for x in nodes for y in nodes)
    return {
        "samples_per_s": round(b.samples_per_s, 4),
        "quality": round(b.samples_per_s / b.ideal_samples_per_s, 4),
        "pipelines": len(plan.pipelines),
        "depths": dict(sorted(depth.items())),
        "tp_sizes": dict(sorted(tp.items())),
        "micro_batches": [min(micro), max(micro)],
        "dp_sync_s": round(b.dp_sync_time_s, 5),
        "step_time_s": round(b.step_time_s, 5),
        "removed": len(plan.removed),
        "healthy_removed": len(healthy_removed),
        "healthy_removed_nodes": sorted({cluster.nodes[dev[d].node].name for d in healthy_removed})[:8],
        "stragglers": dict(sorted(stragglers.items())[:16]),
        "critical_each_s": round(worst_each, 6),
        "critical_bound_by": bottleneck,
        "tcp_hops_by_min_tp": dict(sorted(tcp_hops.items())),
        "blocks_synced_over_tcp": tcp_blocks,
    }


def tally(drover: dict, ref: dict) -> list[str]:
    """Kinds of difference between two descriptions, for counting over many cases."""
    out = []
    if ref["dp_sync_s"] < 0.8 * drover["dp_sync_s"]:
        out.append("dp sync 20%+ shorter")
    if ref["blocks_synced_over_tcp"] < drover["blocks_synced_over_tcp"]:
        out.append("fewer blocks synced over TCP")
    hops_d, hops_r = drover["tcp_hops_by_min_tp"], ref["tcp_hops_by_min_tp"]
    if hops_d and (not hops_r or min(hops_r) > min(hops_d)):
        out.append("wider TP groups at TCP hops")
    if drover["critical_bound_by"] != ref["critical_bound_by"]:
        out.append(f"critical pipeline {drover['critical_bound_by']}-bound -> {ref['critical_bound_by']}-bound")
    sd, sr = drover["stragglers"], ref["stragglers"]
    if any(sd[d].endswith("removed") and not sr.get(d, "").endswith("removed") for d in sd):
        out.append("a straggler Drover removes is used")
    if any(not sd[d].endswith("removed") and sr.get(d, "").endswith("removed") for d in sd):
        out.append("a straggler Drover uses is removed")
    if any(sd[d] != sr.get(d) and not sd[d].endswith("removed") and not sr.get(d, "").endswith("removed") for d in sd):
        out.append("a straggler in a different group or block count")
    if ref["healthy_removed"] > drover["healthy_removed"]:
        out.append("more healthy GPUs removed")
    if ref["healthy_removed"] < drover["healthy_removed"]:
        out.append("fewer healthy GPUs removed")
    if any(t & (t - 1) for t in ref["tp_sizes"]) and not any(t & (t - 1) for t in drover["tp_sizes"]):
        out.append("TP sizes not a power of two")
    if ref["tp_sizes"] != drover["tp_sizes"]:
        out.append("different TP group sizes")
    if len(ref["depths"]) > len(drover["depths"]):
        out.append("more varied pipeline depths")
    if ref["depths"] != drover["depths"]:
        out.append("different pipeline depths")
    if ref["pipelines"] != drover["pipelines"]:
        out.append("different pipeline count")
    if not out:
        out.append("same shape: block split or placement only")
    return out


def compare(drover: dict, ref: dict) -> list[str]:
    """What the reference plan changes relative to Drover's, in words."""
    out = []
    keys = ("pipelines", "depths", "tp_sizes", "micro_batches", "removed", "healthy_removed")
    keys += ("critical_bound_by", "tcp_hops_by_min_tp", "blocks_synced_over_tcp")
    for key in keys:
        if drover[key] != ref[key]:
            out.append(f"{key}: {drover[key]} -> {ref[key]}")
    if drover["dp_sync_s"] and abs(ref["dp_sync_s"] / drover["dp_sync_s"] - 1) > 0.02:
        out.append(f"dp_sync_s: {drover['dp_sync_s']} -> {ref['dp_sync_s']}")
    for d in sorted(set(drover["stragglers"]) | set(ref["stragglers"])):
        a, b = drover["stragglers"].get(d), ref["stragglers"].get(d)
        if a != b:
            out.append(f"{d}: {a} -> {b}")
    return out
