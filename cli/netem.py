"""The emulated network of `drover up --network FILE`: one network namespace per
node, joined into the file's networks by veth pairs (a bridge per network, in
a hub namespace) and shaped with tc, so that traffic between nodes runs at the
rates the file gives, on the interface of the network it takes.

In node NODE's namespace, the interface into network NET is named NET and
labelled `drover:TYPE:GBPS` (its ifalias), which is how the agent's discovery
tells InfiniBand, RoCE and Ethernet apart here, as /sys/class/infiniband
does on real hosts. Network k's subnet is 10.213.k.0/24: node i (from 1) is
.i, and this machine's namespace joins the Ethernet network as .254, where
the control plane listens for the agents.

Needs root. Every name starts with drv<PID>, so a run removes all it made on
exit, and removes what an earlier run that was killed (its PID gone) left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from drover.agent.runtime.links import NETWORK_ENV, Namespaces
from drover.planner.cluster import Cluster
from drover.planner.network import Network

SUBNET = "10.213"
CONTROL_PLANE_HOST = 254
_OURS = re.compile(r"drv(\d+)-")


class NetworkError(RuntimeError):
    """The emulated network cannot be made here (no root, no ip or tc, a command refused)."""


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")


@dataclass
class NetworkEmulation:
    cluster: Cluster
    networks: tuple[Network, ...]

    def __post_init__(self):
        self.tag = f"drv{os.getpid()}"
        self.hub = f"{self.tag}-hub"
        self.uplink = f"{self.tag}-cp"  # this namespace's veth into the Ethernet network
        self.created: list[str] = []
        self.ethernet = next(k for k, w in enumerate(self.networks, 1) if w.type == "ethernet")

    def namespace(self, node: str) -> str:
        return f"{self.tag}-n{self.cluster.node_index[node] + 1}"

    def address(self, network: int, node: str) -> str:
        return f"{SUBNET}.{network}.{self.cluster.node_index[node] + 1}"

    @property
    def control_plane_host(self) -> str:
        return f"{SUBNET}.{self.ethernet}.{CONTROL_PLANE_HOST}"

    @property
    def ethernet_interface(self) -> str:
        return self.networks[self.ethernet - 1].name

    def layout(self) -> dict[str, dict[str, str]]:
        """Each node's networks and their types: NETWORK_ENV's value."""
        return {n.name: {w.name: w.type for w in self.networks if n.name in w.nodes} for n in self.cluster.nodes}

    def environment(self) -> dict[str, str]:
        """What an agent in a node's namespace runs with: gloo's default interface is Ethernet."""
        return {"GLOO_SOCKET_IFNAME": self.ethernet_interface, NETWORK_ENV: json.dumps(self.layout())}

    def namespaces(self, rank0_node: str) -> Namespaces:
        """For workers started here (drover train, benchmarks): each enters its node's namespace."""
        return Namespaces(
            {n.name: self.namespace(n.name) for n in self.cluster.nodes},
            self.address(self.ethernet, rank0_node),
            self.environment(),
        )

    def command(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(node)]

    def __enter__(self) -> NetworkEmulation:
        if os.geteuid() != 0:
            raise NetworkError("an emulated network needs root (ip netns, veth pairs and tc)")
        remove_stale()
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _create(self) -> None:
        self._namespace(self.hub)
        for k, _ in enumerate(self.networks, 1):
            _run("ip", "-n", self.hub, "link", "add", f"br{k}", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", f"br{k}", "up")
        for i, node in enumerate(self.cluster.nodes, 1):
            ns = self.namespace(node.name)
            self._namespace(ns)
            for k, network in enumerate(self.networks, 1):
                if node.name not in network.nodes:
                    continue
                peer = f"n{i}x{k}"
                veth = ["type", "veth", "peer", "name", peer, "netns", self.hub]
                _run("ip", "link", "add", network.name, "netns", ns, *veth)
                _run("ip", "-n", self.hub, "link", "set", peer, "master", f"br{k}", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.address(k, node.name)}/24", "dev", network.name)
                gbps = network.gbps(node)
                _run("ip", "-n", ns, "link", "set", network.name, "alias", f"drover:{network.type}:{gbps:g}")
                _run("ip", "-n", ns, "link", "set", network.name, "up")
                shape(ns, network.name, gbps, network.delay_ms)  # what the node sends
                shape(self.hub, peer, gbps, network.delay_ms)  # what it receives
        _run("ip", "link", "add", self.uplink, "type", "veth", "peer", "name", "cp", "netns", self.hub)
        self.created.append(self.uplink)
        _run("ip", "-n", self.hub, "link", "set", "cp", "master", f"br{self.ethernet}", "up")
        _run("ip", "addr", "add", f"{self.control_plane_host}/24", "dev", self.uplink)
        _run("ip", "link", "set", self.uplink, "up")

    def set_rate(self, network_name: str, node: str, gbps: float) -> None:
        """Shape node NODE's link into a network to `gbps` from now on, both ways (emulation of
        a link going slow: drover up --slow-link)."""
        k = next(k for k, w in enumerate(self.networks, 1) if w.name == network_name)
        delay = self.networks[k - 1].delay_ms
        i = self.cluster.node_index[node] + 1
        # replace, not change: a tbf changed while it holds packets can stop dequeuing for good
        # (seen here: every worker stuck in a recv); a new one drops them and TCP resends.
        shape(self.namespace(node), network_name, gbps, delay, "replace")
        shape(self.hub, f"n{i}x{k}", gbps, delay, "replace")

    def remove(self) -> None:
        """Delete what this run made (a namespace takes its veths and qdiscs with it)."""
        for name in reversed(self.created):
            # Seen once on a loaded machine (two test workers): a run exited 0 and left its
            # namespaces, the deletion's error not kept. So it is tried again for up to 5 s, and
            # what still fails is said.
            for _ in range(50):
                done = _delete(name)
                if done.returncode == 0 or not _exists(name):
                    break
                time.sleep(0.1)
            else:
                print(f"drover: could not remove {name}: {done.stderr.strip()}", file=sys.stderr)
        self.created.clear()


def shape(namespace: str, device: str, gbps: float, delay_ms: float, verb: str = "add") -> None:
    """Egress of `device` at `gbps` (a token bucket), after `delay_ms` (netem) if asked;
    verb "replace": a new bucket in place of the one there."""
    rate_kbit = max(int(gbps * 1e6), 8)
    burst = max(int(gbps * 1e9 / 8 / 100), 16 * 1024)  # 10 ms at the rate, at least a few packets
    parent = ["root", "handle", "2:"]
    if delay_ms and verb == "replace":
        parent = ["parent", "1:", "handle", "2:"]
    elif delay_ms:
        try:
            netem = ["handle", "1:", "netem", "delay", f"{delay_ms}ms"]
            _run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", *netem)
        except NetworkError as exc:
            raise NetworkError(f"delay_ms needs the kernel's netem qdisc, which this machine lacks ({exc})") from None
        parent = ["parent", "1:", "handle", "2:"]
    _run("tc", "-n", namespace, "qdisc", verb, "dev", device, *parent, "tbf", "rate", f"{rate_kbit}kbit",
         "burst", str(burst), "latency", "200ms")  # fmt: skip


def _is_uplink(name: str) -> bool:
    return name.endswith("-cp")  # every other name is a namespace's


def _namespaces() -> list[str]:
    """The network namespaces' names (`ip netns list` follows some with "(id: N)")."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _exists(name: str) -> bool:
    if _is_uplink(name):
        return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0
    return name in _namespaces()


def _delete(name: str) -> subprocess.CompletedProcess:
    """Delete a namespace (with its veths and qdiscs), or this machine's uplink."""
    command = ["ip", "link", "del", name] if _is_uplink(name) else ["ip", "netns", "del", name]
    return subprocess.run(command, capture_output=True, text=True)


def remove_stale() -> None:
    """Namespaces and uplinks of runs whose process is gone (killed before they could clean up)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [n for n in _namespaces() if _OURS.match(n)]
    names += [m.group(1) for m in re.finditer(r"^\d+: (drv\d+-cp)[@:]", links, re.M)]
    for name in names:
        pid = int(_OURS.match(name).group(1))
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _delete(name)
