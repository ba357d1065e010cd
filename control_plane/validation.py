"""Checks on what agents send, before anything from a message is kept: each
failure names the field, the value and what is allowed (INVALID_ARGUMENT at
the API's edge)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import PurePosixPath

from drover.planner.errors import quote
from drover.v1 import agent_pb2

MAX_COMPUTE_S = 3600.0  # per block per micro-batch: anything above is a broken clock, not a straggler


class FailedPrecondition(RuntimeError):
    """The request is well formed but the current state forbids it."""


class InvalidArgument(ValueError):
    """Input that names its field, value and what is allowed (from the wire, not a file)."""


class Unauthenticated(PermissionError):
    """The caller did not prove who it is."""


class PermissionDenied(PermissionError):
    """The caller is known but may not do this."""


def check_out_dir(out_dir: str) -> str:
    """A job's output folder as every agent will find it: relative to the agent's data root,
    without '..'; the control plane itself never touches it. Empty: jobs/JOB_ID."""
    path = PurePosixPath(out_dir)
    if len(out_dir) > 255 or path.is_absolute() or ".." in path.parts or "\\" in out_dir or "\0" in out_dir:
        raise InvalidArgument(
            f"out_dir = {quote(out_dir)}: a relative path of at most 255 characters without '..', "
            f"inside each agent's --data-root"
        )
    return str(path) if out_dir else ""


def check_hello(hello: agent_pb2.Hello) -> tuple[list[dict], list[dict]]:
    """The node's devices and NICs as rows, once the hello is known to be sound."""
    if not hello.node or "/" in hello.node:
        raise InvalidArgument(f"hello.node = {hello.node!r}: a non-empty node name without '/'")
    devices = [
        {"id": d.id, "kind": d.kind, "name": d.name, "memory_gib": d.memory_gib, "tflops": d.tflops}
        for d in hello.devices
    ]
    for d in devices:
        if not d["id"].startswith(hello.node + "/"):
            raise InvalidArgument(f"hello.devices.id = {d['id']!r}: a device id {hello.node}/INDEX")
    nics = [{"name": n.name, "type": n.type, "gbps": n.gbps} for n in hello.nics]
    for field_name, names in (("devices.id", [d["id"] for d in devices]), ("nics.name", [n["name"] for n in nics])):
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        if repeated:
            raise InvalidArgument(f"hello.{field_name} = {repeated[0]!r} appears more than once: each must be unique")
    return devices, nics


def check_telemetry(message: agent_pb2.Telemetry) -> None:
    def check(path: str, value: float, limit: float = math.inf) -> None:
        if not (math.isfinite(value) and 0.0 <= value <= limit):
            raise InvalidArgument(
                f"telemetry.{path} = {value!r}: a finite number >= 0"
                + (f" and <= {limit:g}" if math.isfinite(limit) else "")
            )

    check("time", message.time)
    for i, s in enumerate(message.devices):
        if not s.device:
            raise InvalidArgument(f"telemetry.devices[{i}].device = '': a device id NODE/INDEX")
        check(f"devices[{i}].compute_s_per_block", s.compute_s_per_block, MAX_COMPUTE_S)
        for name in ("p2p_wait_s", "grad_sync_s"):
            check(f"devices[{i}].{name}", getattr(s, name))
        if s.step < 0:
            raise InvalidArgument(f"telemetry.devices[{i}].step = {s.step}: an integer >= 0")
    for i, n in enumerate(message.nics):
        check(f"nics[{i}].tx_bytes_per_s", n.tx_bytes_per_s)
        check(f"nics[{i}].rx_bytes_per_s", n.rx_bytes_per_s)
