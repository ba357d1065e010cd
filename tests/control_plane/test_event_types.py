"""Every event the control plane writes has its EventKind and a payload that holds each of its
details: read from the controller's source, so a new kind or detail cannot ship untyped."""

from __future__ import annotations

import ast
import json
from types import SimpleNamespace

from drover.control_plane.messages import PAYLOAD_KEYS, event_message
from drover.v1 import events_pb2, jobs_pb2

from support import ROOT, parse_python

KINDS = set(events_pb2.EventKind.keys())


def written_events() -> dict[str, set[str]]:
    """kind -> the detail keys written with it, from every call that names a kind literally."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "control_plane").glob("*.py"):
        for call in (n for n in ast.walk(parse_python(path.read_text())) if isinstance(n, ast.Call)):
            name = getattr(call.func, "attr", getattr(call.func, "id", ""))
            if name not in ("_event", "_end", "add_event", "log_event"):
                continue
            # The kind is each call's last literal string: _end(job, "failed", detail, "job_failed", {...}).
            strings = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            details = next((a for a in call.args if isinstance(a, ast.Dict)), None)
            for kind in strings[-1:]:
                keys = {k.value for k in details.keys if isinstance(k, ast.Constant)} if details else set()
                found.setdefault(kind, set()).update(keys)
    return found


def test_every_written_kind_is_an_event_kind_with_a_payload_for_its_details():
    written = written_events()
    assert len(written) >= 18, sorted(written)  # the parse found the calls
    payloads = {f.name: f.message_type for f in jobs_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields}
    for kind, keys in written.items():
        assert f"EVENT_KIND_{kind.upper()}" in KINDS, kind
        assert kind in payloads, kind
        fields = set(payloads[kind].fields_by_name)
        assert {PAYLOAD_KEYS.get(k, k) for k in keys} <= fields, (kind, keys - fields)


def test_replan_skipped_holds_every_detail_the_coordinator_weighs():
    source = (ROOT / "control_plane" / "coordinator.py").read_text()
    nodes = ast.walk(parse_python(source))
    assigned = [n for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)]
    details = next(n.value for n in assigned if any(getattr(t, "id", "") == "details" for t in n.targets))
    keys = {k.value for k in details.keys}
    assert keys and keys <= set(events_pb2.ReplanSkipped.DESCRIPTOR.fields_by_name), keys


def test_every_event_kind_has_the_payload_named_like_it():
    payloads = {f.name for f in jobs_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields}
    named = {k.removeprefix("EVENT_KIND_").lower() for k in KINDS} - {"unspecified"}
    assert named == payloads


def test_a_stored_event_comes_typed_and_an_unknown_kind_comes_as_stored():
    details = {"from": "replicas", "plan_version": 3, "steps_redone": 0, "seconds": 1.5, "bytes_moved": 10}
    row = SimpleNamespace(time=1.0, step=4, job_id="job-1", kind="recovered", details_json=json.dumps(details))
    event = event_message(row)
    assert event.type == events_pb2.EVENT_KIND_RECOVERED and event.recovered.recovered_from == "replicas"
    assert event.recovered.bytes_moved == 10 and json.loads(event.details_json) == details
    rates = {"node-0/1": float("inf")}  # a failed device's rate: JSON's Infinity
    row = SimpleNamespace(
        time=1.0, step=4, job_id="job-1", kind="replan_skipped", details_json=json.dumps({"rates": rates})
    )
    assert dict(event_message(row).replan_skipped.rates) == rates
    row = SimpleNamespace(time=1.0, step=4, job_id="job-1", kind="from_the_future", details_json='{"x": 1}')
    newer = event_message(row)
    assert newer.type == events_pb2.EVENT_KIND_UNSPECIFIED and newer.WhichOneof("payload") is None
    assert newer.kind == "from_the_future" and newer.details_json == '{"x": 1}'
