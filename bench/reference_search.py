"""A strong reference search for the planner benchmark (not part of the planner).

Local search over whole plans, started from Drover's plan and from the
uniform and drop baselines, every candidate scored with the reference cost
model of spec/cost-model.md. It exists to tell how far Drover's plan is from
the best plan a much longer search finds; nothing in the planner uses it.

A state is a list of pipelines, each a tuple of tensor-parallel groups (one
node's devices, any size that model.tp_divides allows, not only powers of two)
and the block boundaries of its stages, plus the usable devices left out.
Micro-batches are never part of the state: after every move they are assigned
exactly (the min-max of the one-forward-one-backward formula, with each
pipeline's memory bounding its count), so "move a micro-batch between
pipelines" is always at its optimum.

Moves:
  shift        a block boundary between two neighbouring stages (one pipeline,
               or every pipeline of the same shape at once)
  align        the other pipelines' nearest boundaries onto one of a pipeline's
               (block replicas on stages alike: the data-parallel sync's links)
  rebalance    the blocks of a pipeline, exactly for its pipeline time
  swap-groups  two TP groups exchange their places (in or across pipelines)
  swap-devices two devices of one node exchange groups (or group and removed)
  remove       a device leaves its group; the rest splits into valid TP sizes
               that stay as stages or are removed too
  restore      a removed device (with others of its node) joins a group or
               becomes a new stage
  split-group  a TP group becomes two stages (stragglers together)
  merge-groups two groups of one node become one (from one or two pipelines)
  move-stage   a group moves from one pipeline to another (depths change)
  split-pipe / merge-pipes   pipelines cut in two or joined
  drop-stage   a group is removed with its devices

Every candidate is scored exactly: pipeline terms with cost.pipeline_terms,
the data-parallel sync incrementally (per block, only what a move changed)
with the formula of cost.dp_sync_s, memory from cost.stage_memory_bytes. The
plan returned is re-scored with cost.evaluate and checked with cost.validate.

Search: a short descent from each start point, then two runs from the best of
them (simulated annealing, then iterated local search with kicks), then a
descent from the best plan seen. Moves are drawn at random, half of them on a
critical pipeline (the one that finishes last) and most device moves on a
straggler.

The budget is a number of evaluated candidates: the result is then a function
of the inputs and the seed. Optionally also wall-clock seconds (whichever ends
first; the phases and the annealing schedule then follow the clock, so such a
run depends on the machine's speed and cannot be replayed exactly).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from drover.planner.assignment import assign_micro_batches
from drover.planner.cluster import Cluster
from drover.planner.cost import (
    MEMORY_HEADROOM,
    StageCost,
    evaluate,
    pipeline_terms,
    stage_compute_s,
    stage_costs,
    stage_memory_bytes,
    validate,
    with_prediction,
)
from drover.planner.errors import PlanError
from drover.planner.model import ModelSpec
from drover.planner.plan import Pipeline, Plan, Stage
from drover.planner.search import make_plan

REL = 1e-12  # scores closer than this are equal

MOVE_WEIGHTS = {  # by how often each improved in trial runs
    "shift": 6,
    "align": 3,
    "rebalance": 4,
    "swap-groups": 14,
    "swap-devices": 8,
    "remove": 10,
    "restore": 12,
    "split-group": 8,
    "merge-groups": 12,
    "move-stage": 12,
    "split-pipe": 3,
    "merge-pipes": 4,
    "drop-stage": 5,
}


@dataclass(frozen=True, eq=False)  # interned by Space.group: identity is equality
class Group:
    devices: tuple[str, ...]  # in index order
    node: int
    t: int
    speed: float  # slowest member, FLOP/s
    memory: float  # smallest member, bytes


@dataclass(frozen=True)
class Pipe:
    groups: tuple[Group, ...]
    bounds: tuple[int, ...]  # len(groups) + 1 entries, 0 .. L


@dataclass
class Change:
    kind: str
    replace: dict[int, Pipe | None] = field(default_factory=dict)  # index -> new pipe (None: deleted)
    add: list[Pipe] = field(default_factory=list)
    unremove: set[str] = field(default_factory=set)  # devices that leave `removed`
    remove: set[str] = field(default_factory=set)  # devices that join `removed`


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


class Space:
    """What moves and scores need of a cluster and a model, computed once."""

    def __init__(self, cluster: Cluster, model: ModelSpec):
        self.cluster, self.model = cluster, model
        self.L, self.M = model.layers, model.micro_batches
        self.dev = cluster.device_by_id
        self.speed = {d.id: cluster.speed(d, model.mfu) for d in cluster.usable}
        self.rate = {d.id: d.rate for d in cluster.devices}
        biggest = max(n.gpus for n in cluster.nodes)
        self.sizes = [t for t in range(1, biggest + 1) if model.tp_divides(t)]
        self.valid = set(self.sizes)
        profiles = cluster.network_profiles
        keys = sorted(set(profiles), key=repr)
        self.profile = [keys.index(p) for p in profiles]
        members: dict[int, list[int]] = {}
        for n, p in enumerate(self.profile):
            members.setdefault(p, []).append(n)
        P = len(keys)
        self.pbw = [[math.inf] * P for _ in range(P)]
        for a in range(P):
            for b in range(P):
                na = members[a][0]
                nb = members[b][0] if a != b else (members[a][1] if len(members[a]) > 1 else None)
                if nb is not None:
                    self.pbw[a][b] = cluster.link_bw(na, nb)
        self.intra = [cluster.link_bw(n, n) for n in range(len(cluster.nodes))]
        self.slot_params = [model.block_params] * self.L + [model.embedding_params, model.head_params]
        self._groups: dict[tuple[str, ...], Group] = {}
        self._info: dict[Pipe, tuple | None] = {}
        self._partitions: dict[tuple, tuple[int, ...] | None] = {}
        self.dp = DataParallel(self)

    def group(self, ids) -> Group:
        key = tuple(sorted(ids, key=lambda d: self.dev[d].index))
        g = self._groups.get(key)
        if g is None:
            ds = [self.dev[d] for d in key]
            g = Group(
                key,
                ds[0].node,
                len(key),
                min(self.speed[d] for d in key),
                min(self.cluster.memory_bytes(d) for d in ds),
            )
            self._groups[key] = g
        return g

    def split_sizes(self, count: int) -> list[int]:
        """count devices as valid TP sizes, largest first."""
        out = []
        while count:
            t = max(s for s in self.sizes if s <= count)
            out.append(t)
            count -= t
        return out

    # -- one pipeline -----------------------------------------------------------------------

    def costs(self, pipe: Pipe) -> list[StageCost]:
        b = pipe.bounds
        return [StageCost(g.node, g.t, g.speed, g.memory, b[k], b[k + 1]) for k, g in enumerate(pipe.groups)]

    def info(self, pipe: Pipe):
        """(first, each, cap): T(m) = first + (m - 1) * each for m <= cap micro-batches
        (memory); None when no m fits."""
        if pipe in self._info:
            return self._info[pipe]
        if len(self._info) > 400_000:
            self._info.clear()
        model = self.model
        S, cap = len(pipe.groups), self.M
        result = None
        for k, g in enumerate(pipe.groups):
            n = pipe.bounds[k + 1] - pipe.bounds[k]
            limit = MEMORY_HEADROOM * g.memory
            if stage_memory_bytes(n, k, S, self.M, g.t, model) <= limit:
                continue
            if stage_memory_bytes(n, k, S, 1, g.t, model) > limit:
                break
            lo, hi = 1, min(S - k, self.M)  # fits at lo, not at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if stage_memory_bytes(n, k, S, mid, g.t, model) <= limit:
                    lo = mid
                else:
                    hi = mid
            cap = min(cap, lo)
        else:
            first, each = pipeline_terms(self.costs(pipe), model, self.cluster)
            result = (first, each, cap)
        self._info[pipe] = result
        return result

    def partition(self, groups: tuple[Group, ...], m: int) -> tuple[int, ...] | None:
        """Block boundaries minimising the pipeline's time with m micro-batches:
        sum tau + sum c + (m - 1) * max(tau, c), memory for m within every stage."""
        key = (groups, m)
        if key not in self._partitions:
            if len(self._partitions) > 200_000:
                self._partitions.clear()
            self._partitions[key] = self._partition(groups, m)
        return self._partitions[key]

    def _partition(self, groups: tuple[Group, ...], m: int) -> tuple[int, ...] | None:
        model, L, S = self.model, self.L, len(groups)
        if S > L or S == 0:
            return None
        cl = self.cluster
        A = model.activation_bytes
        w, e, caps = [], [], []
        for k, g in enumerate(groups):
            wk = 3 * model.block_flops / (g.t * g.speed)
            if g.t > 1:
                wk += 4 * (2 * (g.t - 1) / g.t) * A / self.intra[g.node]
            w.append(wk)
            e.append(3 * model.head_flops / (g.t * g.speed) if k == S - 1 else 0.0)
            fixed = 16 * (model.embedding_params * (k == 0) + model.head_params * (k == S - 1))
            per = 16 * model.block_params + min(S - k, m) * model.block_activation_memory
            c = int((MEMORY_HEADROOM * g.memory * g.t - fixed) // per)
            while c >= 1 and stage_memory_bytes(c, k, S, m, g.t, model) > MEMORY_HEADROOM * g.memory:
                c -= 1
            while c + 1 <= L and stage_memory_bytes(c + 1, k, S, m, g.t, model) <= MEMORY_HEADROOM * g.memory:
                c += 1
            caps.append(min(c, L))
        if min(caps) < 1 or sum(caps) < L:
            return None
        comms = [2 * A / (min(a.t, b.t) * cl.link_bw(a.node, b.node)) for a, b in zip(groups, groups[1:])]
        csum, cmax = sum(comms), max(comms, default=0.0)
        # The min-max (smallest feasible bound on tau) by adding blocks where they cost least.
        counts = [1] * S
        heap = [(2 * w[k] + e[k], k) for k in range(S) if caps[k] > 1]
        heapq.heapify(heap)
        for _ in range(L - S):
            _, k = heapq.heappop(heap)
            counts[k] += 1
            if counts[k] < caps[k]:
                heapq.heappush(heap, ((counts[k] + 1) * w[k] + e[k], k))
        x0 = max(counts[k] * w[k] + e[k] for k in range(S))
        order = sorted(range(S), key=lambda k: w[k])
        # Smallest possible sum of tau (cheapest stages filled first), a lower bound.
        rest, least = L - S, sum(w) + sum(e)
        for k in order:
            add = min(caps[k] - 1, rest)
            least += add * w[k]
            rest -= add
        best_T, best = math.inf, counts
        # Bounds X above the min-max, ascending: the values n * w_k + e_k.
        cand = []
        for k in range(S):
            n = max(1, math.ceil((x0 - e[k]) / w[k] - 1e-9))
            if n <= caps[k]:
                cand.append((n * w[k] + e[k], k, n))
        heapq.heapify(cand)
        seen = 0
        while cand and seen < 4 * L * S:
            x, k, n = heapq.heappop(cand)
            seen += 1
            if n + 1 <= caps[k]:
                heapq.heappush(cand, ((n + 1) * w[k] + e[k], k, n + 1))
            if (m - 1) * max(x, cmax) + least + csum >= best_T:
                break
            u = [min(caps[j], int((x * (1 + 1e-12) - e[j]) / w[j])) for j in range(S)]
            if min(u) < 1 or sum(u) < L:
                continue
            ns, rest = [1] * S, L - S
            for j in order:
                add = min(u[j] - 1, rest)
                ns[j] += add
                rest -= add
            taus = [ns[j] * w[j] + e[j] for j in range(S)]
            T = sum(taus) + csum + (m - 1) * max(max(taus), cmax)
            if T < best_T:
                best_T, best = T, ns
        out = [0]
        for n in best:
            out.append(out[-1] + n)
        return tuple(out)


class DataParallel:
    """T_dp of cost.dp_sync_s over a matrix of holders: row p, column j is the
    (node, TP size) of the stage of pipeline p that holds block j; columns L and
    L + 1 are the first and last stages (the embedding and the head)."""

    def __init__(self, sp: Space):
        self.sp = sp
        self.profile = np.array(sp.profile, dtype=np.int64)
        self.intra = np.array(sp.intra, dtype=float)
        P = len(sp.pbw)
        # One network profile, one intra-node bandwidth, faster than any link between
        # nodes: a block's bwr is the link between nodes whenever two holders differ.
        self.simple = P == 1 and len(set(sp.intra)) == 1 and sp.pbw[0][0] <= sp.intra[0]
        params = [2.0 * sp.model.block_params] * sp.L + [2.0 * sp.model.embedding_params, 2.0 * sp.model.head_params]
        self.params = np.array(params)
        self._rows: dict[Pipe, tuple] = {}

    def row(self, pipe: Pipe) -> tuple[np.ndarray, np.ndarray]:
        r = self._rows.get(pipe)
        if r is None:
            if len(self._rows) > 200_000:
                self._rows.clear()
            L, b = self.sp.L, pipe.bounds
            nodes = np.empty(L + 2, dtype=np.int64)
            ts = np.empty(L + 2, dtype=float)
            for k, g in enumerate(pipe.groups):
                nodes[b[k] : b[k + 1]] = g.node
                ts[b[k] : b[k + 1]] = g.t
            nodes[L], ts[L] = pipe.groups[0].node, pipe.groups[0].t
            nodes[L + 1], ts[L + 1] = pipe.groups[-1].node, pipe.groups[-1].t
            r = self._rows[pipe] = (nodes, ts)
        return r

    def time_s(self, N: np.ndarray, T: np.ndarray, bounds) -> float:
        D = N.shape[0]
        if D <= 1:
            return 0.0
        sp = self.sp
        tmin = T.min(axis=0)
        if self.simple:
            bw = np.where(N.min(axis=0) != N.max(axis=0), sp.pbw[0][0], sp.intra[0])
        else:
            bw = np.full(N.shape[1], math.inf)
            Ns = np.sort(N, axis=0)
            same = Ns[1:] == Ns[:-1]
            if same.any():
                bw = np.minimum(bw, np.where(same, self.intra[Ns[1:]], math.inf).min(axis=0))
            PR = self.profile[N]
            present = []
            for a in range(len(sp.pbw)):
                mask = PR == a
                here = mask.any(axis=0)
                present.append(here)
                if not here.any():
                    continue
                two = here & (np.where(mask, N, 1 << 40).min(axis=0) != np.where(mask, N, -1).max(axis=0))
                bw = np.where(two, np.minimum(bw, sp.pbw[a][a]), bw)
                for b in range(a):
                    both = here & present[b]
                    bw = np.where(both, np.minimum(bw, sp.pbw[a][b]), bw)
        sync = self.params / (tmin * bw)
        L = sp.L
        prefix = [0.0, *itertools.accumulate(sync[:L].tolist())]
        emb, head = float(sync[L]), float(sync[L + 1])
        worst = 0.0
        for b in bounds:
            S = len(b) - 1
            for k in range(S):
                paid = prefix[b[k + 1]] - prefix[b[k]] + (emb if k == 0 else 0.0) + (head if k == S - 1 else 0.0)
                if paid > worst:
                    worst = paid
        return 2 * (D - 1) / D * worst


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
    # The unbounded optimum clamped to the caps is below some bounded optimum
    # (whose level can only be higher), so adding one at a time from there is exact.
    counts = np.minimum(counts, C).tolist()
    f, e, c = F.tolist(), E.tolist(), C.tolist()
    heap = [(f[p] + counts[p] * e[p], p) for p in range(D) if counts[p] < c[p]]
    heapq.heapify(heap)
    for _ in range(M - sum(counts)):
        _, p = heapq.heappop(heap)
        counts[p] += 1
        if counts[p] < c[p]:
            heapq.heappush(heap, (f[p] + counts[p] * e[p], p))
    return np.array(counts, dtype=np.int64)


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


class Moves:
    """Random neighbours of a state (each a Change), biased towards the critical
    pipelines and the straggling devices."""

    def __init__(self, sp: Space, rng: random.Random):
        self.sp, self.rng = sp, rng
        kinds = list(MOVE_WEIGHTS)
        self.kinds, self.weights = kinds, [MOVE_WEIGHTS[k] for k in kinds]
        self.slow = sorted((d for d, r in sp.rate.items() if 1.0 < r < math.inf), key=lambda d: -sp.rate[d])

    def propose(self, st: State) -> Change | None:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        return getattr(self, "_" + kind.replace("-", "_"))(st)

    # -- helpers ----------------------------------------------------------------------------

    def _pipe_index(self, st: State) -> int:
        if self.rng.random() < 0.5:
            return self.rng.choice(st.critical)
        return self.rng.randrange(len(st.pipes))

    def _m(self, st: State, p: int | None) -> int:
        if p is not None and p < len(st.micro):
            return int(st.micro[p])
        return max(1, self.sp.M // max(1, len(st.pipes)))

    def _rebuilt(self, st: State, groups: tuple[Group, ...], m: int) -> Pipe | None:
        bounds = self.sp.partition(groups, m)
        return None if bounds is None else Pipe(groups, bounds)

    def _with_groups(self, st: State, p: int, groups: tuple[Group, ...], rebalance: bool) -> Pipe | None:
        old = st.pipes[p]
        if not rebalance and len(groups) == len(old.groups):
            return Pipe(groups, old.bounds)
        return self._rebuilt(st, groups, self._m(st, p))

    def _stage(self, st: State) -> tuple[int, int]:
        p = self._pipe_index(st)
        pipe = st.pipes[p]
        if self.rng.random() < 0.5:  # the slowest stage of the pipeline
            costs = self.sp.costs(pipe)
            S = len(costs)
            k = max(range(S), key=lambda k: costs[k].n / (costs[k].t * costs[k].speed) + (k == S - 1) * 1e-30)
            return p, k
        return p, self.rng.randrange(len(pipe.groups))

    def _device(self, st: State) -> str | None:
        used = [d for d in self.slow if d in st.where]
        if used and self.rng.random() < 0.6:
            return self.rng.choice(used[: max(1, min(len(used), 16))])
        p, k = self._stage(st)
        return self.rng.choice(st.pipes[p].groups[k].devices)

    def _same_shape(self, st: State, p: int) -> list[int]:
        pipe = st.pipes[p]
        sig = (pipe.bounds, tuple((g.t, g.speed) for g in pipe.groups))
        return [
            q
            for q, other in enumerate(st.pipes)
            if other.bounds == sig[0] and tuple((g.t, g.speed) for g in other.groups) == sig[1]
        ]

    # -- moves ------------------------------------------------------------------------------

    def _shift(self, st: State) -> Change | None:
        p = self._pipe_index(st)
        pipe = st.pipes[p]
        S = len(pipe.groups)
        if S < 2:
            return None
        i = self.rng.randrange(1, S)
        delta = self.rng.choice((-1, 1)) * (1 if self.rng.random() < 0.7 else self.rng.randint(2, 4))
        b = list(pipe.bounds)
        b[i] += delta
        if not (b[i - 1] < b[i] < b[i + 1]):
            return None
        b = tuple(b)
        targets = self._same_shape(st, p) if self.rng.random() < 0.4 else [p]
        return Change("shift", {q: Pipe(st.pipes[q].groups, b) for q in targets})

    def _align(self, st: State) -> Change | None:
        """Every pipeline's boundary nearest to one of pipeline p's moves onto it, so
        the replicas of the blocks around it sit on stages of the same kind."""
        p = self._pipe_index(st)
        pipe = st.pipes[p]
        if len(pipe.groups) < 2 or len(st.pipes) < 2:
            return None
        x = pipe.bounds[self.rng.randrange(1, len(pipe.groups))]
        change = Change("align")
        for q, other in enumerate(st.pipes):
            b = list(other.bounds)
            if q == p or len(b) < 3 or x in b:
                continue
            i = min(range(1, len(b) - 1), key=lambda i: abs(b[i] - x))
            b[i] = x
            if b[i - 1] < b[i] < b[i + 1]:
                change.replace[q] = Pipe(other.groups, tuple(b))
        return change if change.replace else None

    def _rebalance(self, st: State) -> Change | None:
        p = self._pipe_index(st)
        new = self._rebuilt(st, st.pipes[p].groups, self._m(st, p))
        if new is None or new == st.pipes[p]:
            return None
        if self.rng.random() < 0.5:
            return Change("rebalance", {p: new})
        return Change("rebalance", {q: Pipe(st.pipes[q].groups, new.bounds) for q in self._same_shape(st, p)})

    def _swap_groups(self, st: State) -> Change | None:
        p, k = self._stage(st)
        q = self.rng.randrange(len(st.pipes))
        j = self.rng.randrange(len(st.pipes[q].groups))
        if (p, k) == (q, j):
            return None
        ga, gb = st.pipes[p].groups[k], st.pipes[q].groups[j]
        if (ga.t, ga.speed, ga.node) == (gb.t, gb.speed, gb.node):
            return None
        rebalance = self.rng.random() < 0.5
        if p == q:
            gs = list(st.pipes[p].groups)
            gs[k], gs[j] = gb, ga
            new = self._with_groups(st, p, tuple(gs), rebalance)
            return None if new is None else Change("swap-groups", {p: new})
        gp, gq = list(st.pipes[p].groups), list(st.pipes[q].groups)
        gp[k], gq[j] = gb, ga
        a, b = self._with_groups(st, p, tuple(gp), rebalance), self._with_groups(st, q, tuple(gq), rebalance)
        if a is None or b is None:
            return None
        return Change("swap-groups", {p: a, q: b})

    def _swap_devices(self, st: State) -> Change | None:
        d = self._device(st)
        if d is None or d not in st.where:
            return None
        node = self.sp.dev[d].node
        p, k = st.where[d]
        others = [x for (q, j) in st.on_node.get(node, []) if (q, j) != (p, k) for x in st.pipes[q].groups[j].devices]
        others += st.removed_on.get(node, [])
        if not others:
            return None
        e = self.rng.choice(others)
        sp = self.sp
        g = st.pipes[p].groups[k]
        ga = sp.group([x if x != d else e for x in g.devices])
        rebalance = self.rng.random() < 0.3
        if e in st.removed:
            new = self._with_groups(st, p, _put(st.pipes[p].groups, k, ga), rebalance)
            if new is None:
                return None
            return Change("swap-devices", {p: new}, unremove={e}, remove={d})
        q, j = st.where[e]
        gb = sp.group([x if x != e else d for x in st.pipes[q].groups[j].devices])
        if p == q:
            gs = list(st.pipes[p].groups)
            gs[k], gs[j] = ga, gb
            new = self._with_groups(st, p, tuple(gs), rebalance)
            return None if new is None else Change("swap-devices", {p: new})
        a = self._with_groups(st, p, _put(st.pipes[p].groups, k, ga), rebalance)
        b = self._with_groups(st, q, _put(st.pipes[q].groups, j, gb), rebalance)
        if a is None or b is None:
            return None
        return Change("swap-devices", {p: a, q: b})

    def _pieces(self, devices: list[str]) -> list[Group]:
        """Devices (fastest first) cut into valid TP sizes, largest group the fastest."""
        devices = sorted(devices, key=lambda d: (self.sp.rate[d], self.sp.dev[d].index))
        out, at = [], 0
        for t in self.sp.split_sizes(len(devices)):
            out.append(self.sp.group(devices[at : at + t]))
            at += t
        return out

    def _remove(self, st: State) -> Change | None:
        d = self._device(st)
        if d is None or d not in st.where:
            return None
        p, k = st.where[d]
        pipe = st.pipes[p]
        g = pipe.groups[k]
        rest = [x for x in g.devices if x != d]
        if not rest:
            return self._drop(st, p, k, "remove")
        pieces = self._pieces(rest)
        if len(pieces) == 1 or self.rng.random() < 0.5:
            gone = {x for piece in pieces[1:] for x in piece.devices}
            new = self._with_groups(st, p, _put(pipe.groups, k, pieces[0]), True)
            return None if new is None else Change("remove", {p: new}, remove={d} | gone)
        groups = pipe.groups[:k] + tuple(pieces) + pipe.groups[k + 1 :]
        new = self._rebuilt(st, groups, self._m(st, p))
        return None if new is None else Change("remove", {p: new}, remove={d})

    def _restore(self, st: State) -> Change | None:
        if not st.removed:
            return None
        sp = self.sp
        d = self.rng.choice(sorted(st.removed))
        node = sp.dev[d].node
        spare = st.removed_on[node]
        how = self.rng.random()
        if how < 0.4 and st.on_node.get(node):
            p, k = self.rng.choice(st.on_node[node])
            g = st.pipes[p].groups[k]
            extra = [d] + [x for x in spare if x != d]
            fits = [n for n in range(1, len(extra) + 1) if g.t + n in sp.valid]
            if not fits:
                return None
            n = self.rng.choice(fits)
            joined = sp.group(list(g.devices) + extra[:n])
            new = self._with_groups(st, p, _put(st.pipes[p].groups, k, joined), True)
            return None if new is None else Change("restore", {p: new}, unremove=set(extra[:n]))
        sizes = [t for t in sp.sizes if t <= len(spare)]
        t = self.rng.choice(sizes)
        members = [d] + sorted((x for x in spare if x != d), key=lambda x: sp.rate[x])[: t - 1]
        g = sp.group(members)
        if how < 0.9:
            p = self.rng.randrange(len(st.pipes))
            pipe = st.pipes[p]
            at = self.rng.randrange(len(pipe.groups) + 1)
            new = self._rebuilt(st, pipe.groups[:at] + (g,) + pipe.groups[at:], self._m(st, p))
            return None if new is None else Change("restore", {p: new}, unremove=set(members))
        new = self._rebuilt(st, (g,), self._m(st, None))  # a pipeline of its own
        return None if new is None else Change("restore", add=[new], unremove=set(members))

    def _split_group(self, st: State) -> Change | None:
        p, k = self._stage(st)
        pipe = st.pipes[p]
        g = pipe.groups[k]
        options = [a for a in self.sp.sizes if a < g.t and g.t - a in self.sp.valid]
        if not options:
            return None
        a = self.rng.choice(options)
        devices = sorted(g.devices, key=lambda d: (self.sp.rate[d], self.sp.dev[d].index))
        first, second = self.sp.group(devices[:a]), self.sp.group(devices[a:])
        if self.rng.random() < 0.6 or len(st.pipes) == 1:
            groups = pipe.groups[:k] + (first, second) + pipe.groups[k + 1 :]
            new = self._rebuilt(st, groups, self._m(st, p))
            return None if new is None else Change("split-group", {p: new})
        q = self.rng.choice([x for x in range(len(st.pipes)) if x != p])
        other = st.pipes[q]
        at = self.rng.randrange(len(other.groups) + 1)
        a_new = self._rebuilt(st, _put(pipe.groups, k, first), self._m(st, p))
        b_new = self._rebuilt(st, other.groups[:at] + (second,) + other.groups[at:], self._m(st, q))
        if a_new is None or b_new is None:
            return None
        return Change("split-group", {p: a_new, q: b_new})

    def _merge_groups(self, st: State) -> Change | None:
        p, k = self._stage(st)
        g = st.pipes[p].groups[k]
        partners = [
            (q, j)
            for (q, j) in st.on_node.get(g.node, [])
            if (q, j) != (p, k) and g.t + st.pipes[q].groups[j].t in self.sp.valid
        ]
        if not partners:
            return None
        q, j = self.rng.choice(partners)
        h = st.pipes[q].groups[j]
        merged = self.sp.group(g.devices + h.devices)
        if p == q:
            gs = list(st.pipes[p].groups)
            gs[k] = merged
            del gs[j]
            new = self._rebuilt(st, tuple(gs), self._m(st, p))
            return None if new is None else Change("merge-groups", {p: new})
        a = self._rebuilt(st, _put(st.pipes[p].groups, k, merged), self._m(st, p))
        rest = st.pipes[q].groups[:j] + st.pipes[q].groups[j + 1 :]
        b = self._rebuilt(st, rest, self._m(st, q)) if rest else None
        if a is None or (rest and b is None):
            return None
        return Change("merge-groups", {p: a, q: b})

    def _move_stage(self, st: State) -> Change | None:
        if len(st.pipes) < 2:
            return None
        p, k = self._stage(st)
        pipe = st.pipes[p]
        q = self.rng.choice([x for x in range(len(st.pipes)) if x != p])
        other = st.pipes[q]
        at = self.rng.randrange(len(other.groups) + 1)
        b = self._rebuilt(st, other.groups[:at] + (pipe.groups[k],) + other.groups[at:], self._m(st, q))
        rest = pipe.groups[:k] + pipe.groups[k + 1 :]
        a = self._rebuilt(st, rest, self._m(st, p)) if rest else None
        if b is None or (rest and a is None):
            return None
        return Change("move-stage", {p: a, q: b})

    def _split_pipe(self, st: State) -> Change | None:
        p = self._pipe_index(st)
        pipe = st.pipes[p]
        S = len(pipe.groups)
        if S < 2:
            return None
        cut = self.rng.randrange(1, S)
        m = max(1, self._m(st, p) // 2)
        a, b = self._rebuilt(st, pipe.groups[:cut], m), self._rebuilt(st, pipe.groups[cut:], m)
        if a is None or b is None:
            return None
        return Change("split-pipe", {p: a}, add=[b])

    def _merge_pipes(self, st: State) -> Change | None:
        if len(st.pipes) < 2:
            return None
        p = self._pipe_index(st)
        q = self.rng.choice([x for x in range(len(st.pipes)) if x != p])
        groups = st.pipes[p].groups + st.pipes[q].groups
        if len(groups) > self.sp.L:
            return None
        new = self._rebuilt(st, groups, self._m(st, p) + self._m(st, q))
        return None if new is None else Change("merge-pipes", {p: new, q: None})

    def _drop_stage(self, st: State) -> Change | None:
        p, k = self._stage(st)
        return self._drop(st, p, k, "drop-stage")

    def _drop(self, st: State, p: int, k: int, kind: str) -> Change | None:
        pipe = st.pipes[p]
        gone = set(pipe.groups[k].devices)
        rest = pipe.groups[:k] + pipe.groups[k + 1 :]
        if not rest:
            return None if len(st.pipes) == 1 else Change(kind, {p: None}, remove=gone)
        new = self._rebuilt(st, rest, self._m(st, p))
        return None if new is None else Change(kind, {p: new}, remove=gone)


def _put(groups: tuple[Group, ...], k: int, g: Group) -> tuple[Group, ...]:
    return groups[:k] + (g,) + groups[k + 1 :]


def state_from_plan(sp: Space, plan: Plan) -> State:
    pipes = []
    for p in plan.pipelines:
        groups = tuple(sp.group(s.devices) for s in p.stages)
        bounds = (0,) + tuple(s.layers[1] for s in p.stages)
        pipes.append(Pipe(groups, bounds))
    return State(sp, pipes, set(plan.removed))


def start_plans(cluster: Cluster, model: ModelSpec, drover: Plan | None = None) -> dict[str, Plan]:
    """Drover's plan and the baselines (those that exist)."""
    out = {"drover": drover if drover is not None else make_plan(cluster, model)}
    for name in ("uniform", "drop"):
        try:
            out[name] = make_plan(cluster, model, name)
        except PlanError:
            pass
    return out


class _Run:
    """The search's clock and its moves: progress runs from 0 to 1 over the budget
    (evaluations, or seconds when given and reached first)."""

    def __init__(self, sp: Space, rng: random.Random, evals: int, seconds: float | None):
        self.sp, self.rng = sp, rng
        self.moves = Moves(sp, rng)
        self.budget, self.seconds = max(1, evals), seconds
        self.t0 = time.perf_counter()
        self.evals = 0
        self._clock = 0.0

    def progress(self) -> float:
        p = self.evals / self.budget
        if self.seconds is not None:
            if (self.evals & 15) == 0:
                self._clock = (time.perf_counter() - self.t0) / self.seconds
            p = max(p, self._clock)
        return p

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
            if p >= until or failures > 100_000:
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


ANNEAL = (3e-3, 1e-5)  # temperatures: relative step-time increase accepted with probability 1/e


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
    run = _Run(sp, rng, evals, seconds)
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
