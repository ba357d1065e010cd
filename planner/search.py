"""The Drover planner: a search over the three phases, judged by the cost model.

Round one tries every tensor-parallel size, a spread of pipeline depths and
the arrangements columns, ranked and rows with stragglers grouped apart and none removed, once per
set of nodes left out (weaker_nodes); a set more than SET_REACH behind the best after it is
searched no further, and one that would be even with its GPUs perfectly balanced is not
searched. Round two fills in the depths around the best few layouts of each set, each also with one odd pipeline
of another depth (orchestration.depths), and the depths next to the best layout of each other
TP size. Round three takes the best
layouts and tries removing GPUs past each straggling rate present, grouping
that ignores rates, grouping that widens slow GPUs' groups, and (with several
networks) twice the TP size on the fastest network only; and the removal cuts for the best
layout of each other TP size. Round four
climbs from the best layouts, and from each TP size's best within 3% of them
(each start still within 10% of the best by then), one coordinate at a time
(depth, odd pipeline, cut, grouping, TP size, arrangement; its first sweep of depths
also takes those where the fullest stage holds a block fewer). The
baselines are candidates too, so Drover's plan is never worse than what a
Megatron-style job would run. Local search (polish.py) then edits the best
layouts, and a short descent of random moves over whole plans (walk.py: blocks,
micro-batches, groups and pipelines) and stragglers' groups traded with healthy ones of other
pipelines (polish.relocate) end at the plan returned. Under a time
budget, once some layout fits, no more are tried past it (the baselines are
still scored).
"""

from __future__ import annotations

import bisect
import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from . import baselines
from .candidate import Candidate, best_partition
from .cluster import Cluster
from .cost import step_flop
from .errors import PlanError
from .grouping import form_groups, tp_degrees
from .model import ModelSpec
from .orchestration import (
    ARRANGEMENTS,
    ODD_PIPELINES,
    deal,
    depths,
    holding_order,
    holds_model,
    in_order,
    partition_layers,
    step_floor,
)
from .plan import Plan
from .polish import polish, relocate, with_few_in_flight
from .walk import refine, settle

# Round one leaves "sized" out: there its layouts (often rows' alike) took the finalists' places
# and the later rounds climbed lower hills (5% lower on two of 60 generated scenarios); and
# "blocks": no plan of seed 0's 200 generated scenarios changed, for 4% more time. Round four
# tries every arrangement at every depth.
FIRST_ARRANGEMENTS = ("columns", "ranked", "rows")
SPLIT_RATIO = 1.1  # GPUs within 10% of each other share a TP group
# How GPUs group (grouping.form_groups): stragglers apart, blind to rates, apart with slow ones
# in groups as much wider as they are slower, apart with half the TP size off the fastest
# network (tried at twice the layout's TP size, with as many pipelines), or apart with a node's
# GPUs that the TP size does not divide in fewer groups, one wider (7 at TP 4: 5 + 2).
GROUPINGS = {
    "apart": {"split_ratio": SPLIT_RATIO},
    "blind": {"split_ratio": math.inf},
    "widened": {"split_ratio": SPLIT_RATIO, "widen": True},
    "narrowed": {"split_ratio": SPLIT_RATIO, "narrow_slower_networks": True},
    "packed": {"split_ratio": SPLIT_RATIO, "pack": True},
}
FINALISTS = 3
# Round four also climbs from each TP size's best layout this close to the best: farther ones
# never climbed past it in the gap cases and seeds measured, and cost about 40% more work.
CLIMB_BAND = 1.03
# Round four climbs from a start only if it is within this of the best found by then: on seed 0's
# 200 generated scenarios, the 50 climbs after the first that beat the best started at most 5.3%
# behind it and gained at most 4.7%; the climbs this skips were of sets of nodes far behind
# (Ethernet-only nodes left out: 1.7 times slower) or of starts the first climb left behind.
CLIMB_REACH = 1.1
# A climb stops once a sweep gains less than this. On seed 0's 200 generated scenarios, 1e-3
# made 2 plans faster (1.3% and 1.0%: the climbs after it started elsewhere) and none slower;
# 5e-3 made 6 slower (up to 1.3%) for no time saved.
CLIMB_MIN_GAIN = 1e-3
CUT_BAND = 1.15  # rates within this ratio of a lower one share its removal cut
POLISH_STARTS = 8  # the best layouts local search starts from
# After round one, a set of nodes left out (weaker_nodes) whose best layout is this far behind the
# best is searched no further. On the 19 InfiniBand + Ethernet scenarios of seed 0's 200 and the
# timing shapes, the set that won in the end was at most 5.8% behind after round one, and the sets
# that lost were 2% to 140% behind; in the InfiniBand + Ethernet timing shape 42% to 113%. With six
# kinds of GPU (seven sets) at 1,024 GPUs, rounds two and three spent 4 s on sets 29% to 164% behind.
SET_REACH = 1.25
# Rounds two and three also take the best layout of each other TP size (and set of nodes left
# out) within this of the best: the depths next to it with an odd pipeline, and the removal cuts
# with stragglers grouped apart or blind. When the finalists were all of one TP size, another size
# never had an odd pipeline or a cut, fell behind and was never climbed from: in generated
# scenario 85 of seed 0 (64 H100s, seven stragglers on one node), TP 2 with one odd pipeline and
# the GPUs past 1.51x left idle plans 12.6% faster than the best TP 1 plan, which the reference
# search had not beaten either. Its TP 2 layout was 21% behind before round three.
SIZE_BAND = 1.25
# The most of the fastest layouts any later choice reads (finalists, climb starts, local search's
# starts, with the copies split at every crossing): a layout slower than that many, than its own
# set of nodes' 2 x FINALISTS fastest and than its TP size's fastest changes nothing after it.
# Local search takes its starts from these and the TP sizes' bests only. With 16 rather than 24,
# one plan of 800 generated scenarios (seeds 0, 5, 7, 9) is 0.6% faster, none slower, and planning
# takes about 3% less time at the worst 64-GPU shape; with 12, one is 2.2% slower.
KEPT = 16
FLOOR_SLACK = 1 + 1e-9  # step_floor sums in another order than the cost model: rounding apart
# Stages local search may score (a layout costs about its number of stages): 3,500 up to 64
# GPUs, 52 a GPU past that (targets: 64 GPUs in 0.2 s, 1,024 in 3 s). Layouts of few, wide stages
# are cheap, so more of them are tried. With edits its floors drop charged an eighth (they were
# charged in full, under a budget of 5,000 and 75), planning takes about as long, and 17 plans of
# seed 0's 200 generated scenarios are faster (up to 1.9%), one slower (0.02%).
POLISH_STAGES = (3_500, 52)
# Random moves the closing descent (walk.refine) scores (0: none): the first on up to 64 usable
# GPUs and past 512 (REFINE_GPUS), the second in between (refine_evals). 300 took the generated
# scenarios below 0.99 of the reference search from 24 of 200 (seed 0) to 12, for about 0.05 s a
# plan at 64 GPUs; kicks (iterated local search) and 500 moves did no better per second. 250 pay
# for the "blocks" arrangement: 19 and 16 plans of seeds 0 and 7 lost up to 0.7%, for 4% less
# time. From 65 to 512 GPUs, where neither planning-time target binds, 1,000: of 800 generated
# scenarios (seeds 0, 5, 7, 9) and the timing shapes, 182 plans faster (up to 1.4%), 4 slower (up
# to 0.2%), for about a third more planning time at those sizes (0.33 to 0.45 s at 128 GPUs, mean).
REFINE_EVALS = (250, 1_000)
REFINE_GPUS = (64, 512)
# Stages relocation (polish.relocate) may score after the descent: 1,000 up to 66 GPUs, 15 a GPU
# past that. On 800 generated scenarios, 22 plans faster (up to 3%), none slower; 1% more time at
# the worst 64-GPU shape, 4% at 1,024 GPUs.
RELOCATE_STAGES = (1_000, 15)
# Boundary shifts the closing settle (walk.settle) may score. On 800 generated scenarios (seeds
# 0, 5, 7, 9) and the timing shapes, 46 plans faster (up to 1.8%: seed 0's 51, at 0.978 of the
# reference search before), none slower, for 1 to 3 ms a plan at 64 GPUs and up to 0.18 s at
# 1,024 (a pass costs one move per boundary of each shape of pipeline; the cap bounds it).
SETTLE_EVALS = 2_000


def refine_evals(usable: int) -> int:
    """The closing descent's budget for a cluster of this many usable GPUs (REFINE_EVALS)."""
    small, mid = REFINE_EVALS
    return mid if REFINE_GPUS[0] < usable <= REFINE_GPUS[1] else small


@dataclass(frozen=True)
class Deadline:
    """A wall-clock budget for one search (time.monotonic() seconds). Once past it the search
    tries no more layouts and returns the best found so far."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def passed(self) -> bool:
        return time.monotonic() > self.at


def stage_counts(layers: int, groups: int) -> list[int]:
    """Pipeline depths worth trying: every depth up to 8, then about 25% apart."""
    top = min(layers, groups)
    depths, s = [], 1
    while s <= top:
        depths.append(s)
        s = s + 1 if s < 8 else max(s + 1, round(s * 1.25))
    if top not in depths:
        depths.append(top)
    return depths


def block_depths(layers: int, groups: int, head: float) -> list[int]:
    """Depths at which a pipeline's fullest stage holds a block fewer: S stages of n blocks, the
    last n less the LM head's time in blocks (`head`), hold the L blocks from S = (L + head) / n
    on (from L / n if the head's stage may run longer); every depth between, for each n down to
    where the depths come within 8 (stage_counts has every depth up to 8). Steps of 25% miss
    most: at 64 GPUs, TP 1 and 32 blocks, depth 11 (ten stages of 3 blocks, one of 2 beside the
    head) planned 3.8% faster than any depth the search tried (generated scenario 60 of seed 7)."""
    top = min(layers, groups)
    out: set[int] = set()
    for n in range(1, layers + 1):
        fewest = -(-layers // n)
        out.update(range(fewest, min(top, math.ceil((layers + head) / n)) + 1))
        if fewest <= 8:
            break
    return sorted(out)


def cut_levels(rates: set[float]) -> list[float]:
    """Removal cuts worth a layout each: the straggling rates present, one per band of rates
    within CUT_BAND of each other (local search removes or restores single GPUs)."""
    levels: list[float] = []
    for rate in sorted(rates):
        if not levels or rate > levels[-1] * CUT_BAND:
            levels.append(rate)
    return levels


def weaker_nodes(cluster: Cluster) -> list[frozenset[int]]:
    """Nodes to leave out: none, then those of the weakest kind of GPU, then the two weakest
    kinds, ..., then the Ethernet-only nodes of a cluster with RDMA. A kind weaker in FLOP/s or
    memory can cost a plan more than it brings (its stages set the pace, or cannot hold the LM
    head), and so can a node whose gradients sync over TCP; no rate threshold removes them."""
    kinds = sorted({(n.gpu.tflops, n.gpu.memory_gib) for n in cluster.nodes})
    out = [frozenset()]
    for k in range(1, len(kinds)):
        weak = set(kinds[:k])
        out.append(frozenset(i for i, n in enumerate(cluster.nodes) if (n.gpu.tflops, n.gpu.memory_gib) in weak))
    tcp = frozenset(i for i, n in enumerate(cluster.nodes) if not n.rdma_types)
    if tcp and len(tcp) < len(cluster.nodes) and tcp not in out:
        out.append(tcp)
    return out


def finalists(found: list, count: int, each: int) -> list:
    """The `count` best layouts found, and the best `each` of every set of nodes left out:
    layouts without the Ethernet-only nodes must not crowd out the layouts with them, nor the
    other way round."""
    ranked = sorted(found, key=lambda f: f[0])
    out, taken = ranked[:count], {}
    for entry in out:
        taken[entry[1][-1]] = taken.get(entry[1][-1], 0) + 1
    for entry in ranked[count:]:
        nodes_out = entry[1][-1]
        if taken.get(nodes_out, 0) < each:
            taken[nodes_out] = taken.get(nodes_out, 0) + 1
            out.append(entry)
    return out


def size_bests(found: list, band: float) -> list:
    """The best layout of each TP size and set of nodes left out within `band` of the best,
    fastest first."""
    best = min([f[0] for f in found], default=math.inf)
    per_size: dict[tuple, tuple] = {}
    for entry in sorted(found, key=lambda f: f[0]):
        per_size.setdefault((entry[1][0], entry[1][-1]), entry)
    return [e for e in per_size.values() if e[0] <= best * band]


def other_sizes(found: list, taken: list) -> list:
    """size_bests within SIZE_BAND, but those `taken` already."""
    return [e for e in size_bests(found, SIZE_BAND) if all(e is not f for f in taken)]


def climb_starts(found: list) -> list:
    """Where round four climbs from: the finalists, and the best layout of each TP size and set
    of nodes left out within CLIMB_BAND of the best. The finalists are often one hill reached
    from other coordinates; another TP size's best can climb to a better one (generated scenario
    178 of seed 0: 2% faster)."""
    starts = finalists(found, FINALISTS, 1)
    return starts + [e for e in size_bests(found, CLIMB_BAND) if e not in starts]


def _usable(model: ModelSpec, grouping: tuple) -> tuple[list, list]:
    """(groups, removed): past M x L groups (M pipelines of L stages at most), the slowest stay
    idle."""
    groups, removed = grouping
    usable = model.micro_batches * model.layers
    if len(groups) > usable:
        by_speed = sorted(groups, key=lambda g: -g.speed * g.t)
        groups, removed = by_speed[:usable], removed + [d for g in by_speed[usable:] for d in g.devices]
    return groups, removed


def _layout(
    cluster: Cluster,
    model: ModelSpec,
    pipelines: list,
    removed: list,
    every_crossing: bool = False,
    bound: float = math.inf,
) -> Candidate | None:
    """Arranged pipelines scored: blocks partitioned, stages past L or pipelines that cannot hold
    the model alone left idle, micro-batches assigned; None if nothing fits, or if its pipelines
    alone take longer than `bound`."""
    limit = bound * FLOOR_SLACK
    floor = step_floor(pipelines, model, cluster, past=limit) if bound < math.inf else None
    if floor is not None and floor > limit:
        return None
    costs = partition_layers(pipelines, model, cluster)
    if costs is None and any(len(p) > model.layers for p in pipelines):  # a stage per block at most
        for pipe in pipelines:  # the slowest groups past L stay idle
            while len(pipe) > model.layers:
                slowest = min(pipe, key=lambda g: g.speed * g.t)
                pipe.remove(slowest)
                removed = removed + list(slowest.devices)
        costs = partition_layers(pipelines, model, cluster)
    if costs is None:  # a pipeline that holds the model only in another order of its stages
        pipelines = [holding_order(p, model) for p in pipelines]
        costs = partition_layers(pipelines, model, cluster)
    if costs is None:  # a pipeline that cannot hold the model alone (too short, too small) stays idle
        fits = [holds_model(p, model) for p in pipelines]
        if any(fits) and not all(fits):
            removed = removed + [d for p, ok in zip(pipelines, fits) if not ok for g in p for d in g.devices]
            pipelines = [p for p, ok in zip(pipelines, fits) if ok]
            costs = partition_layers(pipelines, model, cluster)
    if costs is None:
        return with_few_in_flight(pipelines, removed, cluster, model)
    return best_partition(pipelines, costs, removed, model, cluster, every_crossing, bound)


def search(cluster: Cluster, model: ModelSpec, deadline: Deadline | None = None) -> Candidate:
    if not cluster.usable:
        raise PlanError("no-usable-device", f"every device of cluster {cluster.name!r} has failed")
    found: list[tuple[float, tuple, Candidate]] = []
    grouped: dict[tuple, tuple] = {}
    ordered: dict[tuple, tuple] = {}
    tried: set[tuple] = set()  # coordinates, and groups dealt by depth
    scored: set[tuple] = set()  # layouts: pipelines and removed GPUs

    def groups(t: int, split: str, cut: float, out: frozenset) -> tuple:
        if (t, split, cut, out) not in grouped:
            grouped[t, split, cut, out] = form_groups(
                cluster, model, t, remove_from_rate=cut, left_out=out, **GROUPINGS[split]
            )
        return grouped[t, split, cut, out]

    def in_order_of(t: int, how: str, split: str, cut: float, out: frozenset) -> tuple[list, list]:
        """(groups, removed): the usable groups in the order the arrangement deals them, worked
        out once per grouping and arrangement."""
        if (t, how, split, cut, out) not in ordered:
            usable, removed = _usable(model, groups(t, split, cut, out))
            ordered[t, how, split, cut, out] = (in_order(usable, how, cluster), removed)
        return ordered[t, how, split, cut, out]

    def arranged(t: int, S: int, how: str, odd: int | None, split: str, cut: float, out: frozenset):
        """(pipelines, removed): the usable groups dealt into pipelines of about S stages (or S
        and one odd pipeline)."""
        order, removed = in_order_of(t, how, split, cut, out)
        return deal(order, S, how, model.micro_batches, odd), removed

    def try_layout(key: tuple) -> None:
        if key in tried or (found and deadline is not None and deadline.passed()):
            return
        tried.add(key)
        t, S, how, odd, split, cut, out = key
        order = in_order_of(t, how, split, cut, out)[0]
        if not order:
            return
        # Depths and odd pipelines that deal the groups alike make the same layout.
        sizes = tuple(depths(len(order), S, model.micro_batches, odd))
        dealt = (t, how, split, cut, out, sizes)
        if dealt in tried or (how == "blocks" and len(set(sizes)) == 1):  # that deals as columns
            return
        tried.add(dealt)
        pipelines, removed = arranged(t, S, how, odd, split, cut, out)
        same = (tuple([tuple([g.devices for g in pipe]) for pipe in pipelines]), tuple(removed))
        if same not in scored:  # other coordinates, the same pipelines: the same layout
            scored.add(same)
            consider(key, _layout(cluster, model, pipelines, removed, bound=worth_below(t, out)))

    fastest: dict[frozenset, tuple[float, tuple]] = {}  # per set of nodes left out: (step time, coordinates)
    leaders: list[float] = []  # the KEPT fastest step times, ascending
    leaders_of: dict[frozenset, list[float]] = {}  # per set of nodes left out, its 2 x FINALISTS fastest
    fastest_size: dict[tuple, float] = {}  # per TP size and set of nodes

    def worth_below(t: int, out: frozenset) -> float:
        """The step time past which a layout changes no choice the search makes after it (see KEPT)."""
        of_out = leaders_of.get(out, ())
        if len(leaders) < KEPT or len(of_out) < 2 * FINALISTS or (t, out) not in fastest_size:
            return math.inf
        return max(leaders[-1], of_out[-1], fastest_size[t, out])

    def consider(key: tuple, candidate: Candidate | None) -> None:
        if candidate is not None:
            step = candidate.step_time_s
            found.append((step, key, candidate))
            bisect.insort(leaders, step)
            del leaders[KEPT:]
            if len(key) == 7:
                bisect.insort(of_out := leaders_of.setdefault(key[-1], []), step)
                del of_out[2 * FINALISTS :]
                fastest_size[key[0], key[-1]] = min(step, fastest_size.get((key[0], key[-1]), math.inf))
                if step < fastest.get(key[-1], (math.inf,))[0]:
                    fastest[key[-1]] = (step, key)

    rates = cut_levels({d.rate for d in cluster.usable if d.rate > 1.0})
    work = step_flop(model)
    for out in weaker_nodes(cluster):
        # A step takes at least the work over the speed of the GPUs left: a set of nodes left
        # out that cannot come within SET_REACH of the best so far even so is not searched.
        speed = sum([cluster.speed(d, model.mfu) for d in cluster.usable if d.node not in out])
        if leaders and work > speed * leaders[0] * SET_REACH:
            continue
        before = len(found)
        for t in tp_degrees(cluster, model):
            for S in stage_counts(model.layers, len(groups(t, "apart", math.inf, out)[0])):
                for how in FIRST_ARRANGEMENTS:
                    try_layout((t, S, how, None, "apart", math.inf, out))
        if len(found) == before:  # nothing fits as is: stragglers' own groups, or GPUs past a rate, may not
            for t in tp_degrees(cluster, model):
                for split, cut in [("blind", math.inf)] + [(s, c) for c in rates for s in ("apart", "blind")]:
                    for S in stage_counts(model.layers, len(groups(t, split, cut, out)[0])):
                        try_layout((t, S, "rows", None, split, cut, out))
    set_best: dict[frozenset, float] = {}
    for step, key, _ in found:
        set_best[key[-1]] = min(step, set_best.get(key[-1], math.inf))
    top = min(set_best.values(), default=math.inf)
    behind = {out for out, step in set_best.items() if step > top * SET_REACH}

    def ahead(entries: list) -> list:
        """Entries of the sets of nodes within SET_REACH of the best after round one."""
        return [e for e in entries if e[1][-1] not in behind]

    # Round two: the depths between round one's, around the best layouts, and an odd pipeline
    # (near the best of the other TP sizes too, SIZE_BAND).
    best_layouts = ahead(finalists(found, FINALISTS, FINALISTS))
    for reach, entries in ((3, best_layouts), (1, ahead(other_sizes(found, best_layouts)))):
        for _, (t, S, how, _, split, cut, out), _ in entries:
            for depth in range(max(1, S - reach), S + reach + 1):
                for odd in ODD_PIPELINES:
                    try_layout((t, depth, how, odd, split, cut, out))
    # Round three: removal cuts and the other groupings for the best layouts (and the cuts for
    # the best of the other TP sizes).
    networks = len(cluster.nic_order) > 1
    splits = [sp for sp in GROUPINGS if networks or sp != "narrowed"]  # one network: narrowed is apart
    best_layouts = ahead(finalists(found, 2 * FINALISTS, 2 * FINALISTS))
    for groupings, entries in (
        (GROUPINGS, best_layouts),
        (("apart", "blind"), ahead(other_sizes(found, best_layouts))),
    ):
        for _, (t, S, how, odd, _, _, out), candidate in entries:
            for split in groupings:
                for cut in rates + [math.inf]:
                    if split != "narrowed":
                        try_layout((t, S, how, odd, split, cut, out))
                    elif networks and model.tp_divides(2 * t):  # as many pipelines, wider on the fastest network
                        count = len(candidate.costs)
                        wider = len(groups(2 * t, split, cut, out)[0])
                        try_layout((2 * t, max(1, round(wider / count)), how, odd, split, cut, out))
    # Round four: from the best layouts, one coordinate at a time (depth, odd pipeline, cut,
    # grouping, TP size, arrangement) until none improves: a removal cut can make another depth best.
    cuts = rates + [math.inf]
    head = model.head_flops / model.block_flops  # the LM head's time, in blocks

    for start_step, key, _ in ahead(climb_starts(found)):
        if start_step > leaders[0] * CLIMB_REACH:  # by now too far behind to climb past the best
            continue
        t, _, _, _, split, cut, out = key
        count = len(groups(t, split, cut, out)[0])
        sweep = set(stage_counts(model.layers, count))  # every depth at first, and the block depths
        blocky = set(block_depths(model.layers, count, head))  # all that deep, or dealt evenly
        while True:
            t, S, how, odd, split, cut, out = key
            before = fastest.get(out, (math.inf,))[0]  # a climb beats its own set of nodes' best, not every set's
            for depth in sorted(sweep | blocky | set(range(max(1, S - 3), S + 4))):
                near = abs(depth - S) <= 3
                for h in ARRANGEMENTS:  # another arrangement may be best at another depth
                    for o in ODD_PIPELINES if near else (None, 0) if depth in blocky else (None,):
                        try_layout((t, depth, h, o, split, cut, out))
            sweep = blocky = set()  # then those near the depth reached
            at = cuts.index(cut) if cut in cuts else len(cuts) - 1
            for c in {cuts[max(0, at - 1)], cut, cuts[min(len(cuts) - 1, at + 1)], math.inf}:  # the next cuts
                for sp in splits:
                    try_layout((t, S, how, odd, sp, c, out))
            for size in tp_degrees(cluster, model):
                try_layout((size, S, how, odd, split, cut, out))
            for h in ARRANGEMENTS:
                try_layout((t, S, h, odd, split, cut, out))
            step, best_key = fastest.get(out, (math.inf, None))
            if step >= before * (1 - CLIMB_MIN_GAIN) or best_key in (key, None):
                break
            key = best_key
    # The best layouts split at every common network crossing, not only the median one.
    for _, key, _ in finalists(found, 2 * FINALISTS, 1):
        if not (deadline is not None and deadline.passed()):
            t, S, how, odd, split, cut, out = key
            pipelines, removed = arranged(t, S, how, odd, split, cut, out)
            consider(key, _layout(cluster, model, pipelines, removed, every_crossing=True))
    for name, baseline in (("uniform", baselines.uniform), ("drop", baselines.drop)):  # budget or not
        consider((name,), baseline(cluster, model))
    # Local search starts from the best layout of each TP size and set of nodes, best first: hills
    # apart, rather than the same hill's best few.
    # (A baseline's key is its name alone: a size of its own.)
    kept = sorted(found, key=lambda f: f[0])[:KEPT]
    ranked = [c for _, _, c in size_bests(found, math.inf)] + [c for _, _, c in kept]
    budget = max(POLISH_STAGES[0], POLISH_STAGES[1] * len(cluster.usable))
    polished = polish(ranked, cluster, model, budget, POLISH_STARTS, deadline) if ranked else None
    if polished is not None:
        found.append((polished.step_time_s, ("polished",), polished))
    if not found:
        raise PlanError(
            "no-feasible-plan",
            f"no plan for model {model.name!r} on cluster {cluster.name!r} keeps "
            f"every device's memory within 0.9 x its size (with at most "
            f"M={model.micro_batches} pipelines of at most L={model.layers} stages)",
        )
    best = min(found, key=lambda f: f[0])[2]
    # Compiled (planner/compiled.py), the inner functions and the scope they share hold each other:
    # let go, the search's layouts are freed now, not by a pass of the collector (30 ms at 64 GPUs).
    groups = in_order_of = arranged = try_layout = worth_below = consider = ahead = None  # noqa: F811, F841
    refined = refine(best, cluster, model, refine_evals(len(cluster.usable)), deadline)
    stages = max(RELOCATE_STAGES[0], RELOCATE_STAGES[1] * len(cluster.usable))
    return settle(relocate(refined, cluster, model, stages, deadline), cluster, model, SETTLE_EVALS, deadline)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a search: it allocates hundreds of thousands of
    short-lived tuples and lists, which reference counting frees as they go, and the collector's
    passes over them took 7% of planning at 64 GPUs. The few left in cycles wait for its next
    pass (peak memory at 1,024 GPUs is the same)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


STRATEGIES = {
    "drover": search,
    "uniform": baselines.uniform,
    "drop": baselines.drop,
}


def make_plan(cluster: Cluster, model: ModelSpec, strategy: str = "drover", budget_s: float | None = None) -> Plan:
    """The plan of a strategy, with the cost model's predicted figures. `budget_s` cuts
    Drover's search short after that many seconds, with the best plan found by then (the
    baselines take none)."""
    if strategy not in STRATEGIES:
        raise PlanError("unknown-strategy", f"strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    if strategy == "drover":
        with collector_paused():
            candidate = search(cluster, model, None if budget_s is None else Deadline.after(budget_s))
            # The search's memos let go before the collector runs again: its first pass went
            # over them (10 ms at 64 GPUs, against 3.5 ms to free them).
            cluster.forget_memos()
    else:
        candidate = STRATEGIES[strategy](cluster, model)
    if candidate is None:
        raise PlanError(
            "no-feasible-plan",
            f"strategy {strategy!r} finds no plan that fits for model {model.name!r} on cluster {cluster.name!r}",
        )
    return candidate.to_plan(strategy, cluster, model)
