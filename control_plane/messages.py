"""Stored rows as drover.v1 messages (jobs, events with their typed payloads, plans, nodes), the
job a request submits, and listing pages."""

from __future__ import annotations

import json
import logging

from drover.planner.errors import SpecError
from drover.planner.plan import plan_from_dict
from drover.planner.wire import job_state, message_from_fields, plan_to_proto
from drover.storage import queries
from drover.v1 import events_pb2, jobs_pb2, jobspec_pb2

from .jobfile import JobSpec, job_from_spec, job_from_stored, job_from_wire
from .validation import InvalidArgument

log = logging.getLogger("drover.server")
PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000  # listings: per page by default, and at most


def submitted_spec(request: jobs_pb2.SubmitJobRequest) -> JobSpec:
    """The job of a SubmitJobRequest: its JobSpec, or the deprecated YAML."""
    if request.HasField("spec") == bool(request.job_yaml):
        raise InvalidArgument("request: set exactly one of spec and job_yaml (deprecated)")
    return job_from_spec(request.spec) if request.HasField("spec") else job_from_wire(request.job_yaml)


PAYLOADS = {f.name for f in jobs_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields}  # one per EventKind
PAYLOAD_KEYS = {"from": "recovered_from"}  # stored details' keys that are no field name (a Python keyword)


def event_message(row) -> jobs_pb2.Event:
    """A stored event, typed: kind -> EVENT_KIND_KIND, its details -> the payload named like it."""
    event = jobs_pb2.Event(
        time=row.time, step=row.step, job_id=row.job_id, kind=row.kind, details_json=row.details_json
    )
    if row.kind not in PAYLOADS:
        return event  # stored by a newer server: kind and details_json only
    event.type = events_pb2.EventKind.Value(f"EVENT_KIND_{row.kind.upper()}")
    payload = getattr(event, row.kind)
    payload.SetInParent()
    try:
        details = json.loads(row.details_json or "{}")
        message_from_fields({PAYLOAD_KEYS.get(k, k): v for k, v in details.items()}, payload)
    except (ValueError, AttributeError) as exc:  # details another version wrote: kind and details_json still tell
        log.warning("event %s of job %s has no typed payload: %s", row.kind, row.job_id, exc)
        event.ClearField(row.kind)
    return event


def job_message(row, live_progress: dict | None = None) -> jobs_pb2.Job:
    figures = live_progress or (json.loads(row.progress.progress_json) if row.progress else None)
    return jobs_pb2.Job(
        progress=figures,
        id=row.id,
        state=job_state(row.state),
        model_name=row.model_name,
        steps=row.steps,
        seed=row.seed,
        step=row.step,
        plan_version=row.plan_version,
        committed_plan_version=row.committed_plan_version,
        detail=row.detail,
        created=row.created,
        out_dir=row.out_dir,
        spec=spec_message(row.model_yaml),
    )


def spec_message(stored: str) -> jobspec_pb2.JobSpec | None:
    """The job as it runs: its stored spec with every default filled in."""
    try:
        return message_from_fields(job_from_stored(stored, "stored job").full_dict(), jobspec_pb2.JobSpec())
    except (SpecError, ValueError) as exc:  # written by another version: the job's other fields still tell
        log.warning("a stored job has no JobSpec form: %s", exc)
        return None


def plan_message(row) -> jobs_pb2.PlanRecord:
    return jobs_pb2.PlanRecord(
        job_id=row.job_id,
        version=row.version,
        reason=row.reason,
        committed=row.committed,
        created=row.created,
        plan=plan_to_proto(plan_from_dict(json.loads(row.plan_json))),
    )


def node_message(session, row) -> jobs_pb2.Node:
    return jobs_pb2.Node(
        name=row.name,
        connected=row.connected,
        drained=row.drained,
        last_seen=row.last_seen,
        devices=[d.id for d in queries.devices_of(session, row.name)],
        nics=[f"{n.name} ({n.type})" for n in queries.nics_of(session, row.name)],
        links=[
            jobs_pb2.Link(nic=k.nic, peer=k.peer, gbps=k.gbps, time=k.time) for k in queries.links_of(session, row.name)
        ],
    )


def page_of(request) -> tuple[int, int]:
    """(offset, size) of a listing request; the page token is the offset where the page starts."""
    size = request.page_size or PAGE_SIZE
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size = {request.page_size}: 0 (meaning {PAGE_SIZE}) up to {MAX_PAGE_SIZE}")
    token = request.page_token
    if token and not (token.isascii() and token.isdigit() and len(token) <= 12):  # not "6²"
        raise InvalidArgument(f"page_token = {token[:40]!r}: a next_page_token this service returned")
    return int(token or 0), size


def next_token(rows: list, offset: int, size: int) -> str:
    return str(offset + size) if len(rows) > size else ""
