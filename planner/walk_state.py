"""A local search's current plan (walk_space's state) and its exact score, updated by changes.

Every candidate is scored exactly: pipeline terms with cost.pipeline_terms, the data-parallel
sync over a matrix of each block's holders with the formula of cost.dp_sync_s, memory from
cost.stage_memory_bytes, micro-batches by the min-max of assignment.assign_micro_batches with
each pipeline's memory bounding its count. A change re-scores only the pipelines it touches.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .assignment import assign_micro_batches
from .errors import PlanError
from .model import ModelSpec
from .plan import Pipeline, Plan, Stage
from .walk_space import REL, Change, Pipe, Space


def _sum(x: np.ndarray) -> float:
    """Exactly rounded: numpy's pairwise sums can differ in the last bit with the
    arrays' alignment in memory, which would make runs depend on the process's history."""
    return math.fsum(x.tolist())


def assign(F: np.ndarray, E: np.ndarray, C: np.ndarray, M: int) -> np.ndarray | None:
    """Micro-batches minimising max F + (m - 1) * E with 1 <= m <= C, summing to M
    (assign_micro_batches's min-max, with each pipeline's memory bound)."""
    D = len(F)
    if D == 0 or D > M or int(np.minimum(C, M).sum()) < M:
        return None
    inv = 1.0 / E
    finish = (M - D + _sum(F * inv)) / _sum(inv)
    counts = np.maximum(1, np.floor((finish - F) * inv).astype(np.int64) + 1)
    rest = M - int(counts.sum())
    done = False
    if 0 <= rest <= D:
        if rest == 0:
            done = True
        else:  # the `rest` earliest next finishes, unless one pipeline deserves two
            nxt = F + counts * E
            idx = np.argpartition(nxt, rest - 1)[:rest]
            if not ((nxt[idx] + E[idx]) < nxt[idx].max()).any():
                counts[idx] += 1
                done = True
    if not done:
        counts = np.array(assign_micro_batches(F.tolist(), E.tolist(), M), dtype=np.int64)
    if (counts <= C).all():
        return counts
    return np.array(assign_micro_batches(F.tolist(), E.tolist(), M, C.tolist()), dtype=np.int64)


class State:
    """The current plan of the search and its exact score."""

    def __init__(self, sp: Space, pipes: list[Pipe], removed: set[str]):
        self.sp = sp
        self.pipes = list(pipes)
        self.removed = set(removed)
        infos = [sp.info(p) for p in self.pipes]
        if any(i is None for i in infos):
            raise PlanError("out-of-memory", "a start plan does not fit")
        self.F, self.E, self.C = (np.array(x) for x in zip(*infos))
        rows = [sp.dp.row(p) for p in self.pipes]
        self.N = np.array([r[0] for r in rows])
        self.T = np.array([r[1] for r in rows])
        self.bounds = Counter(p.bounds for p in self.pipes)
        scored = self._score(self.F, self.E, self.C, sp.dp.time_s(self.N, self.T, self.bounds))
        if scored is None:
            raise PlanError("no-feasible-plan", "a start plan has no micro-batch assignment")
        self.step, self.secondary, self.micro = scored
        self._index()

    def _score(self, F, E, C, tdp):
        M = self.sp.M
        micro = assign(F, E, C, M)
        if micro is None:
            return None
        step = float((F + (micro - 1) * E).max()) + tdp
        inv = 1.0 / E
        relaxed = (M - len(F) + _sum(F * inv)) / _sum(inv) + tdp
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
        finish = self.F + (self.micro - 1) * self.E
        self.critical = np.flatnonzero(finish >= finish.max() * (1 - 1e-9)).tolist()

    def evaluate(self, change: Change, commit: bool = False):
        """(step, secondary) of the state after the change, or None if it is infeasible.
        With commit, the change is applied (only call with commit for a feasible change)."""
        sp = self.sp
        F, E, C = self.F.copy(), self.E.copy(), self.C.copy()
        for i, new in change.replace.items():
            if new is not None:
                inf = sp.info(new)
                if inf is None:
                    return None
                F[i], E[i], C[i] = inf
        added = [sp.info(new) for new in change.add]
        if any(inf is None for inf in added):
            return None
        deleted = [i for i, new in change.replace.items() if new is None]
        keep = None
        if deleted:
            keep = np.ones(len(F), dtype=bool)
            keep[deleted] = False
            F, E, C = F[keep], E[keep], C[keep]
        if added:
            F = np.concatenate([F, [a[0] for a in added]])
            E = np.concatenate([E, [a[1] for a in added]])
            C = np.concatenate([C, np.array([a[2] for a in added], dtype=C.dtype)])
        D = len(F)
        if D == 0 or D > sp.M:
            return None
        N, T = self.N.copy(), self.T.copy()
        bounds = Counter(self.bounds)
        for i, new in change.replace.items():
            bounds[self.pipes[i].bounds] -= 1
            if new is not None:
                N[i], T[i] = sp.dp.row(new)
                bounds[new.bounds] += 1
        if deleted:
            N, T = N[keep], T[keep]
        if change.add:
            rows = [sp.dp.row(new) for new in change.add]
            N = np.vstack([N] + [r[0][None] for r in rows])
            T = np.vstack([T] + [r[1][None] for r in rows])
            for new in change.add:
                bounds[new.bounds] += 1
        bounds = +bounds
        scored = self._score(F, E, C, sp.dp.time_s(N, T, bounds))
        if commit and scored is not None:
            pipes = list(self.pipes)
            for i, new in change.replace.items():
                pipes[i] = new
            self.pipes = [p for p in pipes if p is not None] + list(change.add)
            self.F, self.E, self.C, self.N, self.T, self.bounds = F, E, C, N, T, bounds
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
            for p, m in zip(self.pipes, self.micro.tolist())
        )
        return Plan(strategy, model.global_batch, model.micro_batch, pipelines, tuple(sorted(self.removed)))


def state_from_plan(sp: Space, plan: Plan) -> State:
    pipes = []
    for p in plan.pipelines:
        groups = tuple(sp.group(s.devices) for s in p.stages)
        bounds = (0,) + tuple(s.layers[1] for s in p.stages)
        pipes.append(Pipe(groups, bounds))
    return State(sp, pipes, set(plan.removed))
