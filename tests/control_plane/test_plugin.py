"""The pytest plugin integrators get with Drover (drover.control_plane.testing): the real
control plane in process and simulated agents, through its fixtures."""

from __future__ import annotations

import json
import time

from drover.client import job_spec
from drover.v1 import jobs_pb2, state_pb2

from support import TINY_JOB

pytest_plugins = ["pytester"]


def test_a_straggler_is_planned_around_with_simulated_agents(drover_control_plane, drover_agent):
    drover_agent("node-0")
    drover_agent("node-1", rates={"node-1/0": 3.0})  # a straggler the first plan does not know of
    jobs = drover_control_plane.jobs()
    started = time.monotonic()
    long_enough = TINY_JOB.replace("steps: 30", "steps: 200")  # for a new plan to repay its migration
    job = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(long_enough), out_dir="out"))
    while jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id)).state == state_pb2.JOB_STATE_RUNNING:
        assert time.monotonic() - started < 30
        time.sleep(0.05)
    final = jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert final.state == state_pb2.JOB_STATE_COMPLETED, final.detail
    events = jobs.ListEvents(jobs_pb2.ListEventsRequest(job_id=job.id)).events
    detected = [json.loads(e.details_json) for e in events if e.kind == "straggler_detected"]
    assert [(d["device"], d["rate"]) for d in detected] == [("node-1/0", 3.0)]
    assert final.committed_plan_version >= 2 and final.progress.step == final.steps - 1


def test_the_fixtures_reach_any_test_suite_through_the_entry_point(pytester):
    pytester.makepyfile(
        """
        from drover.v1 import jobs_pb2

        def test_nodes(drover_control_plane, drover_agent):
            drover_agent("a", devices=4)  # returns once the control plane lists it
            (node,) = drover_control_plane.jobs().ListNodes(jobs_pb2.ListNodesRequest()).nodes
            assert node.name == "a" and node.connected and len(node.devices) == 4
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
