"""Whole plans as states of a local search (walk.py): the search space.

A state is a list of pipelines, each a tuple of tensor-parallel groups (one node's devices,
any size that model.tp_divides allows, not only powers of two) and the block boundaries of its
stages, plus the usable devices left out. Micro-batches are never part of the state: after
every move they are assigned exactly (walk_state.assign), so "move a micro-batch between
pipelines" is always at its optimum. `Space` holds what moves and scores need of a cluster and
a model, computed once: interned groups, each pipeline's terms and memory cap, the exact block
partition of a pipeline for a number of micro-batches, and the data-parallel sync's scorer
(DataParallel).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from .cluster import Cluster
from .cost import MEMORY_HEADROOM, StageCost, most_micro_batches, new_stage, pipeline_terms, stage_memory_bytes
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
        return [
            new_stage(StageCost, (g.node, g.t, g.speed, g.memory, b[k], b[k + 1])) for k, g in enumerate(pipe.groups)
        ]

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
    """T_dp of cost.dp_sync_s over whole pipelines: blocks between two consecutive boundaries
    of any pipeline have the same holders (one stage of each pipeline), so each such run of
    blocks is scored once, at the bandwidth of its holders' slowest pair (the links depend only
    on the two nodes' network profiles, as in cost.min_pair_bw) and the narrowest holder's TP."""

    def __init__(self, sp: Space):
        self.sp = sp
        self.intra = sp.intra
        self.profile = sp.profile
        self.pbw = sp.pbw
        model = sp.model
        self.block, self.embedding, self.head = (
            2.0 * model.block_params,
            2.0 * model.embedding_params,
            2.0 * model.head_params,
        )

    def slowest_pair(self, nodes: list[int]) -> float:
        """The bandwidth of the slowest pair of holders on these nodes (two or more)."""
        bw = math.inf
        seen: set[int] = set()
        for n in nodes:
            if n in seen:
                if self.intra[n] < bw:
                    bw = self.intra[n]
            else:
                seen.add(n)
        if len(seen) > 1:
            count: dict[int, int] = {}
            for n in seen:
                a = self.profile[n]
                count[a] = count.get(a, 0) + 1
            pbw = self.pbw
            present = list(count)
            for i, a in enumerate(present):
                if count[a] > 1 and pbw[a][a] < bw:
                    bw = pbw[a][a]
                for b in present[i + 1 :]:
                    if pbw[a][b] < bw:
                        bw = pbw[a][b]
        return bw

    def time_s(self, pipes: list[Pipe]) -> float:
        D = len(pipes)
        if D <= 1:
            return 0.0
        bounds = [p.bounds for p in pipes]
        cuts = sorted(set().union(*bounds))
        # at[x]: the sync of blocks 0..x-1, each at its run's bandwidth
        at, paid, cursor = {0: 0.0}, 0.0, [0] * D
        for j in range(len(cuts) - 1):
            a = cuts[j]
            nodes, tmin = [], math.inf
            for i in range(D):
                b, k = bounds[i], cursor[i]
                while b[k + 1] <= a:
                    k += 1
                cursor[i] = k
                g = pipes[i].groups[k]
                nodes.append(g.node)
                if g.t < tmin:
                    tmin = g.t
            paid += (cuts[j + 1] - a) * self.block / (tmin * self.slowest_pair(nodes))
            at[cuts[j + 1]] = paid
        firsts = [p.groups[0] for p in pipes]
        lasts = [p.groups[-1] for p in pipes]
        emb = self.embedding / (min([g.t for g in firsts]) * self.slowest_pair([g.node for g in firsts]))
        head = self.head / (min([g.t for g in lasts]) * self.slowest_pair([g.node for g in lasts]))
        worst = 0.0
        for b in set(bounds):
            S = len(b) - 1
            for k in range(S):
                stage = at[b[k + 1]] - at[b[k]] + (emb if k == 0 else 0.0) + (head if k == S - 1 else 0.0)
                if stage > worst:
                    worst = stage
        return 2 * (D - 1) / D * worst
