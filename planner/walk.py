"""Local search over whole plans with random moves: descent, simulated annealing and
iterated local search with kicks (walk_moves, scored by walk_state).

The planner ends with a short walk from its best plan (refine); bench/reference_search.py runs
a much longer one from that plan and the baselines, to tell how far the planner's plan is from
the best such a search finds. The budget is a number of evaluated candidates, so the result is
a function of the inputs and the seed (and, past a deadline, of the clock).
"""

from __future__ import annotations

import math
import random
import time

from .candidate import Candidate
from .cluster import Cluster
from .model import ModelSpec
from .walk_moves import Moves, shape
from .walk_space import REL, Change, Pipe, Space
from .walk_state import State

# Proposals in a row that find no move before a search stops: a state without neighbours (one
# GPU, one stage) spun 100,000 of them, 0.35 s for a one-GPU cluster's plan. The longest run
# before a move was found: 72 on 400 small random cases (tests/planner/optimum_cases.py), 19 on
# the first 40 generated scenarios' plans and 4,000-move reference searches.
GIVE_UP = 1_000


class Walk:
    """A search's clock and its moves: progress runs from 0 to 1 over the budget (evaluations,
    or seconds when given and reached first); past a deadline (search.Deadline), it is over."""

    def __init__(self, sp: Space, rng: random.Random, evals: int, seconds: float | None = None, deadline=None):
        self.sp, self.rng = sp, rng
        self.moves = Moves(sp, rng)
        self.budget, self.seconds, self.deadline = max(1, evals), seconds, deadline
        self.t0 = time.perf_counter()
        self.evals = 0
        self._clock = 0.0

    def progress(self) -> float:
        p = self.evals / self.budget
        if (self.evals & 15) == 0:
            if self.seconds is not None:
                self._clock = (time.perf_counter() - self.t0) / self.seconds
            if self.deadline is not None and self.deadline.passed():
                self._clock = 1.0
        return max(p, self._clock)

    def search(self, st: State, until: float, path: list, t0: float = 0.0, t1: float = 0.0, patience: int = 0) -> tuple:
        """Moves from st until progress reaches `until`: annealing from temperature t0
        down to t1 (relative step-time increases accepted with probability exp(-d/T)),
        plain descent when t0 is 0; with patience, after that many evaluations without
        improvement, a kick: from the best, 1-3 random moves taken regardless.
        Returns the best (snapshot, path, step) seen."""
        best = (st.snapshot(), list(path), st.step)
        start = self.progress()
        span = max(until - start, 1e-12)
        T = t0
        failures = since = 0
        while True:
            p = self.progress()
            if p >= until or failures > GIVE_UP:
                break
            if patience and since >= patience:
                st = State(self.sp, *best[0])
                path[:] = list(best[1])
                self._kick(st, path)
                since = 0
            change = self.moves.propose(st)
            if change is None:
                failures += 1
                continue
            failures = 0
            self.evals += 1
            since += 1
            scored = st.evaluate(change)
            if scored is None:
                continue
            if t0 > 0 and (self.evals & 63) == 0:
                T = t0 * (t1 / t0) ** ((p - start) / span)
            if st.better(scored):
                accept = True
            elif t0 > 0:
                delta = math.log(scored[0] / st.step) + 0.1 * math.log(scored[1] / st.secondary)
                accept = delta <= 0 or self.rng.random() < math.exp(-delta / T)
            else:
                accept = False
            if accept:
                before = st.step
                st.evaluate(change, commit=True)
                path.append((change.kind, before / st.step - 1))
                if st.step < best[2] * (1 - REL):
                    best = (st.snapshot(), list(path), st.step)
                    since = 0
        return best

    def _kick(self, st: State, path: list) -> None:
        want, done = self.rng.randint(1, 3), 0
        for _ in range(20):
            change = self.moves.propose(st)
            if change is None:
                continue
            self.evals += 1
            scored = st.evaluate(change)
            if scored is not None:
                before = st.step
                st.evaluate(change, commit=True)
                path.append(("kick:" + change.kind, before / st.step - 1))
                done += 1
                if done >= want:
                    return


def refine(candidate: Candidate, cluster: Cluster, model: ModelSpec, evals: int, deadline=None) -> Candidate:
    """The candidate after a descent of `evals` random moves (seed 0: the same inputs, the same
    plan), each taken if it lowers the step time; the candidate itself if none does (or if
    `evals` is 0)."""
    if evals < 1:
        return candidate
    sp = Space(cluster, model)
    (pipes, removed), _, step = Walk(sp, random.Random(0), evals, deadline=deadline).search(
        State(sp, _pipes_of(candidate, sp), set(candidate.removed)), 1.0, []
    )
    if step >= candidate.step_time_s * (1 - REL):
        return candidate
    return _candidate_of(State(sp, pipes, removed), sp)


def settle(candidate: Candidate, cluster: Cluster, model: ModelSpec, evals: int, deadline=None) -> Candidate:
    """The candidate with its block boundaries settled: each boundary moved by one block either
    way, in every pipeline of its shape at once, the move that lowers the step time most taken,
    until none does or `evals` moves are scored. The partition splits blocks for the pipelines'
    compute with the sync's share only estimated; scored exactly, one block off a stage whose
    gradients sync over Ethernet can pay. The random descent rarely draws that one boundary: in
    generated scenario 51 of seed 0 it took 4,000 moves."""
    sp = Space(cluster, model)
    st = State(sp, _pipes_of(candidate, sp), set(candidate.removed))
    scored_count = 0
    while scored_count < evals and not (deadline is not None and deadline.passed()):
        best = None
        for change in _boundary_shifts(st):
            scored = st.evaluate(change)
            scored_count += 1
            if scored is not None and st.better(scored) and (best is None or scored < best[0]):
                best = (scored, change)
            if scored_count >= evals:
                break
        if best is None:
            break
        st.evaluate(best[1], commit=True)
    if st.step >= candidate.step_time_s * (1 - REL):
        return candidate
    return _candidate_of(st, sp)


def _boundary_shifts(st: State):
    """Every boundary one block either way, in all pipelines of its pipeline's shape at once (each
    shape once). Shifting one pipeline of several alike as well found nothing more on 800
    generated scenarios, for up to 0.4 s more at 1,024 GPUs."""
    shapes: dict[tuple, list[int]] = {}  # walk_moves.same_shape's sets, in one pass
    for q, pipe in enumerate(st.pipes):
        shapes.setdefault(shape(pipe), []).append(q)
    for (bounds_now, _), alike in shapes.items():
        groups = st.pipes[alike[0]].groups
        for i in range(1, len(groups)):
            for delta in (-1, 1):
                bounds = list(bounds_now)
                bounds[i] += delta
                if bounds[i - 1] < bounds[i] < bounds[i + 1]:
                    bounds = tuple(bounds)
                    yield Change("shift", {q: Pipe(st.pipes[q].groups, bounds) for q in alike})


def _pipes_of(candidate: Candidate, sp: Space) -> list[Pipe]:
    return [
        Pipe(tuple(sp.group(ids) for ids in row), (0, *(c.end for c in costs)))
        for row, costs in zip(candidate.devices, candidate.costs)
    ]


def _candidate_of(st: State, sp: Space) -> Candidate:
    return Candidate(
        [[g.devices for g in p.groups] for p in st.pipes],
        [sp.costs(p) for p in st.pipes],
        list(st.micro),
        sorted(st.removed),
        st.step,
    )
