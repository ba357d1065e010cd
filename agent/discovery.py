"""What a node has: accelerators (NVML through nvidia-ml-py where present,
else torch, else a configured number of CPU devices) and NICs (from
/sys/class/net and /sys/class/infiniband: type, speed, byte counters)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class NicInfo:
    name: str
    type: str  # infiniband | roce | ethernet
    gbps: float


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


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
