"""Random neighbours of a local search's state (walk_state.State), each a walk_space.Change.

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

Moves are drawn at random, half of them on a critical pipeline (the one that finishes last)
and most device moves on a straggler.
"""

from __future__ import annotations

import math
import random

from .walk_space import Change, Group, Pipe, Space
from .walk_state import State

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
            return st.micro[p]
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
            b, groups = pipe.bounds, pipe.groups
            S = len(groups)
            k = max(range(S), key=lambda k: (b[k + 1] - b[k]) / (groups[k].t * groups[k].speed) + (k == S - 1) * 1e-30)
            return p, k
        return p, self.rng.randrange(len(pipe.groups))

    def _device(self, st: State) -> str | None:
        used = [d for d in self.slow if d in st.where]
        if used and self.rng.random() < 0.6:
            return self.rng.choice(used[: max(1, min(len(used), 16))])
        p, k = self._stage(st)
        return self.rng.choice(st.pipes[p].groups[k].devices)

    # -- moves ------------------------------------------------------------------------------

    def _boundary(self, st: State) -> tuple[int, Pipe, int] | None:
        """A pipeline and one of its stage boundaries (the index of the stage after it); None
        if it has one stage."""
        p = self._pipe_index(st)
        pipe = st.pipes[p]
        if len(pipe.groups) < 2:
            return None
        return p, pipe, self.rng.randrange(1, len(pipe.groups))

    def _shift(self, st: State) -> Change | None:
        if (at := self._boundary(st)) is None:
            return None
        p, pipe, i = at
        delta = self.rng.choice((-1, 1)) * (1 if self.rng.random() < 0.7 else self.rng.randint(2, 4))
        b = list(pipe.bounds)
        b[i] += delta
        if not (b[i - 1] < b[i] < b[i + 1]):
            return None
        b = tuple(b)
        targets = same_shape(st, p) if self.rng.random() < 0.4 else [p]
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
        return Change("rebalance", {q: Pipe(st.pipes[q].groups, new.bounds) for q in same_shape(st, p)})

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
        if (at := self._boundary(st)) is None:
            return None
        p, pipe, cut = at
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


def shape(pipe: Pipe) -> tuple:
    """What pipelines alike share: block bounds, and their groups' sizes and speeds."""
    return pipe.bounds, tuple([(g.t, g.speed) for g in pipe.groups])


def same_shape(st: State, p: int) -> list[int]:
    """The pipelines of pipeline p's shape (p among them)."""
    sig = shape(st.pipes[p])
    return [q for q, other in enumerate(st.pipes) if other.bounds == sig[0] and shape(other) == sig]


def _put(groups: tuple[Group, ...], k: int, g: Group) -> tuple[Group, ...]:
    return groups[:k] + (g,) + groups[k + 1 :]
