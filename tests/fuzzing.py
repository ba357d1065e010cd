"""Hypothesis strategies for hostile messages of every RPC: any field of any
request, at the boundaries (empty, huge, NaN, infinities, negative, 2^63-1),
ids that exist and ids that do not, and raw bytes that are no message at all.
Shared by tests/control_plane/test_fuzz.py and bench/fuzz.py."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import strategies as st

from drover.client import job_spec
from drover.v1 import agent_pb2, jobs_pb2, state_pb2

from support import TINY_JOB, ScriptedAgent, eventually

EXAMPLES = int(os.environ.get("DROVER_FUZZ_EXAMPLES", "150"))  # per test in CI; set more for a long run
JOB_SERVICE = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]
# Codes a hostile request may get; anything else (UNKNOWN, INTERNAL, a hang) is a failure.
EXPECTED = {
    "OK",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "UNAUTHENTICATED",
}

INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 1e308, -1e308, float("nan"), float("inf"), float("-inf"), 5e-324]


def texts(known: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(known + ["", "/", "../../etc/passwd", "node-0/0", "job-0"]),
        st.text(max_size=40),
        st.integers(129, 20_000).map(lambda n: "x" * n),
    )


def _scalar(field: FieldDescriptor, known: list[str]) -> st.SearchStrategy:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return texts(known)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(allow_nan=True, allow_infinity=True))
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(0, 2**31 - 1))
    unsigned32 = (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32)
    if t in (*unsigned32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        top = 2**32 - 1 if t in unsigned32 else 2**64 - 1
        return st.one_of(st.sampled_from([0, 1, top]), st.integers(0, top))  # unsigned: the wire has no -1
    bits = 32 if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32) else 64
    edges = [e for e in INT_EDGES if -(2 ** (bits - 1)) <= e < 2 ** (bits - 1)]
    return st.one_of(st.sampled_from(edges), st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))


def messages(descriptor, known: list[str], depth: int = 0) -> st.SearchStrategy:
    """Messages of `descriptor`'s type with any subset of fields set, recursively."""
    cls = GetMessageClass(descriptor)
    fields = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            fields[field.name] = st.dictionaries(_scalar(key, known), _scalar(value, known), max_size=3)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = messages(field.message_type, known, depth + 1) if depth < 3 else st.just(None)
            if field.is_repeated:
                many = inner.flatmap(lambda item: st.integers(1025, 2000).map(lambda n, i=item: [i] * n))
                fields[field.name] = (
                    st.one_of(st.lists(inner, max_size=3), many) if depth == 0 else st.lists(inner, max_size=2)
                )
            else:
                fields[field.name] = inner
        elif field.is_repeated:
            fields[field.name] = st.lists(_scalar(field, known), max_size=4)
        else:
            fields[field.name] = _scalar(field, known)

    @st.composite
    def build(draw):
        message = cls()
        chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True)) if fields else []
        for name in chosen:
            value = draw(fields[name])
            if value is None:
                continue
            target = getattr(message, name)
            if isinstance(value, dict):
                for k, v in value.items():
                    target[k] = v
            elif isinstance(value, list):
                if value and hasattr(value[0], "SerializeToString"):
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif hasattr(value, "SerializeToString"):
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return build()


@dataclass(frozen=True)
class Call:
    """One fuzzed RPC: the method, and the bytes sent (a message, or raw garbage)."""

    method: str
    payload: bytes
    streaming: bool


def job_service_calls(known: list[str]) -> st.SearchStrategy[Call]:
    def for_method(method) -> st.SearchStrategy[Call]:
        as_message = messages(method.input_type, known).map(lambda m: m.SerializeToString())
        payload = st.one_of(as_message, st.binary(max_size=256))
        return payload.map(lambda p, m=method: Call(m.name, p, m.server_streaming))

    # DeleteJob of the fuzzed job is what it is for: the history the fuzzing must not touch would
    # go. Its hostile requests are fuzzed too, but never naming that job.
    def deletes_another(call: Call) -> bool:
        return call.method != "DeleteJob" or not any(k.encode() in call.payload for k in known if k.startswith("job-"))

    return st.one_of([for_method(m) for m in JOB_SERVICE.methods]).filter(deletes_another)


def agent_messages(known: list[str]) -> st.SearchStrategy[bytes]:
    """What a hostile agent stream sends after its hello: messages or garbage."""
    as_message = messages(agent_pb2.AgentMessage.DESCRIPTOR, known).map(lambda m: m.SerializeToString())
    return st.one_of(as_message, st.binary(max_size=256))


# -- running the calls ----------------------------------------------------------------


async def completed_job(jobs, agents) -> str:
    """A job run to its end by a scripted agent (node-0): the history fuzzing must not touch."""
    agent = ScriptedAgent(agents, "node-0")

    async def connected():
        return any(n.connected for n in (await jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes)

    await eventually(connected, what="node-0 connected")
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(TINY_JOB), out_dir="fuzz"))
    await agent.receive()
    agent.report(job.id, 0, {"node-0/0": 0.01, "node-0/1": 0.01})
    agent.send(status=agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_COMPLETED, active_plan_version=1))

    async def done():
        got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
        return got.state == state_pb2.JOB_STATE_COMPLETED

    await eventually(done, what="the job completed")
    return job.id


async def history(jobs, job_id: str) -> list[bytes]:
    """Everything stored about a job, serialized: its row, plans, events and telemetry."""
    out = [(await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id))).SerializeToString()]
    out.append((await jobs.ListPlans(jobs_pb2.ListPlansRequest(job_id=job_id))).SerializeToString())
    out += [e.SerializeToString() async for e in jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id))]
    out.append((await jobs.QueryTelemetry(jobs_pb2.QueryTelemetryRequest(job_id=job_id))).SerializeToString())
    return out


async def answer(channel, call) -> str:
    if call.streaming:
        stream = channel.unary_stream(f"/drover.v1.JobService/{call.method}")(call.payload, timeout=2)
        try:
            async for _ in stream:
                pass
        except grpc.aio.AioRpcError as exc:
            # A watch of a running job waits for its end: the deadline is that, not a hang.
            return "OK" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc.code().name
        return "OK"
    try:
        await channel.unary_unary(f"/drover.v1.JobService/{call.method}")(call.payload, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


async def healthy_within(channel, seconds: float = 1.0) -> None:
    started = time.monotonic()
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=seconds)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING and time.monotonic() - started < seconds
