"""Which network a process group's traffic takes, as Holmes lays it out: a
group whose members' nodes all share an RDMA network (InfiniBand, or RoCE)
uses it; one within a node stays on the node (loopback); anything else takes
Ethernet, since InfiniBand and RoCE cannot speak RDMA to each other.

On CPU, gloo binds a process group to the interface GLOO_SOCKET_IFNAME names
when the group is created, so a group is made with that variable set to its
network's interface (`bound_to`). The layout comes from an emulated network
(cli/netem.py sets DROVER_NETWORK: node -> {network: type}); without one,
every group takes gloo's default interface. On CUDA, NCCL picks transports
itself.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

NETWORK_ENV = "DROVER_NETWORK"
PREFERRED = ("infiniband", "roce")


def network_layout() -> dict[str, dict[str, str]]:
    try:
        layout = json.loads(os.environ.get(NETWORK_ENV, "{}"))
    except ValueError:
        return {}
    return layout if isinstance(layout, dict) else {}


def interface_for(nodes: set[str], layout: dict[str, dict[str, str]]) -> str | None:
    """The interface a group of these nodes' workers talks on; None: gloo's default."""
    if not layout or not nodes or any(n not in layout for n in nodes):
        return None
    if len(nodes) == 1:
        return "lo"
    shared = set.intersection(*(set(layout[n]) for n in nodes))
    types = layout[next(iter(nodes))]
    for kind in PREFERRED:
        for name in sorted(shared):
            if types[name] == kind:
                return name
    return next((name for name in sorted(shared) if types[name] == "ethernet"), None)


@contextmanager
def bound_to(interface: str | None):
    """GLOO_SOCKET_IFNAME set to `interface` while a group is made (then as it was)."""
    if interface is None:
        yield
        return
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before
