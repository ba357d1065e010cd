"""The exact optimum of the reference cost model on small clusters: a test oracle.

Searches every valid plan of spec/cost-model.md (section 3) up to symmetries that
cannot change a plan's figures, cutting only branches a lower bound proves no
better than the best plan found, so a planner is measured against the true best
rather than against baselines. It uses the cost model's own functions and none
of the planner's heuristics.

Why the reductions are exact:
- Within a node, a TP group of t devices costs what its slowest member allows.
  For any plan, giving the node's groups (ordered by their slowest rate)
  consecutive runs of the node's fastest devices is never slower and changes
  nothing else, so per node only "use the k fastest, cut them into runs of these
  sizes" needs trying ("groupings"), and a grouping whose rates are all no
  better than another's with the same sizes is dropped.
- Groups of one node with one size and one slowest rate are interchangeable
  ("kinds"), nodes alike in hardware and rates are interchangeable, and
  pipelines are unordered: each multiset of pipelines is built once, in
  descending order of its (kind, blocks) stage list.
- For fixed pipelines the best micro-batch split is the greedy one (every
  pipeline's time grows with its micro-batches; memory caps how many it takes).
- Bounds: a pipeline with m micro-batches lasts at least m * (L + eta) / rho,
  rho being the sum of its groups' blocks per second; stage times and the
  gradient sync of the part already built only grow as the plan grows, and a
  group not yet placed will share some block with the pipelines already built.

The search runs per (pool of groups, number of pipelines D), best lower bound
first, after a quick dive through every such configuration (best child only)
has found a good plan to cut with. `optimum(..., check_bounds=True)` cuts
nothing and asserts every bound instead, to validate the oracle.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from drover.planner import cost
from drover.planner.cluster import Cluster
from drover.planner.model import ModelSpec
from drover.planner.plan import Pipeline, Plan, Stage

TIE = 1 - 1e-12  # bounds within float noise of the best are not cut


@dataclass(frozen=True)
class Kind:
    """Interchangeable TP groups: one node, one size, one slowest rate."""

    node: int
    t: int
    rate: float


def _compositions(k: int, sizes: list[int]):
    if k == 0:
        yield ()
        return
    for s in sizes:
        if s <= k:
            for rest in _compositions(k - s, sizes):
                yield (s, *rest)


def node_groupings(
    cluster: Cluster, model: ModelSpec, node: int, tp_sizes=None, keep_healthy: bool = False
) -> list[list[tuple[Kind, tuple[str, ...]]]]:
    """Every undominated way to group a node's devices: its k fastest cut into consecutive runs."""
    devices = sorted((d for d in cluster.usable if d.node == node), key=lambda d: (d.rate, d.index))
    sizes = [t for t in range(1, len(devices) + 1) if model.tp_divides(t) and (tp_sizes is None or t in tp_sizes)]
    healthy = sum(d.rate == 1.0 for d in devices) if keep_healthy else 0
    found: dict[tuple, list] = {}
    for k in range(healthy, len(devices) + 1):
        for comp in _compositions(k, sizes):
            groups, at = [], 0
            for s in comp:
                run = devices[at : at + s]
                at += s
                groups.append((Kind(node, s, run[-1].rate), tuple(d.id for d in run)))
            found.setdefault(tuple(sorted((g.t, g.rate) for g, _ in groups)), groups)

    def dominates(a: tuple, b: tuple) -> bool:  # same sizes, each rate no worse
        return a != b and [t for t, _ in a] == [t for t, _ in b] and all(x <= y for (_, x), (_, y) in zip(a, b))

    sigs = list(found)
    return [found[s] for s in sigs if not any(dominates(o, s) for o in sigs)]


class _Search:
    """Branch and bound over pools, pipeline counts, pipelines and their stages."""

    def __init__(self, cluster: Cluster, model: ModelSpec, tp_sizes=None, keep_healthy: bool = False):
        self.cluster, self.model = cluster, model
        self.tp_sizes, self.keep_healthy = tp_sizes, keep_healthy
        self.L, self.M = model.layers, model.micro_batches
        self.A, self.P = model.activation_bytes, model.block_params
        self.PE, self.PH = model.embedding_params, model.head_params
        self.best_step = math.inf
        self.best = None  # (groups by kind, [(stages [(kind, n)], m)])
        self.diving = False  # follow only the best-bound child: a quick first plan
        self.check = False  # cut nothing; assert every bound is below every plan under it
        self.lowers: list[float] = []
        self._mpb: dict[tuple, float] = {}

    # --- pools: one grouping per node -------------------------------------------------
    def pools(self):
        """Per class of identical nodes, a multiset of groupings (the nodes are interchangeable)."""
        c = self.cluster
        classes: dict[tuple, list[int]] = {}
        for i, n in enumerate(c.nodes):
            rates = tuple(sorted(d.rate for d in c.usable if d.node == i))
            classes.setdefault((n.gpus, n.gpu, n.intra_gbps, n.ethernet_gbps, n.nics, rates), []).append(i)
        per_class = []
        for nodes in classes.values():
            options = [node_groupings(c, self.model, i, self.tp_sizes, self.keep_healthy) for i in nodes]
            choices = itertools.combinations_with_replacement(range(len(options[0])), len(nodes))
            per_class.append([[options[j][x] for j, x in enumerate(pick)] for pick in choices])
        for combo in itertools.product(*per_class):
            groups = [g for cls in combo for grouping in cls for g in grouping]
            if groups:
                yield groups

    def load_pool(self, groups) -> list[tuple[float, int]]:
        """Set up the kinds of a pool; return (lower bound, D) for each feasible pipeline count D."""
        c, m = self.cluster, self.model
        by_kind: dict[Kind, list] = {}
        for kind, ids in groups:
            by_kind.setdefault(kind, []).append(ids)
        self.kinds = sorted(by_kind, key=lambda k: (k.node, k.t, k.rate))
        self.ids = [by_kind[k] for k in self.kinds]
        self.count = [len(x) for x in self.ids]
        self.node = [k.node for k in self.kinds]
        self.t = [k.t for k in self.kinds]
        speed = [c.speed(c.device_by_id[by_kind[k][0][-1]], m.mfu) for k in self.kinds]
        self.mem = [cost.MEMORY_HEADROOM * c.memory_bytes(c.device_by_id[by_kind[k][0][0]]) for k in self.kinds]
        self.w, self.h = [], []
        for k, kind in enumerate(self.kinds):
            one = cost.StageCost(kind.node, kind.t, speed[k], 0.0, 0, 1)
            self.w.append(cost.stage_compute_s(one, False, m, c))
            self.h.append(cost.stage_compute_s(one, True, m, c) - self.w[-1])
        self.rho = [1 / w for w in self.w]
        self.eta = min(h * r for h, r in zip(self.h, self.rho))
        N, L, M, K = sum(self.count), self.L, self.M, len(self.kinds)
        # Gradient sync with D >= 2: every group holds a block that a group of another
        # pipeline holds too, over a link no faster than the best from it to another
        # group (of another node, when its node has fewer groups than pipelines).
        self._holders: dict[tuple, tuple] = {}
        on_node = [sum(n for j, n in enumerate(self.count) if self.node[j] == self.node[k]) for k in range(K)]
        tmax = max(self.t)
        rho = sum(n * r for n, r in zip(self.count, self.rho))
        w_min, h_min, unit = min(self.w), min(self.h), (L + self.eta) / rho
        self.dp_pool = {1: 0.0}
        out = []
        for D in range(-(-N // L), min(N, M) + 1):
            T = max(M * unit, L * w_min + h_min + (M - D) * unit, max(self.w) + (L - 1) * w_min + h_min)
            if D > 1:
                links = []
                for k in range(K):
                    near = on_node[k] >= D
                    links.append(
                        max(
                            c.link_bw(self.node[k], self.node[j])
                            for j in range(K)
                            if self.count[j] - (j == k) > 0 and (near or self.node[j] != self.node[k])
                        )
                    )
                blocks = -(-L // (N - D + 1))  # some stage of the deepest pipeline holds this many
                worst = max(1 / (self.t[k] * links[k]) for k in range(K))
                dp = max(worst * self.P, max(self.PE + self.P, blocks * self.P) / (tmax * max(links)))
                self.dp_pool[D] = 2 * (D - 1) / D * 2 * dp
            out.append((T + self.dp_pool[D], D))
        return out

    # --- the search over pipelines, stage by stage ------------------------------------
    def search_pool(self, D: int):
        self.D = D
        self.rem = self.count[:]
        self.n_rem = sum(self.count)
        self.fixed: list[tuple] = []  # (first, each, mcap, stages [(kind, n)])
        self.cur: list[tuple[int, int]] = []
        self.saved: list[list] = []
        self.fixed_stack: list[list[float]] = []
        self.extend(0, None, 0.0, 0.0)

    def extend(self, start: int, prev_key, first: float, max_each: float):
        """Add a stage to the current pipeline (or start a new one when start == 0).

        Children are tried best bound first, so good plans turn up early and cut more."""
        L, cur = self.L, self.cur
        if start == 0:
            prev_key = self.fixed[-1][3] if self.fixed else None
        j = len(cur)
        tight = prev_key is not None and tuple(cur) == tuple(prev_key[:j])
        children = []
        for k in range(len(self.kinds)):
            if not self.rem[k]:
                continue
            if tight and k > prev_key[j][0]:
                break
            c = 0.0
            if cur:
                pk = cur[-1][0]
                c = 2 * self.A / (min(self.t[pk], self.t[k]) * self.cluster.link_bw(self.node[pk], self.node[k]))
            for n in range(L - start, 0, -1):
                if tight and (k, n) > prev_key[j]:
                    continue
                last = start + n == L
                base = cost.BYTES_PER_PARAM * (n * self.P + (j == 0) * self.PE + last * self.PH)
                if (base + n * self.model.block_activation_memory) / self.t[k] > self.mem[k]:
                    continue
                tau = n * self.w[k] + (self.h[k] if last else 0.0)
                state = (start + n, first + tau + c, max(max_each, tau, c))
                self.push(k, n)
                lower = self.value(state)
                self.pop(k)
                if lower < self.best_step * TIE or self.check:
                    children.append((lower, k, n, state))
        children.sort()
        for lower, k, n, state in children[: 1 if self.diving else None]:
            if lower >= self.best_step * TIE and not self.check:
                break
            self.lowers.append(lower)
            self.push(k, n)
            self.descend(state, prev_key)
            self.pop(k)
            self.lowers.pop()

    def push(self, k: int, n: int):
        self.cur.append((k, n))
        self.rem[k] -= 1
        self.n_rem -= 1

    def pop(self, k: int):
        self.cur.pop()
        self.rem[k] += 1
        self.n_rem += 1

    def close(self, state) -> bool:
        """Move the finished current pipeline to the fixed ones, if it can be finished so."""
        mcap = self.micro_cap(self.cur)
        left = self.D - len(self.fixed) - 1  # pipelines still to build
        if not mcap or self.n_rem < left or self.n_rem > left * self.L:
            return False
        self.fixed.append((state[1], state[2], mcap, tuple(self.cur)))
        self.fixed_stack.append(self.fixed_denominators())
        self.saved.append(self.cur)
        self.cur = []
        return True

    def reopen(self):
        self.fixed.pop()
        self.fixed_stack.pop()
        self.cur = self.saved.pop()

    def value(self, state) -> float:
        """A lower bound for a child state; the exact step time (recorded) for a full plan."""
        end, first, each = state
        if end < self.L:
            return self.bound(end, first, each) if self.n_rem else math.inf
        if not self.close(state):
            return math.inf
        if self.n_rem == 0:
            lower = self.leaf()
            assert not self.check or lower >= max(self.lowers, default=0.0) * (1 - 1e-9), "a bound cut a better plan"
        else:
            lower = self.bound(0, 0.0, 0.0)
        self.reopen()
        return lower

    def descend(self, state, prev_key):
        end, first, each = state
        if end < self.L:
            self.extend(end, prev_key, first, each)
        elif self.n_rem and self.close(state):
            self.extend(0, None, 0.0, 0.0)
            self.reopen()

    def micro_cap(self, stages) -> int:
        """The most micro-batches the pipeline's memory allows (0: not even one)."""
        S, m = len(stages), self.model
        for mb in range(min(S, self.M), 0, -1):
            if all(
                cost.stage_memory_bytes(n, k, S, mb, self.t[kind], m) <= self.mem[kind]
                for k, (kind, n) in enumerate(stages)
            ):
                return self.M if mb == min(S, self.M) else mb
        return 0

    def bound(self, end: int, cur_first: float, cur_each: float) -> float:
        """A lower bound on the step time of every completion of the current state.

        Times: the M-th micro-batch any pipeline can finish. A pipeline of groups with
        blocks/s rho lasts at least m * (L + eta) / rho, and at least its first pass
        L * w_min + h_min plus (m - 1) * (L + eta) / rho."""
        L, M = self.L, self.M
        live = [k for k in range(len(self.kinds)) if self.rem[k]]
        future = self.D - len(self.fixed) - bool(self.cur)
        rest = L - end if self.cur else 0
        if future < 0 or not future + bool(self.cur) <= self.n_rem <= rest + future * L:
            return math.inf
        events, floor = [], 0.0
        for first, each, mcap, _ in self.fixed:
            events.extend(first + i * each for i in range(mcap))
            floor = max(floor, first)
        if live:
            rho = sum(self.rem[k] * self.rho[k] for k in live)
            w_min, h_min, unit = min(self.w[k] for k in live), min(self.h[k] for k in live), (L + self.eta) / rho
            # The slowest group left holds a block in the current pipeline or a new one.
            w_max, slowest = max(self.w[k] for k in live), math.inf
            if self.cur:  # the rest of its blocks go to groups not yet placed
                first = cur_first + rest * w_min + h_min
                each = max(cur_each, (rest + self.eta) / rho)
                events.extend(first + i * each for i in range(M))
                floor = max(floor, first)
                slowest = first + w_max - w_min
            if future:
                first = L * w_min + h_min
                events.extend(max(i * unit, first + max(0, i - future) * unit) for i in range(1, M + 1))
                floor = max(floor, first)
                slowest = min(slowest, first + w_max - w_min)
            floor = max(floor, slowest)
        if len(events) < M:
            return math.inf
        events.sort()
        lower = max(floor, events[M - 1]) + self.dp_pool[self.D]
        if lower >= self.best_step * TIE and not self.check:
            return lower
        return lower - self.dp_pool[self.D] + max(self.dp_pool[self.D], self.dp_bound(live, future))

    def min_pair_bw(self, nodes: tuple) -> float:
        key = tuple(sorted(nodes))
        if key not in self._mpb:
            self._mpb[key] = cost.min_pair_bw(list(key), self.cluster)
        return self._mpb[key]

    def holders(self, kinds: tuple) -> tuple[float, list[float]]:
        """For a block held by groups of these kinds: tmin * bwr (inf for one holder), and
        per kind j an upper bound on that product once a group of kind j holds it too."""
        info = self._holders.get(kinds)
        if info is None:
            link = self.cluster.link_bw
            tmin = min(self.t[k] for k in kinds)
            bw = self.min_pair_bw(tuple(self.node[k] for k in kinds))
            per_kind = [
                min(tmin, self.t[j]) * min(bw, min(link(self.node[j], self.node[k]) for k in kinds))
                for j in range(len(self.kinds))
            ]
            info = self._holders[kinds] = (tmin * bw, per_kind)
        return info

    def fixed_denominators(self) -> list[float]:
        """Per kind j: the best tmin * bwr a group of kind j can get on a block the
        fixed (complete) pipelines hold; every such group holds at least one."""
        per_block = [[] for _ in range(self.L)]
        for *_, stages in self.fixed:
            at = 0
            for k, n in stages:
                for b in range(at, at + n):
                    per_block[b].append(k)
                at += n
        vectors = [self.holders(tuple(sorted(kinds)))[1] for kinds in per_block]
        return [max(v[j] for v in vectors) for j in range(len(self.kinds))]

    def dp_bound(self, live: list[int], future: int) -> float:
        """Section 4's T_dp over the stages built so far, as if there were D pipelines.

        Holders of a block and the factor only grow as the plan grows, so this never
        exceeds the finished plan's T_dp, and equals it for a complete plan. A holder
        still to come (a group not yet placed, in a pipeline not yet built or in the
        current one's remaining stages) counts at its best case."""
        if self.D < 2:
            return 0.0
        unit = 2 * (self.D - 1) / self.D * 2
        pipes = [s for *_, s in self.fixed] + ([self.cur] if self.cur else [])
        if not pipes:
            return 0.0
        held = [[] for _ in range(self.L)]
        where = [[] for _ in range(self.L)]
        for p, stages in enumerate(pipes):
            at = 0
            for s, (k, n) in enumerate(stages):
                for b in range(at, at + n):
                    held[b].append(k)
                    where[b].append((p, s))
                at += n
        end = at if self.cur else self.L

        def sync(params: int, kinds: list, more: bool) -> float:
            if not kinds:
                return 0.0
            both, per_kind = self.holders(tuple(sorted(kinds)))
            denominator = max(per_kind[j] for j in live) if more and live else both
            return unit * params / denominator

        paid = [[0.0] * len(stages) for stages in pipes]
        for b in range(self.L):
            v = sync(self.P, held[b], future > 0 or b >= end)
            for p, s in where[b]:
                paid[p][s] += v
        emb = sync(self.PE, [stages[0][0] for stages in pipes], future > 0)
        for row in paid:
            row[0] += emb
        if self.fixed:
            head = sync(self.PH, [stages[-1][0] for *_, stages in self.fixed], future > 0 or bool(self.cur))
            for row in paid[: len(self.fixed)]:
                row[-1] += head
        worst = max(max(row) for row in paid)
        if self.fixed and live:
            denominators = self.fixed_stack[-1]
            worst = max(worst, unit * self.P / min(denominators[j] for j in live))
        return worst

    def leaf(self):
        """Every group placed: the best micro-batch split, then the exact step time."""
        firsts = [f for f, *_ in self.fixed]
        eaches = [e for _, e, *_ in self.fixed]
        caps = [c for _, _, c, _ in self.fixed]
        D = len(self.fixed)
        if D > self.M or sum(caps) < self.M:
            return math.inf
        micro = [1] * D
        heap = [(firsts[p] + eaches[p], p) for p in range(D) if caps[p] > 1]
        heapq.heapify(heap)
        for _ in range(self.M - D):
            _, p = heapq.heappop(heap)
            micro[p] += 1
            if micro[p] < caps[p]:
                heapq.heappush(heap, (firsts[p] + micro[p] * eaches[p], p))
        slowest = max(f + (m - 1) * e for f, e, m in zip(firsts, eaches, micro))
        step = slowest + self.dp_bound([], 0)
        if step < self.best_step:
            self.best_step = step
            self.best = ([list(x) for x in self.ids], [(s, m) for (*_, s), m in zip(self.fixed, micro)])
        return step

    def plan(self) -> Plan:
        ids, pipes = self.best
        pools = [list(x) for x in ids]
        pipelines = []
        for stages, m in pipes:
            out, at = [], 0
            for kind, n in stages:
                out.append(Stage(pools[kind].pop(), (at, at + n)))
                at += n
            pipelines.append(Pipeline(m, tuple(out)))
        used = {d for p in pipelines for s in p.stages for d in s.devices}
        removed = tuple(sorted(d.id for d in self.cluster.usable if d.id not in used))
        m = self.model
        return Plan("optimum", m.global_batch, m.micro_batch, tuple(pipelines), removed)


def optimum(
    cluster: Cluster, model: ModelSpec, check_bounds: bool = False, tp_sizes=None, keep_healthy: bool = False
) -> tuple[Plan | None, float]:
    """The best valid plan and its samples/s (evaluate's figure); (None, 0.0) if none fits.

    check_bounds: search without cutting anything and assert that every lower bound
    holds for every plan below it (slow: for validating the oracle on small cases).
    tp_sizes, keep_healthy: restrict the plans (only these TP sizes; never remove a
    device of rate 1), to tell which freedom a planner's gap comes from."""
    search = _Search(cluster, model, tp_sizes, keep_healthy)
    pools = list(search.pools())
    configs = sorted((lower, D, i) for i, g in enumerate(pools) for lower, D in search.load_pool(g))
    if check_bounds:
        search.check = True
        for lower, D, i in configs:
            search.load_pool(pools[i])
            search.lowers = [lower]
            search.search_pool(D)
        configs = []
    search.diving = True
    for lower, D, i in configs:
        if lower >= search.best_step * TIE:
            break
        search.load_pool(pools[i])
        search.search_pool(D)
    search.diving = False
    for lower, D, i in configs:
        if lower >= search.best_step * TIE:
            break
        search.load_pool(pools[i])
        search.search_pool(D)
    if search.best is None:
        return None, 0.0
    plan = search.plan()
    cost.validate(plan, cluster, model)
    return cost.with_prediction(plan, cluster, model), cost.evaluate(plan, cluster, model).samples_per_s
