"""A node that connects while a job runs, over real gRPC and SQLite: the job grows onto it
only while enough steps are left to win back the switch, and it ends when the others
finish before the newcomer's world has formed."""

from __future__ import annotations

import asyncio

from drover.v1 import agent_pb2, jobs_pb2, state_pb2

from support import TINY_JOB, eventually

LONG_JOB = TINY_JOB.replace("steps: 30", "steps: 1000")


async def _started_on_node_0(plane):
    first = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit(LONG_JOB)
    start = (await first.receive()).start_job
    assert start.job_id == job.id and set(start.ranks) == {"node-0/0", "node-0/1"}
    return first, job


async def _kinds(plane, job_id):
    return [e.kind for e in await plane.events(job_id)]


async def test_a_node_connecting_near_the_end_is_not_grown_onto(plane):
    first, job = await _started_on_node_0(plane)
    first.report(job.id, 998, {"node-0/0": 0.01, "node-0/1": 0.01})  # one step left
    await eventually(lambda: _step(plane, job.id, 998), what="step 998 heard")
    plane.agent("node-1")
    await eventually(lambda: _has(plane, job.id, "join_skipped"), what="the join skipped")
    (skipped,) = [e for e in await plane.events(job.id) if e.kind == "join_skipped"]
    assert skipped.join_skipped.node == "node-1" and skipped.join_skipped.steps_left == 1
    # Faster by more than the minimum gain, but not for long enough to win back the switch.
    assert skipped.join_skipped.step_s_grown < skipped.join_skipped.step_s_now * (1 - plane.cp.settings.min_gain)
    assert skipped.join_skipped.migration_s > 0
    assert "node_joined" not in await _kinds(plane, job.id)


async def test_a_job_whose_others_finish_before_the_newcomer_starts_completes(plane):
    first, job = await _started_on_node_0(plane)
    first.report(job.id, 10, {"node-0/0": 0.01, "node-0/1": 0.01})
    await eventually(lambda: _step(plane, job.id, 10), what="step 10 heard")
    newcomer = plane.agent("node-1")
    start = (await newcomer.receive()).start_job
    assert start.job_id == job.id and "node-1/0" in start.ranks
    assert (await first.receive()).WhichOneof("body") == "recover"
    # node-0's workers ran to the end without meeting node-1's: the job is done, node-1 told to stop.
    first.send(status=agent_pb2.JobStatus(job_id=job.id, state=state_pb2.JOB_STATE_COMPLETED, active_plan_version=1))
    cancel = (await newcomer.receive()).command.cancel
    assert cancel.job_id == job.id
    await eventually(lambda: _state(plane, job.id, state_pb2.JOB_STATE_COMPLETED), what="the job completed")
    assert (await _kinds(plane, job.id))[-1] == "job_completed"


async def test_a_drained_node_is_not_grown_onto_until_undrained(plane):
    first = plane.agent("node-0")
    plane.agent("node-1")
    await plane.connected(2)
    await plane.jobs.DrainNode(jobs_pb2.NodeRequest(node="node-1"))
    job = await plane.submit(LONG_JOB)
    start = (await first.receive()).start_job
    assert set(start.ranks) == {"node-0/0", "node-0/1"}
    first.report(job.id, 1, {"node-0/0": 0.01, "node-0/1": 0.01})  # plan 1 commits: idle nodes are offered
    await eventually(lambda: _has(plane, job.id, "plan_committed"), what="plan 1 committed")
    await asyncio.sleep(0.2)  # an offer (a plan, a few ms) would have been made by now
    assert "node_joined" not in await _kinds(plane, job.id)
    await plane.jobs.UndrainNode(jobs_pb2.NodeRequest(node="node-1"))
    await eventually(lambda: _has(plane, job.id, "node_joined"), what="grown onto node-1 once undrained")


async def _state(plane, job_id, state):
    return (await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id))).state == state


async def _step(plane, job_id, step):
    return (await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id))).step >= step


async def _has(plane, job_id, kind):
    return kind in await _kinds(plane, job_id)


async def test_a_job_grows_no_further_than_its_resources_ask(plane):
    # {nodes: 1} grew onto every idle node at its first commit, and a second {nodes: 1} job
    # then waited for a free node that the first had taken.
    first, second = plane.agent("node-0"), plane.agent("node-1")
    await plane.connected(2)
    one_node = LONG_JOB + "resources: {nodes: 1}\n"
    job = await plane.submit(one_node)
    (node,) = plane.cp.jobs[job.id].nodes
    placed = first if node == "node-0" else second
    assert (await placed.receive()).start_job.job_id == job.id
    ranks = plane.cp.jobs[job.id].ranks
    devices = {d: 0.01 for d in ranks}
    placed.report(job.id, 1, devices)
    await eventually(lambda: _has(plane, job.id, "plan_committed"), what="plan 1 committed")
    await asyncio.sleep(0.3)  # an offer would have been made by now
    assert "node_joined" not in await _kinds(plane, job.id)
    other = await plane.submit(one_node)
    await eventually(lambda: _state(plane, other.id, state_pb2.JOB_STATE_RUNNING), what="the second job running")
