"""What a node has: accelerators (NVML through nvidia-ml-py where present,
else torch, else a configured number of CPU devices) and NICs (from
/sys/class/net and /sys/class/infiniband: type, speed, byte counters); or,
for an emulated node, what its cluster file says (`emulated`): paced
devices timed as the file's GPUs, and the file's NICs."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from drover.planner.cluster import Cluster

from .runtime.handoff import run_in_launcher

CPU_TFLOPS = 0.05  # a rough peak for one CPU worker; only ratios between devices matter to the planner
SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class DeviceInfo:
    id: str
    kind: str
    name: str
    memory_gib: float
    tflops: float
    intra_gbps: float = 0.0  # to the node's other devices, where known (emulated nodes)
    rate: float = 1.0  # an emulated device's slowness from the start (the cluster file's rates)


@dataclass(frozen=True)
class NicInfo:
    name: str
    type: str  # infiniband | roce | ethernet
    gbps: float
    address: str = ""  # its IPv4 address where it has one (link probes reach the node there)
    emulated: bool = False  # an emulated network's interface (labelled by cli/netem.py)


def emulated(cluster: Cluster, node: str) -> tuple[list[DeviceInfo], list[NicInfo]]:
    """Node NODE of an emulated cluster: a paced device per GPU the file gives it (a failed one,
    rate inf, absent), its RDMA NICs and one Ethernet NIC at the file's ethernet_gbps."""
    index = cluster.node_index.get(node)
    if index is None:
        raise ValueError(f"node {node!r} is not in cluster {cluster.name} ({', '.join(n.name for n in cluster.nodes)})")
    spec = cluster.nodes[index]
    devices = [
        DeviceInfo(d.id, "paced", spec.gpu.name, spec.gpu.memory_gib, spec.gpu.tflops, spec.intra_gbps, d.rate)
        for d in cluster.devices
        if d.node == index and not d.failed
    ]
    short = {"infiniband": "ib", "roce": "roce"}
    nics = [NicInfo(f"{short[n.type]}{i}", n.type, n.gbps) for n in spec.nics for i in range(n.count)]
    return devices, [*nics, NicInfo("eth0", "ethernet", spec.ethernet_gbps)]


def devices(node: str, cpu_devices: int = 0) -> list[DeviceInfo]:
    if cpu_devices:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / cpu_devices
        return [DeviceInfo(f"{node}/{i}", "cpu", "cpu", round(memory, 2), CPU_TFLOPS) for i in range(cpu_devices)]
    try:
        import pynvml  # nvidia-ml-py, optional

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            out.append(DeviceInfo(f"{node}/{i}", "cuda", str(name), memory, 0.0))
        return out
    except Exception:  # noqa: BLE001 - no NVML: fall back to torch
        pass
    # In a process of the worker launcher: torch and a CUDA context stay out of the agent.
    return run_in_launcher(cuda_devices, node)


def cuda_devices(node: str) -> list[DeviceInfo]:
    import torch

    return [
        DeviceInfo(
            f"{node}/{i}",
            "cuda",
            torch.cuda.get_device_name(i),
            torch.cuda.get_device_properties(i).total_memory / 2**30,
            0.0,
        )
        for i in range(torch.cuda.device_count())
    ]


def nics(sys_net: Path = SYS_NET, sys_ib: Path = SYS_IB) -> list[NicInfo]:
    roce_netdevs = set()
    if sys_ib.is_dir():
        for port in sys_ib.glob("*/ports/*"):
            if _read(port / "link_layer") == "Ethernet":
                roce_netdevs.update(p.name for p in (port.parent.parent / "device" / "net").glob("*"))
    out = []
    for path in sorted(sys_net.iterdir()) if sys_net.is_dir() else []:
        if path.name == "lo":
            continue
        label = _read(path / "ifalias").split(":")
        if label[0] == "drover" and len(label) == 3 and label[1] in ("infiniband", "roce", "ethernet"):
            out.append(NicInfo(path.name, label[1], _number(label[2]), emulated=True))
            continue
        kind = "infiniband" if _read(path / "type") == "32" else "roce" if path.name in roce_netdevs else "ethernet"
        speed = _read(path / "speed")
        out.append(
            NicInfo(
                path.name, kind, int(speed) / 1000 if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else 0.0
            )
        )
    return out


def nic_bytes(name: str, sys_net: Path = SYS_NET) -> tuple[int, int]:
    """(tx, rx) byte counters of a NIC."""
    stats = sys_net / name / "statistics"
    return int(_read(stats / "tx_bytes") or 0), int(_read(stats / "rx_bytes") or 0)


def emulated_nics() -> list[NicInfo]:
    """The interfaces an emulated network labelled (cli/netem.py: ifalias drover:TYPE:GBPS), if any."""
    return [n for n in nics() if n.emulated]


def addresses() -> dict[str, str]:
    """Interface -> its first IPv4 address (`ip -j addr`); empty where ip is missing."""
    try:
        done = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=5)
        listed = json.loads(done.stdout or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for link in listed:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and link.get("ifname") not in out:
                out[link["ifname"]] = info.get("local", "")
    return out


def with_addresses(found: list[NicInfo]) -> list[NicInfo]:
    known = addresses()
    return [replace(n, address=known.get(n.name, "")) for n in found]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if value >= 0 and value != float("inf") else 0.0


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
