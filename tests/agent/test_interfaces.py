"""Which network a process group takes (links.py), by table; an emulated network refused
plainly where it cannot be made; and what a killed run left removed by the next."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from drover.agent.runtime.links import bound_to, interface_for
from drover.cli import netem
from drover.cli.netem import NetworkEmulation, NetworkError, remove_stale
from drover.planner.network import load_network

from support import ROOT

LAYOUT = {
    "ib-0": {"ib": "infiniband", "eth": "ethernet"},
    "ib-1": {"ib": "infiniband", "eth": "ethernet"},
    "roce-0": {"roce": "roce", "eth": "ethernet"},
    "both": {"ib": "infiniband", "roce": "roce", "eth": "ethernet"},
    "island": {"eth2": "ethernet"},
}


@pytest.mark.parametrize(
    "nodes, interface",
    [
        ({"ib-0"}, "lo"),  # a TP group, or replicas on one node
        ({"ib-0", "ib-1"}, "ib"),
        ({"ib-0", "roce-0"}, "eth"),  # InfiniBand and RoCE meet on Ethernet
        ({"both", "roce-0"}, "roce"),
        ({"both", "ib-0", "ib-1"}, "ib"),
        ({"ib-0", "island"}, None),  # nothing shared: gloo's default
        ({"ib-0", "elsewhere"}, None),  # a node the layout does not know
    ],
)
def test_a_group_takes_the_network_its_nodes_share(nodes, interface):
    assert interface_for(nodes, LAYOUT) == interface


def test_without_an_emulated_network_every_group_takes_gloos_default():
    assert interface_for({"a", "b"}, {}) is None


def test_bound_to_sets_gloos_interface_while_a_group_is_made(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth")
    with bound_to("ib"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "ib"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    with bound_to("lo"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_an_emulated_network_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetworkError, match="needs root"):
        with NetworkEmulation(*load_network(ROOT / "examples" / "clusters" / "ib-roce-eth.yaml")):
            pass


def _dead_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and ip")
@pytest.mark.usefixtures("network_namespaces")
def test_what_a_killed_run_left_is_removed_and_a_live_runs_is_kept():
    """remove_stale, on real namespaces and a veth: a name whose PID is gone is deleted (a
    namespace, or an uplink ending in -cp), one of a live process stays."""
    dead, live = f"drv{_dead_pid()}", f"drv{os.getppid()}"
    for name in (f"{dead}-n1", f"{live}-n1"):
        subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "link", "add", f"{dead}-cp", "type", "veth", "peer", "name", f"{dead}-pe"], check=True)
    try:
        remove_stale()
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"{dead}-n1" not in namespaces and f"{live}-n1" in namespaces
        gone = subprocess.run(["ip", "link", "show", f"{dead}-cp"], capture_output=True)
        assert gone.returncode != 0
    finally:
        for name in (f"{live}-n1", f"{dead}-n1", f"{dead}-cp"):
            netem._delete(name)
