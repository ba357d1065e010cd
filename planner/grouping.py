"""Phase 1: GPU grouping.

Tensor-parallel groups live inside one node. A group runs at the pace of its
slowest member, so stragglers are grouped with stragglers of a similar rate:
one slow GPU then slows a small group instead of seven healthy ones. Groups may
differ in size within one plan. GPUs whose rate is past a cut are removed (the
search tries several cuts and keeps the one the cost model prefers); failed
GPUs are never used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cluster import Cluster, Device
from .model import ModelSpec


@dataclass(frozen=True)
class Group:
    devices: tuple[str, ...]
    node: int
    speed: float  # FLOP/s of its slowest member
    memory: float  # bytes of its smallest member
    rate: float  # of its slowest member
    intra_bw: float  # bytes/s between its members (they share a node)
    t: int = field(init=False, compare=False)  # its size, read in every inner loop of the search
    kind: tuple = field(init=False, compare=False)  # what a stage's cost depends on, but its node
    _hash: int = field(init=False, compare=False, repr=False)  # local search hashes layouts of groups

    def __post_init__(self) -> None:
        object.__setattr__(self, "t", len(self.devices))
        object.__setattr__(self, "kind", (self.t, self.speed, self.memory, self.intra_bw))
        object.__setattr__(self, "_hash", hash((self.devices, self.node, self.speed, self.memory, self.rate)))

    def __hash__(self) -> int:
        return self._hash


def group_of(cluster: Cluster, model: ModelSpec, ids: tuple[str, ...]) -> Group:
    """The group of these devices (of one node, in index order): made once per cluster, as the
    search forms the same groups many times."""
    key = (ids, model.mfu)
    group = cluster.group_memo.get(key)
    if group is None:
        members = [cluster.device_by_id[d] for d in ids]
        slowest = max(members, key=lambda d: d.rate)  # one node's GPUs differ in nothing else
        node = slowest.node
        group = cluster.group_memo[key] = Group(
            devices=ids,
            node=node,
            speed=cluster.speed(slowest, model.mfu),
            memory=cluster.memory_bytes(slowest),
            rate=slowest.rate,
            intra_bw=cluster.link_bw(node, node),
        )
    return group


def tp_degrees(cluster: Cluster, model: ModelSpec) -> list[int]:
    """Tensor-parallel sizes this model splits into (rule 6: any size dividing heads,
    ffn_hidden and kv_heads, powers of two or not), up to a node's GPUs."""
    biggest = max(n.gpus for n in cluster.nodes)
    return [t for t in range(1, biggest + 1) if model.tp_divides(t)]


def _largest_size(count: int, tp: int, sizes: list[int]) -> int:
    return max(s for s in sizes if s <= min(count, tp))


def _group_count(count: int, tp: int, sizes: list[int]) -> int:
    """How many groups `count` alike GPUs make, largest valid size up to `tp` first."""
    groups = 0
    while count:
        count -= _largest_size(count, tp, sizes)
        groups += 1
    return groups


def _packed_size(count: int, tp: int, sizes: list[int]) -> int:
    """The first group's size when `count` alike GPUs make fewer groups with one of them up to
    half as wide again as `tp` (7 GPUs at TP 4 with TP 5 valid: 5 + 2, not 4 + 2 + 1); 0 when
    no such group makes fewer."""
    fewest, best = _group_count(count, tp, sizes), 0
    for size in (s for s in sizes if tp < s <= min(count, 1.5 * tp)):
        if (groups := 1 + _group_count(count - size, tp, sizes)) < fewest:
            fewest, best = groups, size
    return best


def form_groups(
    cluster: Cluster,
    model: ModelSpec,
    tp: int,
    split_ratio: float = math.inf,
    remove_from_rate: float = math.inf,
    left_out: frozenset[int] = frozenset(),
    widen: bool = False,
    narrow_slower_networks: bool = False,
    pack: bool = False,
) -> tuple[list[Group], list[str]]:
    """Groups of (up to) `tp` GPUs per node, and the ids of GPUs left out.

    Within a node GPUs are taken fastest first; a group closes early when the
    next GPU is more than `split_ratio` times slower than the group's first,
    so stragglers start groups of their own. GPUs with rate >=
    `remove_from_rate` are removed, and so are those of the nodes `left_out`.
    `widen`: slow GPUs of one rate make groups up to `tp` x rate wide, as fast
    as a healthy group (a node slowed 2x as one TP8 group beside TP4 ones).
    `pack`: alike GPUs that `tp` does not divide (a node with a failed GPU) make fewer groups,
    one of them wider, where a valid size allows it (7 GPUs: 5 + 2, not 4 + 2 + 1): a stage fewer.
    Group sizes are always valid TP sizes.
    """
    sizes = tp_degrees(cluster, model)
    largest = [0] + [_largest_size(n, n, sizes) for n in range(1, max(n.gpus for n in cluster.nodes) + 1)]
    groups: list[Group] = []
    removed: list[str] = []
    by_node: dict[int, list[Device]] = {}
    for d in cluster.devices:
        if d.rate >= remove_from_rate or d.failed or d.node in left_out:
            if not d.failed:
                removed.append(d.id)
            continue
        by_node.setdefault(d.node, []).append(d)
    fastest = min(cluster.nic_order.values())
    for node, devices in by_node.items():
        devices.sort(key=lambda d: (d.rate, d.index))
        own = tp
        if narrow_slower_networks and cluster.nic_order[cluster.nodes[node].nic_class] != fastest:
            own = max(1, tp // 2)
        i = 0
        while i < len(devices):
            wide = max(own, round(own * devices[i].rate)) if widen else own
            alike = 1  # sorted by rate: the GPUs from i on within split_ratio of the first
            while i + alike < len(devices) and devices[i + alike].rate <= devices[i].rate * split_ratio:
                alike += 1
            size = largest[min(alike, wide)]  # the largest valid size up to both
            if pack and alike > wide and alike % wide:  # else the groups up to `wide` are fewest
                size = _packed_size(alike, wide, sizes) or size
            members = sorted(devices[i : i + size], key=lambda d: d.index)
            groups.append(group_of(cluster, model, tuple(d.id for d in members)))
            i += size
    return groups, removed
