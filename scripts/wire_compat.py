"""The drover.v1 wire contract against its last released snapshot, as buf's WIRE rules check it.

A snapshot (protos/drover/v1/wire_snapshot.json) lists every message's fields by number
(name, type, cardinality), their reserved numbers, every enum's values and every RPC. Against
it, the current descriptors may add, never break: a field (or enum value) that disappears must
have its number reserved; a field number keeps its type and cardinality; a reserved number is
not used again; an RPC keeps its request and response types and streaming. Renames are wire
compatible and allowed. tests/protos/test_wire_compat.py runs the check in CI.

    python scripts/wire_compat.py            # check: prints what breaks, exits 1 if anything does
    python scripts/wire_compat.py --update   # a release: the current API becomes the snapshot
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

SNAPSHOT = Path(__file__).resolve().parents[1] / "protos" / "drover" / "v1" / "wire_snapshot.json"


def _files() -> list[descriptor_pb2.FileDescriptorProto]:
    """Every drover.v1 .proto file's descriptor (a new file is checked from its first release)."""
    import importlib

    out = []
    for path in sorted((SNAPSHOT.parent).glob("*.proto")):
        module = importlib.import_module(f"drover.v1.{path.stem}_pb2")
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        out.append(proto)
    return out


def _reserved(ranges, inclusive: bool = False) -> list[list[int]]:
    """[start, end] pairs, end inclusive (a message's ranges end exclusive, an enum's inclusive)."""
    return [[r.start, r.end if inclusive else r.end - 1] for r in ranges]


def _is_reserved(number: int, ranges: list[list[int]]) -> bool:
    return any(start <= number <= end for start, end in ranges)


def snapshot(files: list[descriptor_pb2.FileDescriptorProto]) -> dict:
    """The wire-relevant facts of `files`, as plain data."""
    messages, enums, rpcs = {}, {}, {}

    def enum(prefix: str, e) -> None:
        enums[f"{prefix}.{e.name}"] = {
            "values": {str(v.number): v.name for v in e.value},
            "reserved": _reserved(e.reserved_range, inclusive=True),
        }

    def message(prefix: str, m) -> None:
        name = f"{prefix}.{m.name}"
        messages[name] = {
            "fields": {
                str(f.number): {
                    "name": f.name,
                    "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                    "type_name": f.type_name,
                    "repeated": f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                    # the oneof it belongs to (a proto3 optional's synthetic one is no oneof)
                    "oneof": m.oneof_decl[f.oneof_index].name
                    if f.HasField("oneof_index") and not f.proto3_optional
                    else "",
                }
                for f in m.field
            },
            "reserved": _reserved(m.reserved_range),
        }
        for nested in m.nested_type:
            message(name, nested)
        for e in m.enum_type:
            enum(name, e)

    for f in files:
        for m in f.message_type:
            message(f.package, m)
        for e in f.enum_type:
            enum(f.package, e)
        for service in f.service:
            for method in service.method:
                rpcs[f"{f.package}.{service.name}.{method.name}"] = {
                    "input": method.input_type,
                    "output": method.output_type,
                    "client_streaming": method.client_streaming,
                    "server_streaming": method.server_streaming,
                }
    return {"messages": messages, "enums": enums, "rpcs": rpcs}


def breaking(old: dict, new: dict) -> list[str]:
    """What `new` breaks of `old`'s wire contract, one line each; [] when it is compatible."""
    problems = []
    for name, was in old["messages"].items():
        now = new["messages"].get(name)
        if now is None:
            problems.append(f"message {name} was removed")
            continue
        for number, field in was["fields"].items():
            current = now["fields"].get(number)
            if current is None:
                if not _is_reserved(int(number), now["reserved"]):
                    problems.append(f"{name}.{field['name']} = {number} was removed without reserving {number}")
                continue
            for key in ("type", "type_name", "repeated", "oneof"):
                if current[key] != field[key]:
                    problems.append(
                        f"{name} field {number} ({field['name']}) changed {key}: {field[key]!r} -> {current[key]!r}"
                    )
        for number, current in now["fields"].items():
            if _is_reserved(int(number), was["reserved"]):
                problems.append(f"{name} field {number} was reserved and is used again by {current['name']}")
    for name, was in old["enums"].items():
        now = new["enums"].get(name)
        if now is None:
            problems.append(f"enum {name} was removed")
            continue
        for number, value in was["values"].items():
            if number not in now["values"] and not _is_reserved(int(number), now["reserved"]):
                problems.append(f"{name}.{value} = {number} was removed without reserving {number}")
        for number in now["values"]:
            if _is_reserved(int(number), was["reserved"]):
                problems.append(f"{name} value {number} was reserved and is used again")
    for name, was in old["rpcs"].items():
        now = new["rpcs"].get(name)
        if now is None:
            problems.append(f"rpc {name} was removed")
        elif now != was:
            changed = ", ".join(f"{k}: {was[k]!r} -> {now[k]!r}" for k in was if was[k] != now[k])
            problems.append(f"rpc {name} changed ({changed})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="Write the current API as the snapshot.")
    args = parser.parse_args()
    current = snapshot(_files())
    if args.update:
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT}")
        return
    problems = breaking(json.loads(SNAPSHOT.read_text()), current)
    for line in problems:
        print(line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
