"""The cluster: nodes, GPUs, NICs, straggling rates, and link bandwidths.

Implements section 1 of the reference cost model. Everything here is pure
data; bandwidths are in bytes/s per GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from .errors import SpecError
from .spec_io import Fields, load_mapping

RDMA_TYPES = ("infiniband", "roce")
GBPS = 1e9 / 8  # bytes/s in one Gbps
GIB = 2**30
# What a cluster file may describe, so that planning it is bounded work: as many devices as the
# largest job the control plane plans (control_plane.running.MAX_JOB_DEVICES), as many on a node
# as an agent may report, and figures from a thousandth of a unit to a thousand times today's
# hardware (the cost model divides by them: at 5e-324 Gbps a step time overflowed to inf, and
# inf - inf made a division by zero).
MAX_DEVICES = 16_384
MAX_NODE_GPUS = 1024
MAX_NICS = 64
MIN_FIGURE, MAX_FIGURE = 1e-3, 1e6  # TFLOP/s, GiB, Gbps
MAX_RATE = 1e6  # past a millionfold, a device is as good as failed (rate inf)


@dataclass(frozen=True)
class Gpu:
    name: str
    tflops: float
    memory_gib: float


@dataclass(frozen=True)
class Nic:
    type: str  # one of RDMA_TYPES
    gbps: float
    count: int = 1


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int
    gpu: Gpu
    intra_gbps: float
    ethernet_gbps: float
    nics: tuple[Nic, ...] = ()

    @property
    def intra_bw(self) -> float:
        return self.intra_gbps * GBPS

    @property
    def eth_bw(self) -> float:
        return self.ethernet_gbps * GBPS / self.gpus

    def rdma_bw(self, nic_type: str) -> float:
        return sum(n.gbps * n.count for n in self.nics if n.type == nic_type) * GBPS / self.gpus

    @cached_property
    def rdma_types(self) -> frozenset[str]:
        return frozenset(n.type for n in self.nics)

    @cached_property
    def nic_class(self) -> str:
        """The network a node's data-parallel traffic can use at RDMA speed."""
        return "+".join(sorted(self.rdma_types)) or "ethernet"


@dataclass(frozen=True)
class Device:
    id: str
    node: int  # index into Cluster.nodes
    index: int
    rate: float  # 1.0 healthy, >1 slower, inf failed

    @property
    def failed(self) -> bool:
        return math.isinf(self.rate)


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    rates: dict[str, float] = field(default_factory=dict, hash=False)
    defaults: dict = field(default_factory=dict, hash=False, repr=False)  # for nodes that join later

    @cached_property
    def pair_bw_memo(self) -> dict[tuple, float]:
        """cost.min_pair_bw's answers for this cluster (it is immutable)."""
        return {}

    @cached_property
    def hops_memo(self) -> dict[tuple[int, ...], tuple[float, ...]]:
        """A pipeline's link bandwidths between consecutive stages, by its stages' nodes."""
        return {}

    @cached_property
    def group_memo(self) -> dict[tuple, object]:
        """grouping.group_of's groups for this cluster: (device ids, mfu) -> Group."""
        return {}

    @cached_property
    def runs_memo(self) -> dict[tuple[int, ...], tuple]:
        """orchestration.network_runs's answers: a pipeline's runs of stages on one network, by
        its stages' nodes."""
        return {}

    @cached_property
    def partition_memo(self) -> dict[int, object]:
        """orchestration's answers for this cluster, per model: id(model) -> orchestration._Memo."""
        return {}

    def forget_memos(self) -> None:
        """Let the memos above go (they fill again when asked)."""
        for name in ("pair_bw_memo", "hops_memo", "group_memo", "runs_memo", "partition_memo"):
            self.__dict__.pop(name, None)

    @cached_property
    def nic_order(self) -> dict[str, int]:
        """NIC classes (Node.nic_class), fastest data-parallel network first."""
        best: dict[str, float] = {}
        for n in self.nodes:
            bw = max([n.rdma_bw(t) for t in n.rdma_types] or [n.eth_bw])
            best[n.nic_class] = max(best.get(n.nic_class, 0.0), bw)
        return {c: r for r, c in enumerate(sorted(best, key=lambda c: (-best[c], c)))}

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        return tuple(
            Device(f"{n.name}/{j}", i, j, self.rates.get(f"{n.name}/{j}", 1.0))
            for i, n in enumerate(self.nodes)
            for j in range(n.gpus)
        )

    @cached_property
    def device_by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}

    @cached_property
    def usable(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if not d.failed)

    def speed(self, device: Device, mfu: float) -> float:
        """FLOP/s a device reaches: tflops * mfu / rate."""
        return self.nodes[device.node].gpu.tflops * 1e12 * mfu / device.rate

    def memory_bytes(self, device: Device) -> float:
        return self.nodes[device.node].gpu.memory_gib * GIB

    @cached_property
    def network_profiles(self) -> list[tuple]:
        """Per node, what its links depend on: two nodes with equal profiles link alike."""
        return [(n.eth_bw, tuple(sorted((t, n.rdma_bw(t)) for t in n.rdma_types))) for n in self.nodes]

    @cached_property
    def fastest_out_bw(self) -> tuple[float, ...]:
        """Per node, its fastest link to another node (inf alone): what any of its GPUs can sync
        with a GPU elsewhere at, at most."""
        reps: dict[tuple, list[int]] = {}
        for i, profile in enumerate(self.network_profiles):
            if len(reps.setdefault(profile, [])) < 2:
                reps[profile].append(i)
        others = [n for nodes in reps.values() for n in nodes]
        return tuple(
            max([self.link_bw(a, b) for b in others if b != a], default=math.inf) for a in range(len(self.nodes))
        )

    def link_bw(self, node_a: int, node_b: int) -> float:
        """Per-GPU bandwidth between devices on two nodes (the same node allowed)."""
        if node_a == node_b:
            return self._intra_bw[node_a]
        profile = self._profile_of
        return self._profile_bw[profile[node_a]][profile[node_b]]

    @cached_property
    def _intra_bw(self) -> list[float]:
        return [n.intra_bw for n in self.nodes]

    @cached_property
    def _profile_of(self) -> list[int]:
        """Per node, the index of its network profile (nodes of one profile link alike)."""
        index: dict[tuple, int] = {}
        return [index.setdefault(profile, len(index)) for profile in self.network_profiles]

    @cached_property
    def _profile_bw(self) -> list[list[float]]:
        """Between two nodes of these profiles (not the same node): the search asks 70,000 times
        at 64 GPUs, so a look-up in a list of lists, not a dict of pairs."""
        first: dict[int, int] = {}
        for node, profile in enumerate(self._profile_of):
            first.setdefault(profile, node)
        reps = [first[p] for p in range(len(first))]
        return [[self._compute_link_bw(a, b, other_node=True) for b in reps] for a in reps]

    def _compute_link_bw(self, a: int, b: int, other_node: bool = False) -> float:
        na, nb = self.nodes[a], self.nodes[b]
        if a == b and not other_node:
            return na.intra_bw
        common = na.rdma_types & nb.rdma_types
        if common:
            return max(min(na.rdma_bw(t), nb.rdma_bw(t)) for t in common)
        return min(na.eth_bw, nb.eth_bw)  # InfiniBand and RoCE cannot speak RDMA to each other

    def with_rates(self, rates: dict[str, float]) -> Cluster:
        for device, rate in rates.items():
            _check_rate("rates", device, rate, self.device_by_id)
        return replace(self, rates=dict(rates))

    def with_node(self, node: Node) -> Cluster:
        if node.name in self.node_index:
            raise SpecError(self.name, "nodes.name", node.name, "a node name not already in the cluster")
        return replace(self, nodes=self.nodes + (node,))


RATES_ALLOWED = f"a number >= 1.0 and <= {MAX_RATE:g}, or inf for a failed device"


def valid_rate(rate) -> bool:
    """A straggling rate as RATES_ALLOWED says."""
    number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
    return number and (1.0 <= rate <= MAX_RATE or rate == math.inf)


def _check_rate(source: str, device: str, rate, devices) -> None:
    if device not in devices:
        raise SpecError(source, f"rates.{device}", rate, "a device id NODE/INDEX of this cluster")
    if not valid_rate(rate):
        raise SpecError(source, f"rates.{device}", rate, RATES_ALLOWED)


def parse_rate(value):
    """Rates are numbers >= 1; YAML writes a failed device as `inf` (a string) or `.inf`."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", ".inf", "infinity"):
        return math.inf
    return value


_NODE_KEYS = {"name", "gpus", "gpu", "intra_gbps", "ethernet_gbps", "nics"}


def _parse_node(raw, defaults: dict, source: str, prefix: str) -> Node:
    f = Fields(raw, source, prefix)
    f.reject_unknown(_NODE_KEYS)
    f = Fields({**defaults, **raw}, source, prefix)  # a node's own keys win
    g = f.mapping("gpu")
    g.reject_unknown({"name", "tflops", "memory_gib"})
    gpu = Gpu(g.string("name"), _figure(g, "tflops"), _figure(g, "memory_gib"))
    nics = []
    raw_nics = f.items("nics", [])
    if len(raw_nics) > MAX_NICS:
        raise f.error("nics", f"{len(raw_nics)} entries", f"at most {MAX_NICS}")
    for i, raw_nic in enumerate(raw_nics):
        n = Fields(raw_nic, source, f"{f.path('nics')}[{i}]")
        n.reject_unknown({"type", "gbps", "count"})
        nic_type = n.string("type")
        if nic_type not in RDMA_TYPES:
            raise n.error("type", nic_type, f"one of {', '.join(RDMA_TYPES)} (Ethernet is ethernet_gbps)")
        nics.append(Nic(nic_type, _figure(n, "gbps"), n.integer("count", 1, maximum=MAX_NICS)))
    return Node(
        name=f.string("name"),
        gpus=f.integer("gpus", maximum=MAX_NODE_GPUS),
        gpu=gpu,
        intra_gbps=_figure(f, "intra_gbps"),
        ethernet_gbps=_figure(f, "ethernet_gbps"),
        nics=tuple(nics),
    )


def _figure(f: Fields, key: str) -> float:
    return f.number(key, minimum=MIN_FIGURE, exclusive=False, maximum=MAX_FIGURE)


def cluster_from_dict(data: dict, source: str = "cluster") -> Cluster:
    f = Fields(data, source)
    f.reject_unknown({"name", "defaults", "nodes", "rates", "networks"})  # networks: an emulation's (network.py)
    defaults = f.mapping("defaults", {}).data
    Fields(defaults, source, "defaults").reject_unknown(_NODE_KEYS - {"name"})
    raw_nodes = f.items("nodes")
    if not raw_nodes:
        raise f.error("nodes", raw_nodes, "a non-empty list of nodes")
    if len(raw_nodes) > MAX_DEVICES:
        raise f.error("nodes", f"{len(raw_nodes)} nodes", f"at most {MAX_DEVICES} devices in all")
    nodes = [_parse_node(raw, defaults, source, f"nodes[{i}]") for i, raw in enumerate(raw_nodes)]
    if (devices := sum(n.gpus for n in nodes)) > MAX_DEVICES:
        raise f.error("nodes", f"{devices} devices", f"at most {MAX_DEVICES} devices in all")
    seen = set()
    for i, node in enumerate(nodes):
        if node.name in seen or "/" in node.name:
            raise SpecError(source, f"nodes[{i}].name", node.name, "a unique node name without '/'")
        seen.add(node.name)
    cluster = Cluster(f.string("name", source), tuple(nodes), defaults=dict(defaults))
    rates = {str(k): parse_rate(v) for k, v in f.mapping("rates", {}).data.items()}
    for device, rate in rates.items():
        _check_rate(source, device, rate, cluster.device_by_id)
    return cluster.with_rates({k: float(v) for k, v in rates.items()})


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(load_mapping(path, "cluster"), str(path))


def node_from_dict(data: dict, cluster: Cluster, source: str = "node") -> Node:
    """A node described like a cluster file's node, with that cluster's defaults."""
    return _parse_node(data, cluster.defaults, source, "node")
