"""A job's history (every step's progress and the devices' rates then) and its events,
read back page by page through real gRPC and SQLite, as `drover report` reads them."""

from __future__ import annotations

import asyncio
import math
import time

from test_rollout import start_two_node_job, step_of

from drover.v1 import agent_pb2, jobs_pb2, state_pb2

from support import eventually


def progress(step: int, loss: float = 4.0) -> state_pb2.Progress:
    return state_pb2.Progress(step=step, loss=loss, lr=0.003, tokens_per_s=640.0, samples_per_s=20.0 + step)


async def test_every_step_reported_is_kept_with_the_rates_of_the_moment(plane):
    job, a, b = await start_two_node_job(plane)
    for step in range(8):  # node-1/0 3x slow from step 4
        step_of(a, job.id, step, slow=step >= 4)
        step_of(b, job.id, step, slow=step >= 4)
        await asyncio.sleep(0.02)
    await eventually(lambda: plane.cp.jobs[job.id].detector.rates().get("node-1/0") == 3.0, what="the straggler")
    # Rank 0's agent: three steps since its last message, one of them diverged.
    steps = [progress(5), progress(6, loss=math.nan), progress(7)]
    a.send(
        telemetry=agent_pb2.Telemetry(
            time=time.time(), job_id=job.id, active_plan_version=1, progress=steps[-1], steps=steps
        )
    )
    await eventually(lambda: plane.cp.jobs[job.id].progress, what="the progress")
    pages, request = [], jobs_pb2.QueryHistoryRequest(job_id=job.id, page_size=2)
    while True:
        page = await plane.jobs.QueryHistory(request)
        pages.append(page.points)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    points = [p for page in pages for p in page]
    assert [len(p) for p in pages] == [2, 1] and [p.step for p in points] == [5, 6, 7]
    assert [p.samples_per_s for p in points] == [25.0, 26.0, 27.0]
    assert not points[1].HasField("loss") and points[0].loss == 4.0  # a diverged step keeps no loss
    assert dict(points[2].rates) == {"node-0/0": 1.0, "node-0/1": 1.0, "node-1/0": 3.0, "node-1/1": 1.0}
    assert all(p.plan_version == 1 for p in points)

    events = await plane.jobs.ListEvents(jobs_pb2.ListEventsRequest(job_id=job.id, page_size=1))
    assert events.events[0].kind == "job_started" and events.next_page_token == "1"
    rest = await plane.jobs.ListEvents(jobs_pb2.ListEventsRequest(job_id=job.id, page_token="1"))
    assert "straggler_detected" in [e.kind for e in rest.events]
