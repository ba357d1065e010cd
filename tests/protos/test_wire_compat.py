"""drover.v1 stays wire compatible with its last released snapshot (scripts/wire_compat.py):
the committed API passes, and each kind of break the checker must catch, caught."""

from __future__ import annotations

import importlib.util
import json

import pytest
from google.protobuf import descriptor_pb2

from support import ROOT

spec = importlib.util.spec_from_file_location("wire_compat", ROOT / "scripts" / "wire_compat.py")
wire_compat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wire_compat)

F = descriptor_pb2.FieldDescriptorProto


def api() -> descriptor_pb2.FileDescriptorProto:
    """A small API: message Job {int64 step = 1; string name = 2; repeated string devices = 3;
    reserved 5;}, enum State {UNKNOWN = 0; RUNNING = 1;}, service Jobs {rpc Get(Job) returns (Job);}."""
    f = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    job = f.message_type.add(name="Job")
    job.field.add(name="step", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    job.field.add(name="name", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    job.field.add(name="devices", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    job.reserved_range.add(start=5, end=6)
    job.reserved_range.add(start=1000, end=536870912)  # "reserved 1000 to max": ranges, never expanded
    state = f.enum_type.add(name="State")
    state.value.add(name="UNKNOWN", number=0)
    state.value.add(name="RUNNING", number=1)
    f.service.add(name="Jobs").method.add(name="Get", input_type=".t.Job", output_type=".t.Job")
    return f


def check(change) -> list[str]:
    new = api()
    change(new)
    return wire_compat.breaking(wire_compat.snapshot([api()]), wire_compat.snapshot([new]))


def field(f, number):
    return next(x for x in f.message_type[0].field if x.number == number)


def test_the_committed_api_is_compatible_with_its_snapshot():
    committed = json.loads(wire_compat.SNAPSHOT.read_text())
    assert wire_compat.breaking(committed, wire_compat.snapshot(wire_compat._files())) == []


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f.message_type[0].field.add(name="new", number=4, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL),
        lambda f: setattr(field(f, 1), "name", "current_step"),  # a rename: the wire carries numbers
        lambda f: (f.message_type[0].field.remove(field(f, 2)), f.message_type[0].reserved_range.add(start=2, end=3)),
        lambda f: f.enum_type[0].value.add(name="DONE", number=2),
        lambda f: f.service[0].method.add(name="List", input_type=".t.Job", output_type=".t.Job"),
    ],
    ids=["field-added", "field-renamed", "field-removed-and-reserved", "enum-value-added", "rpc-added"],
)
def test_additions_and_renames_are_compatible(change):
    assert check(change) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda f: f.message_type[0].field.remove(field(f, 2)), "t.Job.name = 2 was removed without reserving 2"),
        (lambda f: setattr(field(f, 1), "type", F.TYPE_STRING), "t.Job field 1 (step) changed type"),
        (lambda f: setattr(field(f, 3), "label", F.LABEL_OPTIONAL), "t.Job field 3 (devices) changed repeated"),
        (
            lambda f: f.message_type[0].field.add(name="again", number=5, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL),
            "t.Job field 5 was reserved and is used again by again",
        ),
        (lambda f: f.enum_type[0].value.pop(), "t.State.RUNNING = 1 was removed without reserving 1"),
        (lambda f: f.service[0].method.pop(), "rpc t.Jobs.Get was removed"),
        (lambda f: setattr(f.service[0].method[0], "server_streaming", True), "rpc t.Jobs.Get changed"),
        (lambda f: f.message_type.pop(), "message t.Job was removed"),
        (
            lambda f: (f.message_type[0].oneof_decl.add(name="choice"), setattr(field(f, 2), "oneof_index", 0)),
            "t.Job field 2 (name) changed oneof",
        ),
    ],
    ids=[
        "field-removed",
        "type-changed",
        "cardinality-changed",
        "reserved-reused",
        "enum-value-removed",
        "rpc-removed",
        "rpc-streaming-changed",
        "message-removed",
        "moved-into-a-oneof",
    ],
)
def test_each_break_is_caught(change, expected):
    problems = check(change)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_breaking_change_to_drovers_own_descriptors_is_caught():
    """On a mutated copy of drover.v1's descriptors: Job.step removed, Plan.micro_batch retyped,
    an RPC dropped."""
    files = wire_compat._files()
    released = wire_compat.snapshot(files)
    for f in files:
        for message in f.message_type:
            if message.name == "Job":
                message.field.remove(next(x for x in message.field if x.name == "step"))
            if message.name == "Plan":
                next(x for x in message.field if x.name == "micro_batch").type = F.TYPE_STRING
        for service in f.service:
            if service.name == "JobService":
                service.method.remove(next(m for m in service.method if m.name == "CancelJob"))
    problems = wire_compat.breaking(released, wire_compat.snapshot(files))
    assert any(p.startswith("drover.v1.Job.step = ") and "without reserving" in p for p in problems), problems
    assert any(p.startswith("drover.v1.Plan field") and "micro_batch" in p and "type" in p for p in problems)
    assert "rpc drover.v1.JobService.CancelJob was removed" in problems
