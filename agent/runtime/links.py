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

import ctypes
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

NETWORK_ENV = "DROVER_NETWORK"
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Namespaces:
    """Where a local run's workers live in an emulated network (drover train and the
    benchmarks; agents are started inside theirs): each node's network namespace, rank 0's
    address there (the rendezvous), and the environment (gloo's interface, the layout)."""

    of_node: dict[str, str]
    master_host: str
    env: dict[str, str] = field(default_factory=dict)


def enter_namespace(name: str) -> None:
    """Move this process (its calling thread, and every thread it starts later) into network
    namespace NAME, as `ip netns exec` does; before any socket is made."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{name}") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name}: {os.strerror(errno)}")


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
