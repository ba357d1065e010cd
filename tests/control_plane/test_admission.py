"""Admission over real gRPC and SQLite: a device belongs to at most one running
job; a job that cannot be placed waits (PENDING, with the reason) and starts,
oldest first, when devices free up or a node joins; it asks for nodes or
devices, and drained nodes get none."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from drover.storage import queries
from drover.storage.models import Event, HistoryPoint, JobProgress, Plan, TelemetrySample
from drover.v1 import jobs_pb2, state_pb2

from support import TINY_JOB, eventually, job_spec


def asking(resources: str) -> str:
    return TINY_JOB + f"resources: {resources}\n"


async def state_of(plane, job_id: str) -> jobs_pb2.Job:
    return await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id))


async def test_jobs_never_share_a_device_and_the_third_waits(plane):
    first, second = plane.agent("node-0"), plane.agent("node-1")
    await plane.connected(2)
    a = await plane.submit(asking("{nodes: 1}"))
    b = await plane.submit(asking("{nodes: 1}"))
    starts = {}
    for agent in (first, second):
        start = (await agent.receive()).start_job
        starts[start.job_id] = set(start.ranks)
    assert set(starts) == {a.id, b.id} and not starts[a.id] & starts[b.id]
    waiting = await plane.submit()  # every free device: there are none
    assert waiting.state == state_pb2.JOB_STATE_PENDING and "waiting for a free device" in waiting.detail
    pending = await state_of(plane, waiting.id)
    assert pending.state == state_pb2.JOB_STATE_PENDING and not pending.HasField("progress")

    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=a.id))  # its node frees up
    freed = first if "node-0/0" in starts[a.id] else second
    message = await freed.receive()
    while message.WhichOneof("body") != "start_job":  # the cancel of a comes first
        message = await freed.receive()
    assert message.start_job.job_id == waiting.id and set(message.start_job.ranks) == starts[a.id]
    started = await eventually(lambda: _running(plane, waiting.id), what="the waiting job to run")
    assert started.detail == ""


async def _running(plane, job_id):
    job = await state_of(plane, job_id)
    return job if job.state == state_pb2.JOB_STATE_RUNNING else None


async def test_a_job_waits_for_the_devices_it_asks_for_until_a_node_joins(plane):
    plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit(asking("{devices: 3}"))
    assert job.state == state_pb2.JOB_STATE_PENDING and "waiting for 3 free devices (2 free now)" in job.detail
    newcomer = plane.agent("node-1")
    start = (await newcomer.receive()).start_job
    assert start.job_id == job.id and len(start.ranks) == 3
    assert (await eventually(lambda: _running(plane, job.id), what="running")).state == state_pb2.JOB_STATE_RUNNING


async def test_drained_nodes_get_no_job_and_pending_jobs_can_be_cancelled(plane):
    plane.agent("node-0")
    await plane.connected(1)
    await plane.jobs.DrainNode(jobs_pb2.NodeRequest(node="node-0"))
    job = await plane.submit()
    assert job.state == state_pb2.JOB_STATE_PENDING
    assert job.detail.endswith("every connected node is drained")  # it said every device ran another job
    cancelled = await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    assert cancelled.state == state_pb2.JOB_STATE_CANCELLED
    await plane.jobs.UndrainNode(jobs_pb2.NodeRequest(node="node-0"))
    assert (await state_of(plane, job.id)).state == state_pb2.JOB_STATE_CANCELLED  # not started after all


@pytest.mark.parametrize(
    "resources, fragment",
    [("{nodes: 0}", "'resources.nodes' = 0"), ("{gpus: 2}", "'resources.gpus'"), ("{nodes: 1, devices: 2}", "one of")],
)
async def test_bad_resources_are_invalid(plane, resources, fragment):
    plane.agent("node-0")
    await plane.connected(1)
    with pytest.raises(grpc.aio.AioRpcError) as info:  # as YAML: a JobSpec cannot even hold the last two
        await plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(job_yaml=asking(resources)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()


async def test_a_stored_job_this_version_cannot_read_fails_alone_and_the_queue_moves_on(plane):
    plane.agent("node-0")
    await plane.connected(1)
    unreadable = await plane.submit(asking("{devices: 3}"))
    readable = await plane.submit(asking("{devices: 3}"))

    def rules_changed(session):  # as if a later version's rules refused what an earlier one stored
        queries.get_job(session, unreadable.id).model_yaml = json.dumps({"steps": 3})

    await plane.cp.store.write(rules_changed)
    newcomer = plane.agent("node-1")
    assert (await newcomer.receive()).start_job.job_id == readable.id
    failed = await state_of(plane, unreadable.id)
    assert failed.state == state_pb2.JOB_STATE_FAILED and "cannot read the stored job" in failed.detail
    assert [e.kind for e in await plane.events(unreadable.id)][-1] == "job_failed"


HUGE_JOB = TINY_JOB.replace("hidden: 64", "hidden: 8192").replace("ffn_hidden: 256", "ffn_hidden: 32768")


async def test_a_job_no_plan_fits_is_refused_whole_and_leaves_no_row(plane):
    plane.agent("node-0")
    await plane.connected(1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plane.submit(HUGE_JOB)  # 3 billion parameters on two 8 GiB devices
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no-feasible-plan" in info.value.details()
    assert (await plane.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []


async def test_a_queued_job_no_plan_fits_fails_alone_and_the_queue_moves_on(plane):
    agent = plane.agent("node-0")
    await plane.connected(1)
    running = await plane.submit()
    await agent.receive()
    huge, tiny = await plane.submit(HUGE_JOB), await plane.submit()
    assert (await state_of(plane, huge.id)).state == state_pb2.JOB_STATE_PENDING
    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=running.id))  # frees the devices
    while (message := await agent.receive()).WhichOneof("body") != "start_job":
        pass
    assert message.start_job.job_id == tiny.id
    failed = await state_of(plane, huge.id)
    assert failed.state == state_pb2.JOB_STATE_FAILED and "no plan" in failed.detail
    assert [e.kind for e in await plane.events(huge.id)][-1] == "job_failed"


@pytest.mark.parametrize(
    "first, second, field",
    [
        ({"out_dir": "runs/a"}, {"out_dir": "runs/a"}, "out_dir"),
        ({"out_dir": "runs"}, {"out_dir": "runs/a"}, "out_dir"),  # inside the other's folder
        ({"out_dir": "x", "checkpoint": "ckpt"}, {"out_dir": "y", "checkpoint": "ckpt"}, "checkpoint.dir"),
        ({"out_dir": "."}, {"out_dir": "runs/b"}, "out_dir"),  # the data root holds every folder
    ],
)
async def test_two_jobs_never_write_to_one_folder(plane, first, second, field):
    # They overwrote each other's files, and each pruned the other's checkpoints.
    plane.agent("node-0")
    await plane.connected(1)

    async def submit(job):
        text = TINY_JOB + (f"checkpoint: {{dir: {job['checkpoint']}}}\n" if "checkpoint" in job else "")
        return await plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(text), out_dir=job["out_dir"]))

    running = await submit(first)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await submit(second)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith(f"{field} = ") and running.id in info.value.details()
    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=running.id))
    if first["out_dir"] == second["out_dir"]:  # an ended job's output is its own while it is on record
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await submit(second)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"job {running.id} (cancelled) wrote its output there" in info.value.details()
        assert f"(drover job delete {running.id})" in info.value.details()
        await plane.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=running.id))
    # Free once the other ended (a folder inside or around its output replaces none of its files;
    # a checkpoint folder: a job resumed from it goes on there) or was forgotten.
    assert (await submit(second)).state != state_pb2.JOB_STATE_UNSPECIFIED


async def test_a_job_whose_end_is_being_stored_still_holds_its_folder(plane):
    # Review: a job ending left the running jobs before its row said so, and the check read
    # only pending and ended rows: another job could take its folder while its workers wrote.
    plane.agent("node-0")
    await plane.connected(1)
    request = jobs_pb2.SubmitJobRequest(spec=job_spec(TINY_JOB), out_dir="runs/a")
    running = await plane.jobs.SubmitJob(request)
    ending = plane.cp.jobs.pop(running.id)  # as the end does, before it is stored
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await plane.jobs.SubmitJob(request)
    finally:
        plane.cp.jobs[running.id] = ending
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"job {running.id} (running) writes to 'runs/a'" in info.value.details()


async def test_the_folders_checked_are_those_of_the_job_submitted_not_of_one_pending(plane):
    # The check read the pending jobs' specs into the name of the submitted one's, and so
    # checked the last pending job's checkpoint folder instead of its own.
    plane.agent("node-0")
    await plane.connected(1)

    async def submit(text, out):
        return await plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(text), out_dir=out))

    with_checkpoints = TINY_JOB + "checkpoint: {dir: ckpt}\n"
    running = await submit(with_checkpoints, "a")  # every device
    assert (await submit(TINY_JOB, "b")).state == state_pb2.JOB_STATE_PENDING
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await submit(with_checkpoints, "c")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith("checkpoint.dir = ") and running.id in info.value.details()


async def test_a_pending_job_cancelled_while_it_is_being_placed_never_runs(plane, monkeypatch):
    """Security review: a cancel landing while the queue's next job was planned answered
    'cancelled while pending', and the job then started and trained on, reported cancelled."""
    agent = plane.agent("node-0")
    await plane.connected(1)
    first = await plane.submit()
    await agent.receive()
    queued = await plane.submit()
    planning, release = asyncio.Event(), asyncio.Event()
    plan = plane.cp._plan

    async def slow_plan(spec, nodes):
        planning.set()
        await release.wait()
        return await plan(spec, nodes)

    monkeypatch.setattr(plane.cp, "_plan", slow_plan)
    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=first.id))  # the queued job is placed next
    await asyncio.wait_for(planning.wait(), 10)
    cancel = asyncio.ensure_future(plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=queued.id)))
    await asyncio.sleep(0.3)
    release.set()
    cancelled = await asyncio.wait_for(cancel, 10)
    assert cancelled.state == state_pb2.JOB_STATE_CANCELLED
    assert queued.id not in plane.cp.jobs  # nothing runs it
    await asyncio.sleep(0.5)
    assert (await state_of(plane, queued.id)).state == state_pb2.JOB_STATE_CANCELLED
    told = [m async for m in _until_quiet(agent)]  # the first job's cancel, then the queued one's start
    started = [m.start_job.job_id for m in told if m.WhichOneof("body") == "start_job"]
    stopped = [m.command.cancel.job_id for m in told if m.WhichOneof("body") == "command"]
    assert started == [queued.id] and stopped == [first.id, queued.id], told  # started, then stopped


async def _until_quiet(agent):
    while True:
        try:
            yield await agent.receive(timeout_s=0.5)
        except TimeoutError:
            return


async def test_an_ended_job_is_deleted_whole_and_its_agents_told_a_running_one_is_not(plane):
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()  # its start
    code, details = await code_of(plane.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "cancel it first" in details
    await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    kept = job.id, (await plane.submit()).id  # another job, whose record stays
    deleted = await plane.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id))
    assert deleted.job_id == job.id and list(deleted.nodes_told) == ["node-0"]
    told = [m async for m in _until_quiet(agent)]
    assert [m.command.forget_job.job_id for m in told if m.command.HasField("forget_job")] == [job.id]
    code, _ = await code_of(plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id)))
    assert code == grpc.StatusCode.NOT_FOUND
    store = plane.cp.store
    for model in (Event, Plan, HistoryPoint, TelemetrySample, JobProgress):
        rows = store.read(lambda s, m=model: s.query(m).filter(m.job_id == job.id).count())
        assert rows == 0, model
    assert store.read(lambda s: queries.get_job(s, kept[1])).id == kept[1]
    assert [e.kind for e in await plane.events(kept[1])][:1] == ["job_started"]
    code, _ = await code_of(plane.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id)))
    assert code == grpc.StatusCode.NOT_FOUND


async def code_of(call):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()
