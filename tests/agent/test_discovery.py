"""What an agent says its node has: NICs read from sysfs (InfiniBand by type, RoCE by its
port's link layer, the rest Ethernet), or an emulated node's paced devices and NICs from a
cluster file, and how the control plane turns either into the planner's node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from drover.agent.discovery import emulated, nics
from drover.control_plane.planning import cluster_of
from drover.planner.cluster import cluster_from_dict

EMULATED = cluster_from_dict(
    {
        "name": "mixed",
        "defaults": {
            "gpus": 2,
            "gpu": {"name": "paced", "tflops": 0.004, "memory_gib": 80},
            "intra_gbps": 0.1,
            "ethernet_gbps": 1.0,
        },
        "nodes": [
            {"name": "ib-0", "nics": [{"type": "infiniband", "gbps": 8}]},
            {"name": "roce-0", "nics": [{"type": "roce", "gbps": 4, "count": 2}]},
        ],
        "rates": {"ib-0/1": 2.5, "roce-0/0": "inf"},
    }
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_nics_from_sysfs(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "infiniband"
    write(net / "lo" / "type", "772")
    write(net / "ib0" / "type", "32")
    write(net / "ib0" / "speed", "200000")
    write(net / "ens1" / "type", "1")
    write(net / "ens1" / "speed", "100000")
    write(net / "eth0" / "type", "1")
    write(net / "eth0" / "speed", "-1")
    write(ib / "mlx5_1" / "ports" / "1" / "link_layer", "Ethernet")
    write(ib / "mlx5_1" / "device" / "net" / "ens1" / "x", "")
    got = {n.name: (n.type, n.gbps) for n in nics(net, ib)}
    assert got == {"ib0": ("infiniband", 200.0), "ens1": ("roce", 100.0), "eth0": ("ethernet", 0.0)}


def test_an_emulated_node_is_what_its_cluster_file_says():
    devices, cards = emulated(EMULATED, "ib-0")
    assert [(d.id, d.kind, d.tflops, d.intra_gbps, d.rate) for d in devices] == [
        ("ib-0/0", "paced", 0.004, 0.1, 1.0),
        ("ib-0/1", "paced", 0.004, 0.1, 2.5),
    ]
    assert [(n.name, n.type, n.gbps) for n in cards] == [("ib0", "infiniband", 8.0), ("eth0", "ethernet", 1.0)]
    devices, cards = emulated(EMULATED, "roce-0")
    assert [d.id for d in devices] == ["roce-0/1"]  # a failed device is absent
    assert [n.name for n in cards] == ["roce0", "roce1", "eth0"]
    with pytest.raises(ValueError, match="'gpu-9' is not in cluster mixed"):
        emulated(EMULATED, "gpu-9")


def test_the_planner_sees_an_emulated_node_as_its_file_does():
    nodes = [(name, *emulated(EMULATED, name)) for name in ("ib-0", "roce-0")]
    planned = cluster_of(nodes)
    for got, want in zip(planned.nodes, EMULATED.nodes):
        assert got.intra_gbps == want.intra_gbps and got.ethernet_gbps == want.ethernet_gbps
        assert got.gpu.tflops == want.gpu.tflops
        assert {t: got.rdma_bw(t) * got.gpus for t in ("infiniband", "roce")} == {
            t: want.rdma_bw(t) * want.gpus for t in ("infiniband", "roce")
        }


def test_gpus_found_without_nvml_are_found_outside_the_agent():
    """Without NVML, torch counts the GPUs, in a process of the worker launcher: the agent
    keeps neither torch nor a CUDA context. None on this machine."""
    check = "import sys; from drover.agent import discovery; print(discovery.devices('n'), 'torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["[]", "False"], run.stdout + run.stderr
