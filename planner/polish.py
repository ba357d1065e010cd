"""Local search from the search's best layouts: moves the three phases cannot make.

The phases build plans from rules (stragglers grouped apart, groups dealt into
pipelines, the fastest first); the cost model then judges them. Some better
plans are one or two edits away from what the rules build: the strongest group
last, where the LM head is; a healthy GPU left idle because another pipeline
or a wider TP group costs more than it brings; a group split in two stages or
two merged. `polish` tries such edits
on a layout, the kinds of edit taking turns, keeps each that lowers the step
time, and stops when none does or its budget of stages scored is spent (so
planning time stays bounded at 1,024 GPUs). Blocks are re-split by
orchestration's partition after each edit of the groups; single blocks are
moved later, by the closing descent (walk.refine).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from .assignment import assign_micro_batches
from .candidate import Candidate, best_partition, score
from .cluster import Cluster
from .cost import StageCost, fits_memory, most_micro_batches, new_stage
from .grouping import Group, group_of
from .model import ModelSpec
from .orchestration import partition_layers, step_floor

Pipelines = tuple[tuple[Group, ...], ...]
SIGNATURE_SHARE = 8  # a layout's signature costs about this fraction of scoring it (one stage at least)
# An edit its floors drop costs about this fraction of scoring it (orchestration.step_floor: 0.12
# ms an edit against 0.72 ms scored, generated scenario 73 of seed 0), and is charged so (one
# stage at least: small layouts' edits cost time too).
FLOOR_SHARE = 8
NEIGHBOURS = 4  # layouts next to the best hill top that local search climbs from again
# Stages a GPU that the wider search (wider_starts) may score, of what is left: 800 on 8 GPUs.
# On 800 random cases of up to 8 GPUs (tests/planner/optimum_cases.py, seeds 1000 to 1799),
# Drover's plan fell more than 1% short of the exact optimum on 10 with it and 12 without (0.83
# and 0.95 of it, now within 1%), planning 30% longer; with all that is left, on 9, 5 times as long.
WIDER_STAGES = 100


@dataclass(frozen=True)
class Layout:
    pipelines: Pipelines
    removed: tuple[str, ...]


class Polisher:
    def __init__(self, cluster: Cluster, model: ModelSpec, stages: int, deadline=None):
        self.cluster, self.model = cluster, model
        self.left = stages  # of layouts scored: a layout costs about its number of stages
        self.deadline = deadline  # search.Deadline: past it, no evaluations are left
        self.devices = cluster.device_by_id
        self.seen: dict[Layout, Candidate | None] = {}
        self.alike: dict[tuple, float] = {}  # step time by signature (inf: nothing fits)
        # per node, what its links and network order depend on
        self._links = [(p, n.intra_bw, n.nic_class) for p, n in zip(cluster.network_profiles, cluster.nodes)]

    def group(self, ids) -> Group:
        """The group of these devices (one node), cached by its members."""
        return group_of(self.cluster, self.model, tuple(sorted(ids, key=lambda d: self.devices[d].index)))

    def evaluate(self, layout: Layout, signature: tuple | None = None, bound: float = math.inf) -> Candidate | None:
        """The layout scored (cached); `signature`, if the caller has it, spares working it out.
        None, without scoring it, if it cannot beat `bound` (orchestration.step_floor; an edit
        beats it by 1e-9 of it, far past rounding): a FLOOR_SHARE of its stages is spent, and its
        signature is known to score that floor at least."""
        if layout not in self.seen and bound < math.inf and len(layout.pipelines) <= self.model.micro_batches:
            # memory with one micro-batch in flight: an aligned split may fit only so
            floor = step_floor(layout.pipelines, self.model, self.cluster, in_flight=1)
            if floor is not None and floor > bound:
                signature = self.signature(layout) if signature is None else signature
                self.alike[signature] = max(floor, self.alike.get(signature, 0.0))
                self._spend(max(1, sum(map(len, layout.pipelines)) // FLOOR_SHARE))
                return None
        if layout not in self.seen:
            found = self.seen[layout] = _candidate(layout, self.cluster, self.model)
            signature = self.signature(layout) if signature is None else signature
            self.alike[signature] = math.inf if found is None else found.step_time_s
            self._spend(sum(map(len, layout.pipelines)))
        return self.seen[layout]

    def signature(self, layout: Layout) -> tuple:
        """What a layout's step time depends on: its pipelines (in an order of their own, but the
        first of each depth, which sets the aligned split) as kinds of group on nodes named by
        first appearance, each with what its links depend on. Edits alike (one stage moved in any
        of many alike pipelines, a GPU swapped for any of its node's alike GPUs) sign alike."""
        links = self._links
        shapes = [tuple([(g.kind, links[g.node]) for g in pipe]) for pipe in layout.pipelines]
        order = sorted(range(len(shapes)), key=shapes.__getitem__)
        names: dict[int, int] = {}
        rows = []
        for p in order:
            rows.append(
                tuple([(g.kind, links[g.node], names.setdefault(g.node, len(names))) for g in layout.pipelines[p]])
            )
        place = {p: i for i, p in enumerate(order)}
        firsts: dict[int, int] = {}
        for p, pipe in enumerate(layout.pipelines):
            firsts.setdefault(len(pipe), place[p])
        return tuple(rows), tuple(sorted(firsts.items()))

    def known_alike(self, layout: Layout) -> tuple[float | None, tuple]:
        """(the step time of a layout alike already scored, or None; the layout's signature), at
        a fraction of the cost of scoring it."""
        signature = self.signature(layout)
        self._spend(max(1, sum(map(len, layout.pipelines)) // SIGNATURE_SHARE))
        return self.alike.get(signature), signature

    def _spend(self, stages: int) -> None:
        """A layout's stages off the budget; none left once past the deadline."""
        self.left -= stages
        if self.deadline is not None and self.deadline.passed():
            self.left = 0

    def at_every_crossing(self, layout: Layout, candidate: Candidate) -> Candidate:
        """A hill top split at every common network crossing too, not only the median one
        (its stages off the budget; not past the deadline)."""
        if self.deadline is not None and self.deadline.passed():
            return candidate
        other = _candidate(layout, self.cluster, self.model, every_crossing=True)
        self._spend(sum(map(len, layout.pipelines)))
        return other if other is not None and other.step_time_s < candidate.step_time_s else candidate

    # -- edits of the groups --------------------------------------------------------

    def edits(self, layout: Layout) -> Iterator[Layout]:
        """Every edit of every kind, the kinds taking turns: with a budget far below the edits
        of one layout, each kind is tried early instead of the first kind's hundreds."""
        turns = [kind(layout) for kind in self.kinds()]
        while turns:
            left = []
            for edits in turns:
                edit = next(edits, None)
                if edit is not None:
                    yield edit
                    left.append(edits)
            turns = left

    def kinds(self) -> list:
        # Left out, as they never improved a climb of 40 generated scenarios (seed 4) and took a
        # third of the budget: a node left idle, a stage as a pipeline of its own or moved to
        # another, one more pipeline of idle GPUs. Without them 7 of 120 scenarios (seeds 2
        # and 3) plan up to 0.8% faster and one 0.16% slower. GPUs out of their group come last.
        return [
            self._reorders,
            self._idle_groups,
            self._idle_pipelines,
            self._regroupings,
            self._splits_and_merges,
            self._restores,
            self._whole_groups,
            self._swaps_across,
            self._joins,
            self._leaves,
        ]

    def _reorders(self, layout: Layout) -> Iterator[Layout]:
        """A stage one place on, or to either end: the LM head's stage and the embedding's matter."""
        for p, pipe in enumerate(layout.pipelines):
            for i in range(len(pipe)):
                for j in range(len(pipe)):
                    if i != j and (abs(i - j) == 1 or j in (0, len(pipe) - 1)):
                        order = list(pipe)
                        order.insert(j, order.pop(i))
                        yield _with(layout, p, tuple(order))

    def _idle_groups(self, layout: Layout) -> Iterator[Layout]:
        """A group left idle."""
        pipes, removed = layout.pipelines, layout.removed
        for p, pipe in enumerate(pipes):
            for i, g in enumerate(pipe):
                rest = pipe[:i] + pipe[i + 1 :]
                if rest:
                    yield _with(layout, p, rest, removed=removed + g.devices)
                elif len(pipes) > 1:
                    yield Layout(pipes[:p] + pipes[p + 1 :], removed + g.devices)

    def _leaves(self, layout: Layout) -> Iterator[Layout]:
        """A GPU leaves its group and stays idle (a straggler out of a group that waits for it)."""
        pipes, valid = layout.pipelines, self.model.tp_divides
        for p, pipe in enumerate(pipes):
            for i, g in enumerate(pipe):
                if g.t > 1 and valid(g.t - 1):
                    for d in g.devices:
                        rest = self.group(tuple(x for x in g.devices if x != d))
                        yield Layout(_regroup(pipes, (p, i, rest)), layout.removed + (d,))

    def _idle_pipelines(self, layout: Layout) -> Iterator[Layout]:
        """A pipeline left idle."""
        pipes, removed = layout.pipelines, layout.removed
        if len(pipes) > 1:
            for p, pipe in enumerate(pipes):
                yield Layout(pipes[:p] + pipes[p + 1 :], removed + tuple(d for g in pipe for d in g.devices))

    def _splits_and_merges(self, layout: Layout) -> Iterator[Layout]:
        """Two neighbouring stages in one group; a group in two stages (an idle GPU of its node
        may join either); or TP halved in a whole pipeline (data parallelism doubled). Merges
        first: they are few, and a climb takes the first edit that helps."""
        pipes, removed, valid = layout.pipelines, layout.removed, self.model.tp_divides
        for p, pipe in enumerate(pipes):
            for i in range(len(pipe) - 1):
                a, b = pipe[i], pipe[i + 1]
                if a.node == b.node and valid(a.t + b.t):
                    yield _with(layout, p, pipe[:i] + (self.group(a.devices + b.devices),) + pipe[i + 2 :])
        for p, pipe in enumerate(pipes):
            for i, g in enumerate(pipe):
                by_speed = sorted(g.devices, key=lambda d: (self.devices[d].rate, self.devices[d].index))
                idle = [d for d in removed if self.devices[d].node == g.node]
                for a in range(1, g.t):
                    if not (valid(a) and valid(g.t - a)):
                        continue
                    for first, second, rest in self._halves(by_speed[:a], by_speed[a:], idle, removed):
                        yield Layout(_replace(pipes, p, pipe[:i] + (first, second) + pipe[i + 1 :]), rest)
                        yield Layout(_replace(pipes, p, pipe[:i] + (second, first) + pipe[i + 1 :]), rest)
            if all(g.t % 2 == 0 and valid(g.t // 2) for g in pipe):
                halves = (
                    [self.group(g.devices[: g.t // 2]) for g in pipe],
                    [self.group(g.devices[g.t // 2 :]) for g in pipe],
                )
                yield Layout(_replace(pipes, p, tuple(halves[0])) + (tuple(halves[1]),), removed)

    def _restores(self, layout: Layout) -> Iterator[Layout]:
        """An idle GPU back: in a group of its node, or a stage of its own."""
        pipes, removed, valid = layout.pipelines, layout.removed, self.model.tp_divides
        for d in removed:
            node = self.devices[d].node
            rest = tuple(x for x in removed if x != d)
            for p, pipe in enumerate(pipes):
                for i, g in enumerate(pipe):
                    if g.node == node and valid(g.t + 1):
                        yield Layout(
                            _replace(pipes, p, pipe[:i] + (self.group(g.devices + (d,)),) + pipe[i + 1 :]), rest
                        )
                yield Layout(_replace(pipes, p, pipe + (self.group((d,)),)), rest)
                yield Layout(_replace(pipes, p, (self.group((d,)),) + pipe), rest)
            yield Layout(pipes + ((self.group((d,)),),), rest)

    def _swaps_across(self, layout: Layout) -> Iterator[Layout]:
        """Two groups unlike in size, speed or network trade places between pipelines; with
        another pipeline of the same kinds of group in the same order, once (the same costs)."""
        pipes = layout.pipelines
        kind = {g: (g.t, g.speed, self.cluster.nodes[g.node].nic_class) for pipe in pipes for g in pipe}
        shape = [tuple(kind[g] for g in pipe) for pipe in pipes]
        for p, first in enumerate(pipes):
            tried = set()
            for q in range(p + 1, len(pipes)):
                for i, a in enumerate(first):
                    for j, b in enumerate(pipes[q]):
                        if kind[a] != kind[b] and (i, j, shape[q]) not in tried:
                            tried.add((i, j, shape[q]))
                            yield Layout(_regroup(pipes, (p, i, b), (q, j, a)), layout.removed)

    def relocations(self, layout: Layout) -> Iterator[Layout]:
        """A straggler's group trades places with a healthy group of the same TP size and network
        in another pipeline: where its blocks fit that pipeline's pace and network crossings."""
        pipes, nodes = layout.pipelines, self.cluster.nodes
        for p, pipe in enumerate(pipes):
            for i, a in enumerate(pipe):
                if a.rate > 1.0:
                    for q, other in enumerate(pipes):
                        for j, b in enumerate(other):
                            if (
                                q != p
                                and b.rate == 1.0
                                and b.t == a.t
                                and nodes[b.node].nic_class == nodes[a.node].nic_class
                            ):
                                yield Layout(_regroup(pipes, (p, i, b), (q, j, a)), layout.removed)

    def _joins(self, layout: Layout) -> Iterator[Layout]:
        """Two pipelines as one twice as deep (either first): fewer replicas to sync."""
        pipes = layout.pipelines
        for p, first in enumerate(pipes):
            for q, second in enumerate(pipes):
                if p != q and len(first) + len(second) <= self.model.layers:
                    joined = _replace(_replace(pipes, q, ()), p, first + second)
                    yield Layout(tuple(pipe for pipe in joined if pipe), layout.removed)

    def _halves(self, first: list[str], second: list[str], idle: list[str], removed: tuple[str, ...]):
        """A group's two halves, and the same with one idle GPU of its node joining either."""
        valid = self.model.tp_divides
        yield self.group(first), self.group(second), removed
        for d in idle:
            rest = tuple(x for x in removed if x != d)
            if valid(len(first) + 1):
                yield self.group([*first, d]), self.group(second), rest
            if valid(len(second) + 1):
                yield self.group(first), self.group([*second, d]), rest

    def _regroupings(self, layout: Layout) -> Iterator[Layout]:
        """One GPU from a group to another group of its node (4 + 2 -> 3 + 3), or the two swap
        places (a straggler joins the other straggler's group)."""
        pipes, valid = layout.pipelines, self.model.tp_divides
        places = [(p, i, g) for p, pipe in enumerate(pipes) for i, g in enumerate(pipe)]
        for p, i, a in places:  # a member and an idle GPU of its node change places
            for d in a.devices:
                for e in layout.removed:
                    if self.devices[e].node == a.node and self.devices[e].rate != self.devices[d].rate:
                        swapped = self.group(tuple(x for x in a.devices if x != d) + (e,))
                        rest = tuple(x for x in layout.removed if x != e) + (d,)
                        yield Layout(_regroup(pipes, (p, i, swapped)), rest)
        for p, i, a in places:
            for q, j, b in places:
                if a.node != b.node or (p, i) >= (q, j):
                    continue
                for d in a.devices:
                    if a.t > 1 and valid(a.t - 1) and valid(b.t + 1):
                        rest = tuple(x for x in a.devices if x != d)
                        yield Layout(
                            _regroup(pipes, (p, i, self.group(rest)), (q, j, self.group(b.devices + (d,)))),
                            layout.removed,
                        )
                    for e in b.devices:
                        if self.devices[d].rate != self.devices[e].rate:
                            ga = self.group(tuple(x for x in a.devices if x != d) + (e,))
                            gb = self.group(tuple(x for x in b.devices if x != e) + (d,))
                            yield Layout(_regroup(pipes, (p, i, ga), (q, j, gb)), layout.removed)
                for e in b.devices:
                    if b.t > 1 and valid(b.t - 1) and valid(a.t + 1):
                        rest = tuple(x for x in b.devices if x != e)
                        yield Layout(
                            _regroup(pipes, (p, i, self.group(a.devices + (e,))), (q, j, self.group(rest))),
                            layout.removed,
                        )

    def _whole_groups(self, layout: Layout) -> Iterator[Layout]:
        """Edits by whole groups: two groups of a node anywhere merged into one, in the place of
        either (two single-stage pipelines as one wider group); one node alone, as one group of
        each valid width or as many pipelines of that width as it has GPUs for, or one fewer (a
        small model whose gradients sync within a node); and a node's idle GPUs back as one
        group as wide as the model allows: a stage before or after each pipeline, or a pipeline
        of its own."""
        pipes, removed, valid = layout.pipelines, layout.removed, self.model.tp_divides
        places = [(p, i, g) for p, pipe in enumerate(pipes) for i, g in enumerate(pipe)]
        for p, i, a in places:  # the merged group in the place of either
            for q, j, b in places:
                if a.node == b.node and (p, i) != (q, j) and valid(a.t + b.t) and not (p == q and abs(j - i) == 1):
                    out = [list(pipe) for pipe in pipes]
                    out[p][i] = self.group(a.devices + b.devices)
                    del out[q][j]
                    yield Layout(tuple(tuple(pipe) for pipe in out if pipe), removed)
        usable: dict[int, list[str]] = {}  # a node alone: where links cost most
        for d in self.cluster.usable:
            usable.setdefault(d.node, []).append(d.id)
        for ids in usable.values():
            ids.sort(key=lambda d: (self.devices[d].rate, self.devices[d].index))
            for width in (t for t in range(1, len(ids) + 1) if valid(t)):
                # as wide as it goes, and as many pipelines of that width as it has GPUs for, or
                # one fewer (the slowest GPUs idle: a straggler's group would hold back the rest)
                count = min(len(ids) // width, self.model.micro_batches)
                for alone in sorted({1, max(1, count - 1), count}):
                    groups = [self.group(ids[i * width : (i + 1) * width]) for i in range(alone)]
                    used = {d for g in groups for d in g.devices}
                    rest = tuple(d.id for d in self.cluster.usable if d.id not in used)
                    yield Layout(tuple((g,) for g in groups), rest)
        idle: dict[int, list[str]] = {}
        for d in removed:
            idle.setdefault(self.devices[d].node, []).append(d)
        for ids in idle.values():
            ids.sort(key=lambda d: (self.devices[d].rate, self.devices[d].index))
            for width in (t for t in range(2, len(ids) + 1) if valid(t)):  # one GPU back: the edits above
                g, rest = self.group(ids[:width]), tuple(d for d in removed if d not in ids[:width])
                for p, pipe in enumerate(pipes):
                    yield Layout(_replace(pipes, p, pipe + (g,)), rest)
                    yield Layout(_replace(pipes, p, (g,) + pipe), rest)
                yield Layout(pipes + ((g,),), rest)

    def climb(self, layout: Layout) -> tuple[Layout, Candidate | None]:
        best = self.evaluate(layout)
        improved = best is not None
        while improved and self.left > 0:
            improved = False
            layout, best = self.weakest_first(layout, best)
            for edit in self.edits(layout):
                if self.left <= 0:
                    break
                signature = None
                if edit not in self.seen:  # else the cache answers
                    known, signature = self.known_alike(edit)
                    if known is not None and known >= best.step_time_s * (1 - 1e-9):
                        continue  # alike one no faster
                found = self.evaluate(edit, signature, best.step_time_s)
                if found is not None and found.step_time_s < best.step_time_s * (1 - 1e-9):
                    layout, best, improved = edit, found, True
                    break
        return layout, best

    def weakest_first(self, layout: Layout, found: Candidate) -> tuple[Layout, Candidate]:
        """The layout with its pipelines weakest first (fewest micro-batches), if that scores as
        well: edits go through pipelines in order, and the budget may end before the last."""
        order = sorted(range(len(layout.pipelines)), key=lambda p: found.micro_batches[p])
        if order == sorted(order):
            return layout, found
        turned = Layout(tuple(layout.pipelines[p] for p in order), layout.removed)
        again = self.evaluate(turned)
        if again is not None and again.step_time_s <= found.step_time_s * (1 + 1e-9):
            return turned, again
        return layout, found


def _with(layout: Layout, p: int, pipe: tuple[Group, ...], removed: tuple[str, ...] | None = None) -> Layout:
    return Layout(_replace(layout.pipelines, p, pipe), layout.removed if removed is None else removed)


def _regroup(pipes: Pipelines, *changes: tuple[int, int, Group]) -> Pipelines:
    out = [list(pipe) for pipe in pipes]
    for p, i, g in changes:
        out[p][i] = g
    return tuple(tuple(pipe) for pipe in out)


def _replace(pipes: Pipelines, p: int, pipe: tuple[Group, ...]) -> Pipelines:
    return pipes[:p] + (pipe,) + pipes[p + 1 :]


def _candidate(layout: Layout, cluster: Cluster, model: ModelSpec, every_crossing: bool = False) -> Candidate | None:
    """A layout scored with its blocks partitioned, split at the median common network
    crossing (at every one if `every_crossing`), or aligned across pipelines: the fastest."""
    if not layout.pipelines or len(layout.pipelines) > model.micro_batches:
        return None
    pipes = [list(p) for p in layout.pipelines]
    devices = [[g.devices for g in pipe] for pipe in layout.pipelines]
    costs = partition_layers(pipes, model, cluster)
    if costs is not None:  # fits whatever each pipeline's share of the micro-batches
        found = best_partition(pipes, costs, list(layout.removed), model, cluster, every_crossing)
        aligned = _aligned(costs, model)
        if aligned is not None:  # replicas of a block on the same stage index sync cheaper
            bound = math.inf if found is None else found.step_time_s  # past it, no faster: not synced
            other = score(devices, aligned, list(layout.removed), model, cluster, bound=bound)
            faster = other is not None and (found is None or other.step_time_s < found.step_time_s)
            if faster and fits_memory(other.costs, other.micro_batches, model):
                return other
        return found
    return with_few_in_flight(pipes, list(layout.removed), cluster, model)


def with_few_in_flight(pipes: list[list[Group]], removed: list[str], cluster: Cluster, model: ModelSpec):
    """A layout that fits only if some pipelines get few micro-batches: a small GPU may hold its
    stage then. Blocks split for one in flight, then micro-batches under each pipeline's cap."""
    devices = [[g.devices for g in pipe] for pipe in pipes]
    costs = partition_layers(pipes, model, cluster, in_flight=1)
    if costs is None:
        return None
    caps = [most_micro_batches(row, model) for row in costs]
    if min(caps) < 1:
        return None
    micro = assign_micro_batches([f for f, _ in costs.terms], [e for _, e in costs.terms], model.micro_batches, caps)
    return None if micro is None else score(devices, costs, removed, model, cluster, micro)


def _aligned(costs: list[list[StageCost]], model: ModelSpec) -> list[list[StageCost]] | None:
    """Every pipeline split at the block boundaries of the first pipeline as deep as it; None if
    that changes nothing."""
    bounds: dict[int, list[tuple[int, int]]] = {}
    out, changed = [], False
    for row in costs:
        ranges = bounds.setdefault(len(row), [(c.start, c.end) for c in row])
        changed |= ranges != [(c.start, c.end) for c in row]
        out.append([new_stage(StageCost, (c.node, c.t, c.speed, c.memory, a, b)) for c, (a, b) in zip(row, ranges)])
    return out if changed else None


def layout_of(candidate: Candidate, polisher: Polisher) -> Layout:
    pipes = tuple(tuple(polisher.group(ids) for ids in row) for row in candidate.devices)
    return Layout(pipes, tuple(candidate.removed))


def polish(
    ranked: list[Candidate], cluster: Cluster, model: ModelSpec, stages: int, starts: int, deadline=None
) -> Candidate | None:
    """The best plan local search reaches from the first `starts` distinct layouts of `ranked`
    (best first) within the budget; then, while budget is left, from the best few layouts one
    edit away from the best hill top (a hill next to it may be higher), first of those already
    scored; once no new top comes of them, of every edit of each hill top in turn, best top
    first (see wider_starts)."""
    polisher = Polisher(cluster, model, stages, deadline)
    best, top = None, None
    layouts: dict[Layout, Candidate] = {}
    for candidate in ranked:  # the same layout twice climbs the same hill
        if len(layouts) == starts:
            break
        layouts.setdefault(layout_of(candidate, polisher), candidate)
    climbed: set[Layout] = set()
    peaks: list[tuple[float, int, Layout]] = []  # hill tops reached
    queue, explored, widened = list(layouts), None, set()
    while polisher.left > 0:
        if not queue:  # the starts are climbed: next, the neighbours of the best hill top, best first
            if top is not None and top[0] != explored:
                explored = top[0]
                near = [
                    (c.step_time_s, i, e) for i, e in enumerate(polisher.edits(explored)) if (c := polisher.seen.get(e))
                ]
                queue = [e for _, _, e in sorted(near) if e not in climbed][:NEIGHBOURS]
            else:
                if not widened:  # the wider search's own budget, a share of what is left
                    polisher.left = min(polisher.left, WIDER_STAGES * len(cluster.usable))
                queue = wider_starts(polisher, peaks, widened, climbed)
                if not queue:
                    break
            continue
        start = queue.pop(0)
        climbed.add(start)
        peak, found = polisher.climb(start)
        if found is None:
            continue
        found = polisher.at_every_crossing(peak, found)
        peaks.append((found.step_time_s, len(peaks), peak))
        if top is None or found.step_time_s < top[1].step_time_s * (1 - 1e-9):
            top = (peak, found)
        if best is None or found.step_time_s < best.step_time_s:
            best = found
    for candidate in layouts.values():
        if best is None or candidate.step_time_s < best.step_time_s:
            best = candidate
    return best


def wider_starts(polisher: Polisher, peaks: list, widened: set, climbed: set) -> list[Layout]:
    """Where local search climbs next once the best hill top's scored neighbours lead nowhere
    higher: every unclimbed edit of the best hill top not yet widened, scored (none cut by a
    floor), best first; or of the next top if none is left. Small clusters spent a twentieth of
    their budget before this (8 GPUs: about 160 of 3,500 stages) and stopped at plans two edits
    from the optimum: one pipeline of TP sizes 1, 1, 1, 1, 4 where 1, 1, 2, 2, 2 is 5% faster (a
    group merged, then another split). Large clusters spend their budget before."""
    for _, _, peak in sorted(peaks):
        if peak in widened:
            continue
        widened.add(peak)
        near = []
        for i, edit in enumerate(polisher.edits(peak)):
            if polisher.left <= 0:
                break
            if edit not in climbed and (found := polisher.evaluate(edit)) is not None:
                near.append((found.step_time_s, i, edit))
        if near:
            return [e for _, _, e in sorted(near)]
    return []


def relocate(candidate: Candidate, cluster: Cluster, model: ModelSpec, stages: int, deadline=None) -> Candidate:
    """The plan after a climb by relocations alone (Polisher.relocations, the first that helps
    taken), blocks re-split, within a budget of `stages` scored; the plan itself unless that is
    faster. Local search's budget is spent before it reaches them at 64 GPUs and more: in
    generated scenario 165 of seed 0, a straggler's group 1.68x slow held a block of the pipeline
    of 13 stages, where the others held two, and one 1.5x slow two blocks of Ethernet stages whose
    network crossing the other pipelines did not share; traded with healthy groups, the plan is
    3% faster."""
    polisher = Polisher(cluster, model, stages, deadline)
    layout, best, improved = layout_of(candidate, polisher), candidate, False
    climbing = True
    while climbing and polisher.left > 0:
        climbing = False
        for edit in polisher.relocations(layout):
            if polisher.left <= 0:
                break
            found = polisher.evaluate(edit, None, best.step_time_s)
            if found is not None and found.step_time_s < best.step_time_s * (1 - 1e-9):
                layout, best, improved, climbing = edit, found, True, True
                break
    return polisher.at_every_crossing(layout, best) if improved else best
