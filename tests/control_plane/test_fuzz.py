"""Property-based fuzzing of every RPC against a real server: whatever is
sent, the answer is a status a caller could expect (never UNKNOWN or
INTERNAL, never a hang), health checks are answered within 1 s, and a
completed job's history stays byte for byte what it was. A bounded number of
cases here; `bench/fuzz.py` runs the long campaign."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from drover.v1 import agent_pb2

from fuzzing import (
    EXAMPLES,
    EXPECTED,
    agent_messages,
    answer,
    completed_job,
    healthy_within,
    history,
    job_service_calls,
)

FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


async def test_every_job_service_rpc_survives_hostile_requests(plane):
    job_id = await completed_job(plane.jobs, plane.agents)
    before = await history(plane.jobs, job_id)
    codes: dict[str, int] = {}

    # Hypothesis drives a sync function; the calls run on this test's event loop, collected first.
    calls = []

    @FUZZ
    @given(call=job_service_calls([job_id, "node-0", "node-0/0"]))
    def collect(call):
        calls.append(call)

    collect()
    for call in calls:
        code = await answer(plane.channel, call)
        assert code in EXPECTED, (call.method, code, call.payload[:80])
        codes[code] = codes.get(code, 0) + 1
    await healthy_within(plane.channel)
    assert await history(plane.jobs, job_id) == before
    assert len(codes) >= 3, codes  # the cases reached past the first check


async def test_the_agent_stream_survives_hostile_messages(plane):
    job_id = await completed_job(plane.jobs, plane.agents)
    before = await history(plane.jobs, job_id)
    batches = []

    @FUZZ
    @given(sent=agent_messages([job_id, "fuzz", "fuzz/0", "node-0", "node-0/0"]))
    def collect(sent):
        batches.append(sent)

    collect()
    connect = plane.channel.stream_stream("/drover.v1.AgentService/Connect")
    seen = set()
    for i, message in enumerate(batches):  # one a stream, after a sound hello: its status is the server's
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=f"fuzz{i}")).SerializeToString()
        call = connect(timeout=3)
        await call.write(hello)
        await call.write(message)
        await call.done_writing()
        code = (await call.code()).name
        assert code in EXPECTED | {"DEADLINE_EXCEEDED"}, (code, await call.details(), message[:80])
        seen.add(code)
    assert "INVALID_ARGUMENT" in seen, seen
    await healthy_within(plane.channel)
    assert await history(plane.jobs, job_id) == before
