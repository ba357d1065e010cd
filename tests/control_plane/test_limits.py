"""Rate limits: a burst, then a steady rate, per caller and RPC."""

from __future__ import annotations

import grpc
import pytest

from drover.control_plane.limits import RateLimiter, ResourceExhausted
from drover.v1 import jobs_pb2


def test_a_burst_then_the_steady_rate_per_caller():
    now = [0.0]
    limiter = RateLimiter({"Replan": (2, 0.5)}, clock=lambda: now[0])
    limiter.check("Replan", "alice")
    limiter.check("Replan", "alice")
    with pytest.raises(ResourceExhausted, match="retry in 2.0 s"):
        limiter.check("Replan", "alice")
    limiter.check("Replan", "bob")  # callers are counted apart
    limiter.check("GetJob", "alice")  # and unlimited RPCs are not counted
    now[0] = 2.0
    limiter.check("Replan", "alice")


async def test_replans_beyond_the_limit_are_resource_exhausted(plane):
    codes = []
    for _ in range(8):
        try:
            await plane.jobs.Replan(jobs_pb2.ReplanRequest(job_id="no-such-job"))
        except grpc.aio.AioRpcError as exc:
            codes.append(exc.code())
    assert codes[:5] == [grpc.StatusCode.NOT_FOUND] * 5
    assert codes[5:] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
