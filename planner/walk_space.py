"""Whole plans as states of a local search (walk.py): the search space.

A state is a list of pipelines, each a tuple of tensor-parallel groups (one node's devices,
any size that model.tp_divides allows, not only powers of two) and the block boundaries of its
stages, plus the usable devices left out. Micro-batches are never part of the state: after
every move they are assigned exactly (walk_state.assign), so "move a micro-batch between
pipelines" is always at its optimum. `Space` holds what moves and scores need of a cluster and
a model, computed once: interned groups, each pipeline's terms and memory cap, the exact block
partition of a pipeline for a number of micro-batches, and the holders of each block
(DataParallel) that the data-parallel sync is scored over.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .cluster import Cluster
from .cost import MEMORY_HEADROOM, StageCost, most_micro_batches, pipeline_terms, stage_memory_bytes
from .model import ModelSpec
from .orchestration import split_blocks, stage_terms

REL = 1e-12  # scores closer than this are equal


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
        row = self.costs(pipe)
        cap = most_micro_batches(row, self.model)
        result = (*pipeline_terms(row, self.model, self.cluster), cap) if cap else None
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
        # Orchestration's terms with no gradient sync (paid apart, exactly, by DataParallel).
        shape = [(g.t, g.speed, g.memory, self.intra[g.node], math.inf) for g in groups]
        w, e, caps = stage_terms(shape, model, 1.0, 0.0, m)
        for k, g in enumerate(groups):  # the caps checked against section 5 itself (rounding)
            c = caps[k]
            while c >= 1 and stage_memory_bytes(c, k, S, m, g.t, model) > MEMORY_HEADROOM * g.memory:
                c -= 1
            while c + 1 <= L and stage_memory_bytes(c + 1, k, S, m, g.t, model) <= MEMORY_HEADROOM * g.memory:
                c += 1
            caps[k] = min(c, L)
        if min(caps) < 1 or sum(caps) < L:
            return None
        comms = [2 * A / (min(a.t, b.t) * cl.link_bw(a.node, b.node)) for a, b in zip(groups, groups[1:])]
        csum, cmax = sum(comms), max(comms, default=0.0)
        # The min-max (smallest feasible bound on tau) by adding blocks where they cost least.
        counts = split_blocks(w, e, caps, L)
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
        prefix = [0.0] + list(itertools.accumulate(sync[:L].tolist()))
        emb, head = float(sync[L]), float(sync[L + 1])
        worst = 0.0
        for b in bounds:
            S = len(b) - 1
            for k in range(S):
                paid = prefix[b[k + 1]] - prefix[b[k]] + (emb if k == 0 else 0.0) + (head if k == S - 1 else 0.0)
                if paid > worst:
                    worst = paid
        return 2 * (D - 1) / D * worst
