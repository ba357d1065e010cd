"""A local search's current plan (walk_space's state) and its exact score, updated by changes.

Every candidate is scored exactly: pipeline terms with cost.pipeline_terms, the data-parallel
sync over each run of blocks with the same holders with the formula of cost.dp_sync_s, memory
from cost.stage_memory_bytes, micro-batches by the min-max of assignment.assign_micro_batches with
each pipeline's memory bounding its count. A change re-scores only the pipelines it touches (and
the sync). Plain lists, not numpy: a state holds a few to a few hundred pipelines, where numpy's
cost per call outweighed its loops (0.19 s for 1,000 moves at 64 GPUs on InfiniBand + Ethernet,
0.11 s with lists).
"""

from __future__ import annotations

import math

from .assignment import assign_micro_batches
from .errors import PlanError
from .model import ModelSpec
from .plan import Pipeline, Plan, Stage
from .walk_space import REL, Change, Pipe, Space


def assign(F: list[float], E: list[float], C: list[int], M: int) -> list[int] | None:
    """Micro-batches minimising max F + (m - 1) * E with 1 <= m <= C, summing to M
    (assign_micro_batches's min-max, with each pipeline's memory bound)."""
    D = len(F)
    if D == 0 or D > M or sum([min(c, M) for c in C]) < M:
        return None
    inv = [1.0 / e for e in E]
    finish = (M - D + math.fsum([f * i for f, i in zip(F, inv)])) / math.fsum(inv)
    counts = [max(1, math.floor((finish - f) * i) + 1) for f, i in zip(F, inv)]
    rest = M - sum(counts)
    done = rest == 0
    if 0 < rest <= D:  # the `rest` earliest next finishes, unless one pipeline deserves two
        nxt = [f + c * e for f, c, e in zip(F, counts, E)]
        earliest = sorted(range(D), key=nxt.__getitem__)[:rest]
        last = max([nxt[p] for p in earliest])
        if not any([nxt[p] + E[p] < last for p in earliest]):
            for p in earliest:
                counts[p] += 1
            done = True
    if not done:
        counts = assign_micro_batches(F, E, M)
    if all([c <= cap for c, cap in zip(counts, C)]):
        return counts
    return assign_micro_batches(F, E, M, C)


class State:
    """The current plan of the search and its exact score."""

    def __init__(self, sp: Space, pipes: list[Pipe], removed: set[str]):
        self.sp = sp
        self.pipes = list(pipes)
        self.removed = set(removed)
        infos = [sp.info(p) for p in self.pipes]
        if any(i is None for i in infos):
            raise PlanError("out-of-memory", "a start plan does not fit")
        self.F, self.E, self.C = (list(x) for x in zip(*infos))
        scored = self._score(self.F, self.E, self.C, sp.dp.time_s(self.pipes))
        if scored is None:
            raise PlanError("no-feasible-plan", "a start plan has no micro-batch assignment")
        self.step, self.secondary, self.micro = scored
        self._index()

    def _score(self, F, E, C, tdp):
        M = self.sp.M
        micro = assign(F, E, C, M)
        if micro is None:
            return None
        step = max([f + (m - 1) * e for f, m, e in zip(F, micro, E)]) + tdp
        inv = [1.0 / e for e in E]
        relaxed = (M - len(F) + math.fsum([f * i for f, i in zip(F, inv)])) / math.fsum(inv) + tdp
        return step, relaxed, micro

    def _index(self) -> None:
        """Where each device is, for the moves."""
        self.where: dict[str, tuple[int, int]] = {}
        self.on_node: dict[int, list[tuple[int, int]]] = {}
        for p, pipe in enumerate(self.pipes):
            for k, g in enumerate(pipe.groups):
                self.on_node.setdefault(g.node, []).append((p, k))
                for d in g.devices:
                    self.where[d] = (p, k)
        self.removed_on: dict[int, list[str]] = {}
        for d in sorted(self.removed, key=lambda d: (self.sp.dev[d].node, self.sp.dev[d].index)):
            self.removed_on.setdefault(self.sp.dev[d].node, []).append(d)
        finish = [f + (m - 1) * e for f, m, e in zip(self.F, self.micro, self.E)]
        last = max(finish) * (1 - 1e-9)
        self.critical = [p for p, t in enumerate(finish) if t >= last]

    def evaluate(self, change: Change, commit: bool = False):
        """(step, secondary) of the state after the change, or None if it is infeasible.
        With commit, the change is applied (only call with commit for a feasible change)."""
        sp = self.sp
        F, E, C = list(self.F), list(self.E), list(self.C)
        for i, new in change.replace.items():
            if new is not None:
                inf = sp.info(new)
                if inf is None:
                    return None
                F[i], E[i], C[i] = inf
        for new in change.add:
            inf = sp.info(new)
            if inf is None:
                return None
            F.append(inf[0])
            E.append(inf[1])
            C.append(inf[2])
        deleted = {i for i, new in change.replace.items() if new is None}
        if deleted:
            keep = [i for i in range(len(F)) if i not in deleted]
            F, E, C = [F[i] for i in keep], [E[i] for i in keep], [C[i] for i in keep]
        D = len(F)
        if D == 0 or D > sp.M:
            return None
        pipes = list(self.pipes)
        for i, new in change.replace.items():
            pipes[i] = new
        pipes = [p for p in pipes if p is not None] + list(change.add)
        scored = self._score(F, E, C, sp.dp.time_s(pipes))
        if commit and scored is not None:
            self.pipes = pipes
            self.F, self.E, self.C = F, E, C
            self.removed = (self.removed - change.unremove) | change.remove
            self.step, self.secondary, self.micro = scored
            self._index()
        return None if scored is None else scored[:2]

    def better(self, scored) -> bool:
        step, sec = scored
        if step < self.step * (1 - REL):
            return True
        return step <= self.step * (1 + REL) and sec < self.secondary * (1 - REL)

    def snapshot(self):
        return list(self.pipes), set(self.removed)

    def to_plan(self, model: ModelSpec, strategy: str = "reference") -> Plan:
        pipelines = tuple(
            Pipeline(
                m,
                tuple(Stage(g.devices, (p.bounds[k], p.bounds[k + 1])) for k, g in enumerate(p.groups)),
            )
            for p, m in zip(self.pipes, self.micro)
        )
        return Plan(strategy, model.global_batch, model.micro_batch, pipelines, tuple(sorted(self.removed)))


def state_from_plan(sp: Space, plan: Plan) -> State:
    pipes = []
    for p in plan.pipelines:
        groups = tuple(sp.group(s.devices) for s in p.stages)
        bounds = (0,) + tuple(s.layers[1] for s in p.stages)
        pipes.append(Pipe(groups, bounds))
    return State(sp, pipes, set(plan.removed))
