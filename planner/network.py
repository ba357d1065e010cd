"""An emulated multi-network cluster: a cluster file with `networks`, the named
networks its nodes' NICs are joined into (`drover up --network FILE`).

    networks:
      ib:   {type: infiniband, nodes: [ib-0, ib-1]}
      roce: {type: roce, nodes: [roce-0, roce-1]}
      eth:  {type: ethernet, nodes: all}

A node's link into an RDMA network runs at its NICs of that type (gbps x
count); into the Ethernet network at its ethernet_gbps. The planner reads the
same file as its cluster (it ignores `networks`). Pure: parsing and checks;
cli/netem.py builds the namespaces, veths and qdiscs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .cluster import RDMA_TYPES, Cluster, Node, cluster_from_dict
from .errors import SpecError
from .spec_io import Fields, load_mapping

NETWORK_TYPES = (*RDMA_TYPES, "ethernet")
# The network's name is its interface's name in each node's namespace: short, plain.
NETWORK_NAME = re.compile(r"[a-z][a-z0-9]{0,7}")
MAX_DELAY_MS = 1000.0


@dataclass(frozen=True)
class Network:
    name: str
    type: str  # infiniband | roce | ethernet
    nodes: tuple[str, ...]
    delay_ms: float = 0.0

    def gbps(self, node: Node) -> float:
        """The node's link into this network."""
        if self.type == "ethernet":
            return node.ethernet_gbps
        return sum(n.gbps * n.count for n in node.nics if n.type == self.type)


def networks_from_dict(data: dict, cluster: Cluster, source: str = "network") -> tuple[Network, ...]:
    f = Fields(data, source)
    raw = f.mapping("networks")
    if not raw.data:
        raise f.error("networks", raw.data, "a mapping of network names to {type, nodes}")
    names = [n.name for n in cluster.nodes]
    out = []
    for name in raw.data:
        n = raw.mapping(name)
        if not isinstance(name, str) or not NETWORK_NAME.fullmatch(name):
            raise raw.error(str(name), n.data, "a network name of 1 to 8 lower-case letters and digits")
        n.reject_unknown({"type", "nodes", "delay_ms"})
        kind = n.string("type")
        if kind not in NETWORK_TYPES:
            raise n.error("type", kind, f"one of {', '.join(NETWORK_TYPES)}")
        members = n.get("nodes")
        if members == "all":
            members = names
        if not (isinstance(members, list) and members and all(isinstance(m, str) for m in members)):
            raise n.error("nodes", members, "a non-empty list of node names, or all")
        for member in members:
            if member not in names:
                raise n.error("nodes", member, f"a node of the cluster ({', '.join(names)})")
        if len(set(members)) != len(members):
            raise n.error("nodes", members, "each node once")
        network = Network(name, kind, tuple(members), n.number("delay_ms", 0.0, exclusive=False, maximum=MAX_DELAY_MS))
        for member in members:
            if kind in RDMA_TYPES and network.gbps(cluster.nodes[cluster.node_index[member]]) <= 0:
                raise n.error("nodes", member, f"nodes with a {kind} NIC (in the node's nics)")
        out.append(network)
    ethernet = [w for w in out if w.type == "ethernet"]
    if len(ethernet) != 1 or set(ethernet[0].nodes) != set(names):
        raise f.error(
            "networks",
            sorted(w.name for w in ethernet),
            "one network of type ethernet with every node (InfiniBand and RoCE reach each other over it)",
        )
    for node in cluster.nodes:
        for nic_type in node.rdma_types:
            joined = [w.name for w in out if w.type == nic_type and node.name in w.nodes]
            if len(joined) != 1:
                allowed = f"one {nic_type} network for its {nic_type} NIC"
                raise SpecError(source, f"networks ({node.name})", joined, allowed)
    return tuple(out)


def load_network(path: str | Path) -> tuple[Cluster, tuple[Network, ...]]:
    """The cluster and its networks, from one file."""
    data = load_mapping(path, "network")
    cluster = cluster_from_dict(data, str(path))
    return cluster, networks_from_dict(data, cluster, str(path))
