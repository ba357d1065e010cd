"""Checks on what callers send, before anything from a message is kept or
any work is done for it: each failure names the field, the value and what
is allowed (INVALID_ARGUMENT at the API's edge). `check_bounds` holds every
message to sizes and ranges; the other checks are about meaning."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter
from pathlib import PurePosixPath

from google.protobuf.descriptor import FieldDescriptor

from drover.planner.cluster import MAX_FIGURE, MIN_FIGURE
from drover.planner.errors import quote
from drover.planner.spec_io import MAX_INTEGER
from drover.planner.training import MAX_PATH
from drover.v1 import agent_pb2

from .jobfile import MAX_JOB_BYTES

MAX_COMPUTE_S = 3600.0  # per block per micro-batch: anything above is a broken clock, not a straggler
MAX_STRING = 128  # ids and names
# Longer texts, by name: a job's paths and entry point are checked in full by the job's own rules.
MAX_STRINGS = {"job_yaml": MAX_JOB_BYTES, "reason": 1024, "detail": 4096, "note": 1024, "entry_point": 200}
MAX_STRINGS |= dict.fromkeys(("data", "init", "dir", "resume"), MAX_PATH)
MAX_BYTES = 64 * 1024  # a bytes field: a piece of a worker's log
MAX_ITEMS = 1024  # devices of a node, samples of a message
MAX_ITEMS_OF = {"nics": 64, "migrations": 64, "jobs": 256, "steps": 256}
MAX_NUMBER = 1e12  # seconds since the epoch, bytes per second: all well below
# A job's integers the job file allows past MAX_NUMBER (planner/training.py, planner/model.py).
MAX_INTEGER_OF = {"seed": (1 << 63) - 1} | dict.fromkeys(
    ("steps", "block_params", "embedding_params", "head_params", "tp_split_sizes"), MAX_INTEGER
)


class FailedPrecondition(RuntimeError):
    """The request is well formed but the current state forbids it."""


class InvalidArgument(ValueError):
    """Input that names its field, value and what is allowed (from the wire, not a file)."""


class Unauthenticated(PermissionError):
    """The caller did not prove who it is."""


class PermissionDenied(PermissionError):
    """The caller is known but may not do this."""


NIC_TYPES = ("infiniband", "roce", "ethernet")
# Training losses: NaN or +inf when a run diverges, and worth showing as such.
DIVERGES = {"loss", "val_loss"}


def check_bounds(message, path: str) -> None:
    """Every string, list and number of `message` (recursively) within its bounds: strings and
    lists short, numbers finite, non-negative and below MAX_NUMBER, enums a known value."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}"
        if not field.is_repeated:
            _check_value(field, value, where)
            continue
        limit = MAX_ITEMS_OF.get(field.name, MAX_ITEMS)
        if len(value) > limit:
            raise InvalidArgument(f"{where}: {len(value)} entries, at most {limit}")
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            for key, item in value.items():
                _check_value(key_field, key, f"{where} key")
                _check_value(value_field, item, f"{where}[{quote(key)}]")
        else:
            for item in value:
                _check_value(field, item, where)


def _check_value(field, value, where: str) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        check_bounds(value, where)
    elif field.type == FieldDescriptor.TYPE_STRING:
        limit = MAX_STRINGS.get(field.name, MAX_STRING)
        if len(value) > limit:
            raise InvalidArgument(f"{where} = {quote(value)}: at most {limit} characters")
    elif field.type == FieldDescriptor.TYPE_BYTES:
        if len(value) > MAX_BYTES:
            raise InvalidArgument(f"{where}: {len(value)} bytes, at most {MAX_BYTES}")
    elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if field.name in DIVERGES and (math.isnan(value) or value == math.inf):
            return  # a diverged run's loss is news to report, not bad input
        if not (math.isfinite(value) and 0.0 <= value <= MAX_NUMBER):
            raise InvalidArgument(f"{where} = {value!r}: a finite number >= 0 and <= {MAX_NUMBER:g}")
    elif field.type == FieldDescriptor.TYPE_ENUM:
        if value not in field.enum_type.values_by_number:
            names = ", ".join(v.name for v in field.enum_type.values)
            raise InvalidArgument(f"{where} = {value}: one of {names}")
    elif field.type != FieldDescriptor.TYPE_BOOL:
        # Only the bound broken: a field's own check (steps >= 1, ...) states its whole range, and
        # two ranges for one field read as a contradiction.
        limit = MAX_INTEGER_OF.get(field.name, MAX_NUMBER)
        if value < 0:
            raise InvalidArgument(f"{where} = {value}: not negative")
        if value > limit:
            raise InvalidArgument(f"{where} = {value}: at most {int(limit)}")


def check_out_dir(out_dir: str) -> str:
    """A job's output folder as every agent will find it: relative to the agent's data root,
    without '..'; the control plane itself never touches it. Empty: jobs/JOB_ID."""
    path = PurePosixPath(out_dir)
    unprintable = any(not ch.isprintable() for ch in out_dir)  # a newline, a NUL, an escape
    if len(out_dir) > 255 or path.is_absolute() or ".." in path.parts or "\\" in out_dir or unprintable:
        raise InvalidArgument(
            f"out_dir = {quote(out_dir)}: a relative path of at most 255 printable characters without '..', "
            f"inside each agent's --data-root"
        )
    return str(path) if out_dir else ""


def check_hello(hello: agent_pb2.Hello) -> tuple[list[dict], list[dict]]:
    """The node's devices and NICs as rows, once the hello is known to be sound."""
    if not hello.node or "/" in hello.node:
        raise InvalidArgument(f"hello.node = {hello.node!r}: a non-empty node name without '/'")
    devices = [
        {
            "id": d.id,
            "kind": d.kind,
            "name": d.name,
            "memory_gib": d.memory_gib,
            "tflops": d.tflops,
            "intra_gbps": d.intra_gbps,
        }
        for d in hello.devices
    ]
    for i, d in enumerate(devices):
        node, _, index = d["id"].rpartition("/")
        if node != hello.node or not index.isascii() or not index.isdigit() or int(index) >= MAX_ITEMS:
            raise InvalidArgument(
                f"hello.devices[{i}].id = {d['id'][:80]!r}: a device id {hello.node}/INDEX, INDEX below {MAX_ITEMS}"
            )
        for key in ("memory_gib", "tflops", "intra_gbps"):
            _check_figure(f"hello.devices[{i}].{key}", d[key])
    nics = [{"name": n.name, "type": n.type, "gbps": n.gbps, "address": n.address} for n in hello.nics]
    for i, n in enumerate(nics):
        _check_figure(f"hello.nics[{i}].gbps", n["gbps"])
        if not n["name"] or any(not ch.isprintable() or ch.isspace() or ch in "/:" for ch in n["name"]):
            raise InvalidArgument(f"hello.nics[{i}].name = {n['name'][:80]!r}: an interface name, e.g. eth0")
        if n["type"] not in NIC_TYPES:
            raise InvalidArgument(f"hello.nics[{i}].type = {n['type'][:80]!r}: one of {', '.join(NIC_TYPES)}")
        if n["address"]:
            _check_address(f"hello.nics[{i}].address", n["address"])
    if hello.advertise_address:
        _check_address("hello.advertise_address", hello.advertise_address)
    if hello.probe_port > 65535:
        raise InvalidArgument(f"hello.probe_port = {hello.probe_port}: a TCP port (1 to 65535), or 0 for none")
    for field_name, names in (("devices.id", [d["id"] for d in devices]), ("nics.name", [n["name"] for n in nics])):
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        if repeated:
            raise InvalidArgument(f"hello.{field_name} = {repeated[0]!r} appears more than once: each must be unique")
    return devices, nics


def _check_address(where: str, address: str) -> None:
    """An address another host can reach this one at: one host's, not 0.0.0.0, a broadcast or
    a multicast group."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is None or ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise InvalidArgument(f"{where} = {address[:80]!r}: one host's IP address, or empty")


def _check_figure(where: str, value: float) -> None:
    """0 (unknown, or a failed probe) or a figure the planner can divide by: a cluster file's bounds."""
    if value != 0.0 and not MIN_FIGURE <= value <= MAX_FIGURE:
        raise InvalidArgument(f"{where} = {value!r}: 0 (unknown) or from {MIN_FIGURE:g} to {MAX_FIGURE:g}")


def check_telemetry(message: agent_pb2.Telemetry) -> None:
    """What check_bounds cannot know: samples name a device, compute times are plausible, and
    link speeds are figures the planner can use."""
    for i, k in enumerate(message.links):
        _check_figure(f"telemetry.links[{i}].gbps", k.gbps)
    for i, s in enumerate(message.devices):
        if not s.device:
            raise InvalidArgument(f"telemetry.devices[{i}].device = '': a device id NODE/INDEX")
        if s.compute_s_per_block > MAX_COMPUTE_S:
            raise InvalidArgument(
                f"telemetry.devices[{i}].compute_s_per_block = {s.compute_s_per_block!r}: at most {MAX_COMPUTE_S:g}"
            )
