"""Regression tests for hostile or broken input reproduced against the control
plane: each request is refused with the right code, quickly, the server keeps
answering and nothing of the request is kept."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from drover.control_plane import api
from drover.control_plane.identity import Authenticator
from drover.v1 import agent_pb2, jobs_pb2, state_pb2

from support import cpu_device, eventually


async def code_of(call):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def healthy_within(plane, seconds: float = 1.0) -> None:
    started = time.monotonic()
    reply = await health_pb2_grpc.HealthStub(plane.channel).Check(health_pb2.HealthCheckRequest(), timeout=seconds)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING and time.monotonic() - started < seconds


async def hello_answer(plane, hello: agent_pb2.Hello):
    outbox: asyncio.Queue = asyncio.Queue()
    outbox.put_nowait(agent_pb2.AgentMessage(hello=hello))

    async def requests():
        while True:
            yield await outbox.get()

    return await code_of(asyncio.wait_for(plane.agents.Connect(requests()).read(), 10))


async def test_bytes_that_are_no_message_are_invalid_argument(plane):
    raw = plane.channel.unary_unary("/drover.v1.JobService/GetJob")
    code, details = await code_of(raw(b"\xff\xff\xff\xff not a protobuf"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "drover.v1.GetJobRequest" in details
    await healthy_within(plane)


async def test_a_hundred_thousand_device_hello_is_refused_at_once(plane):
    started = time.monotonic()
    hello = agent_pb2.Hello(node="node-9", devices=[cpu_device(f"node-9/{i}") for i in range(100_000)])
    code, _ = await hello_answer(plane, hello)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - started < 5  # over the size cap
    code, details = await hello_answer(
        plane, agent_pb2.Hello(node="node-9", devices=[cpu_device(f"node-9/{i}") for i in range(5_000)])
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "hello.devices: 5000 entries, at most 1024" in details
    await healthy_within(plane)
    assert (await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes == []


@pytest.mark.parametrize("field, value", [("node", "n" * 10_000), ("agent_version", "v" * 10_000)])
async def test_long_names_are_refused_and_never_listed(plane, field, value):
    """Two 2.5 MB names once made `drover nodes` fail for everyone, for good."""
    code, details = await hello_answer(plane, agent_pb2.Hello(**{"node": "node-9", field: value}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"hello.{field}" in details and len(details) < 300
    assert (await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes == []


async def test_a_long_reason_is_refused(plane):
    code, details = await code_of(plane.jobs.Replan(jobs_pb2.ReplanRequest(job_id="j", reason="r" * 5_000)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "ReplanRequest.reason" in details


async def test_a_stream_under_another_name_cannot_end_a_job(plane):
    """A forged status from a node the job is not on once failed (or completed) the job."""
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    stranger = plane.agent("node-9")
    await plane.connected(2)
    stranger.send(status=agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_COMPLETED))
    code, details = await code_of(stranger.receive())
    assert code == grpc.StatusCode.PERMISSION_DENIED and "node-9" in details
    assert (await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).state == state_pb2.JOB_STATE_RUNNING


async def test_an_unexpected_error_is_internal_with_one_log_line(plane, monkeypatch, caplog):
    async def broken(node, drained):
        raise KeyError("a bug's details")

    monkeypatch.setattr(plane.cp, "drain", broken)
    with caplog.at_level(logging.ERROR, logger="drover.server"):
        code, details = await code_of(plane.jobs.DrainNode(jobs_pb2.NodeRequest(node="node-0")))
    assert code == grpc.StatusCode.INTERNAL and "bug" not in details
    logged = [r for r in caplog.records if r.name == "drover.server"]
    assert len(logged) == 1 and "DrainNode" in logged[0].getMessage() and logged[0].exc_info is None
    await healthy_within(plane)


async def test_agent_streams_are_capped(plane_factory):
    plane = await plane_factory(max_agent_streams=2)
    first, second = plane.agent("node-0"), plane.agent("node-1")
    await plane.connected(2)
    code, details = await code_of(plane.agent("node-2").receive())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "agent streams" in details
    assert first.call.done() is False and second.call.done() is False  # the others are served on


async def test_an_older_stream_ending_after_a_reconnect_changes_nothing(plane):
    first = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await first.receive()
    running = agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_RUNNING, active_plan_version=1)
    plane.agent("node-0", jobs=[running])  # the agent reconnected; the old stream is noticed ending later
    await asyncio.sleep(0.3)
    first.call.cancel()
    await asyncio.sleep(0.3)
    nodes = (await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes
    assert [(n.name, n.connected) for n in nodes] == [("node-0", True)]
    assert "node-0" not in plane.cp._lost  # no countdown to failing its job
    code, details = await code_of(first.receive())  # the older stream was ended, not left holding a slot
    assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED)
    assert (await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).state == state_pb2.JOB_STATE_RUNNING


@pytest.mark.parametrize(
    "sample, code, fragment",
    [
        ({"device": "node-0/7", "step": 1}, grpc.StatusCode.PERMISSION_DENIED, "those of its hello"),
        ({"device": "node-0/0", "step": 10**12}, grpc.StatusCode.INVALID_ARGUMENT, "steps"),
    ],
)
async def test_telemetry_for_what_the_job_does_not_have_is_refused(plane, sample, code, fragment):
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    agent.send(
        telemetry=agent_pb2.Telemetry(
            job_id=job.id, active_plan_version=1, devices=[agent_pb2.DeviceSample(compute_s_per_block=0.5, **sample)]
        )
    )
    got, details = await code_of(agent.receive())
    assert got == code and fragment in details
    assert (await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).step <= 0


@pytest.mark.parametrize("job_yaml", ["[" * 60_000, "steps: " + "9" * 5_000])
async def test_deep_or_huge_yaml_is_invalid_argument(plane, job_yaml):
    code, details = await code_of(plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(job_yaml=job_yaml)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "plain YAML" in details


async def test_unknown_enum_values_and_huge_limits_are_invalid_argument(plane):
    hello = agent_pb2.Hello(node="node-9", jobs=[agent_pb2.JobStatus(job_id="j", state=77)])
    code, details = await hello_answer(plane, hello)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "state = 77" in details
    code, details = await code_of(plane.jobs.QueryTelemetry(jobs_pb2.QueryTelemetryRequest(job_id="j", limit=10**9)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details


async def test_after_a_restart_a_node_that_never_returns_is_expected(tmp_path):
    from support import serve_plane

    plane, stop = await serve_plane(tmp_path)
    agent = plane.agent("node-0")
    await plane.connected(1)
    await plane.submit()
    await agent.receive()
    await stop()
    again, stop_again = await serve_plane(tmp_path)  # node-0 does not come back
    try:
        assert "node-0" in again.cp._lost  # its jobs fail unless it says hello within the grace period
    finally:
        await stop_again()


async def test_one_stream_a_node_so_one_certificate_cannot_hold_every_slot(plane_factory):
    plane = await plane_factory(max_agent_streams=2)
    first = plane.agent("node-0")
    await plane.connected(1)
    second = plane.agent("node-0")  # the same node again: replaces the first, holds one slot
    code, details = await code_of(first.receive())
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "newer stream" in details
    other = plane.agent("node-1")
    await plane.connected(2)
    assert not other.call.done() and not second.call.done()


@pytest.mark.parametrize(
    "hello, where",
    [
        (
            agent_pb2.Hello(node="node-9", devices=[agent_pb2.Device(id="node-9/0", kind="cpu", tflops=5e-324)]),
            "hello.devices[0].tflops = 5e-324",
        ),
        (
            agent_pb2.Hello(node="node-9", devices=[agent_pb2.Device(id="node-9/0", kind="cpu", intra_gbps=1e-9)]),
            "hello.devices[0].intra_gbps = 1e-09",
        ),
        (agent_pb2.Hello(node="node-9", nics=[agent_pb2.Nic(name="eth0", type="ethernet", gbps=1e7)]), "nics[0].gbps"),
    ],
)
async def test_figures_the_planner_cannot_divide_by_are_refused(plane, hello, where):
    # At 5e-324 TFLOP/s every later submission failed with INTERNAL (a division by zero).
    code, details = await hello_answer(plane, hello)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and where in details and "0.001" in details
    assert (await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes == []


async def test_a_link_sample_the_planner_cannot_divide_by_is_refused(plane):
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    link = agent_pb2.LinkSample(nic="eth0", peer="node-1", gbps=5e-324, time=1.0)
    agent.send(telemetry=agent_pb2.Telemetry(job_id=job.id, active_plan_version=1, links=[link]))
    code, details = await code_of(agent.receive())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "telemetry.links[0].gbps = 5e-324" in details
    await healthy_within(plane)


async def test_a_migration_report_past_the_jobs_plans_or_steps_is_refused(plane):
    # A report of step 999,999,999 was stored, and once committed there it made the detector
    # discard every later sample: straggler detection off for the rest of the job.
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    for migration, fragment in (
        (agent_pb2.Migration(plan_version=2, step=1), "no plan version above 1"),
        (agent_pb2.Migration(plan_version=1, step=999_999_999), "has 30 steps"),
    ):
        again = plane.agent(
            "node-0",
            jobs=[agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_RUNNING, active_plan_version=1)],
        )
        await plane.connected(1)
        again.send(telemetry=agent_pb2.Telemetry(job_id=job.id, active_plan_version=1, migrations=[migration]))
        code, details = await code_of(again.receive())
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION) and fragment in details
    assert "migration_done" not in [e.kind for e in await plane.events(job.id)]


async def test_a_repeated_migration_report_is_one_migration(plane):
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    report = agent_pb2.Migration(plan_version=1, step=3, bytes_moved=10)
    for _ in range(3):
        agent.send(telemetry=agent_pb2.Telemetry(job_id=job.id, active_plan_version=1, migrations=[report]))
    await eventually(lambda: plane.cp.jobs[job.id].migrations >= 1)
    await asyncio.sleep(0.2)
    assert plane.cp.jobs[job.id].migrations == 1


async def test_progress_from_a_node_other_than_rank_0s_is_not_shown(plane):
    first, second = plane.agent("node-0"), plane.agent("node-1")
    await plane.connected(2)
    job = await plane.submit()
    await first.receive(), await second.receive()
    rank0 = plane.cp.jobs[job.id].rank0_node()
    other = second if rank0 == "node-0" else first
    other.send(
        telemetry=agent_pb2.Telemetry(
            job_id=job.id, active_plan_version=1, progress=state_pb2.Progress(step=5, loss=12345.0)
        )
    )
    await asyncio.sleep(0.3)
    shown = await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert not shown.HasField("progress") or shown.progress.loss != 12345.0


async def test_a_job_cancelled_while_its_node_was_away_is_cancelled_when_it_returns(plane):
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    agent.call.cancel()
    await eventually(lambda: "node-0" not in plane.cp.outboxes)
    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    back = plane.agent(
        "node-0", jobs=[agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_RUNNING, active_plan_version=1)]
    )
    message = await back.receive()
    assert message.command.cancel.job_id == job.id  # its workers stop; its devices are free again


async def test_samples_from_the_future_are_stored_at_the_servers_now(plane):
    # Retention trims by time: samples dated 1e12 were never trimmed.
    agent = plane.agent("node-0")
    await plane.connected(1)
    agent.send(telemetry=agent_pb2.Telemetry(time=1e12, devices=[agent_pb2.DeviceSample(device="node-0/0", step=0)]))
    await eventually(lambda: plane.cp.store.pending >= 1)
    stored = plane.cp.store._pending[-1][1]
    assert stored["time"] <= time.time()


async def test_streams_that_never_say_hello_are_ended_and_cannot_take_every_slot(plane_factory, monkeypatch):
    monkeypatch.setattr(api, "HELLO_WITHIN_S", 0.5)
    monkeypatch.setattr(Authenticator, "agent", lambda self, context: "node-0")  # as node-0's certificate says
    plane = await plane_factory(max_agent_streams=8)

    async def nothing():
        await asyncio.sleep(3600)
        yield agent_pb2.AgentMessage()

    silent = [plane.agents.Connect(nothing()) for _ in range(api.MAX_OPENING + 1)]
    got = [await code_of(asyncio.wait_for(call.read(), 5)) for call in silent]
    # One node's certificate waits on MAX_OPENING streams at once; the next is refused.
    codes = [code for code, _ in got]
    assert codes.count(grpc.StatusCode.INVALID_ARGUMENT) == api.MAX_OPENING
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1
    assert all("no hello within 0.5 s" in d for c, d in got if c == grpc.StatusCode.INVALID_ARGUMENT)
    plane.agent("node-0")
    await plane.connected(1)  # the slots were given back
