"""Rate limits: a burst, then a steady rate, per caller and RPC."""

from __future__ import annotations

import time

import grpc
import pytest

from drover.control_plane import api
from drover.control_plane.limits import Pacer, RateLimiter, ResourceExhausted
from drover.v1 import agent_pb2, jobs_pb2

from support import eventually


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


def test_a_pacer_lets_a_burst_through_then_one_message_per_interval_per_caller():
    now = [0.0]
    pacer = Pacer(2, 4.0, clock=lambda: now[0])
    assert [pacer.wait_s("node-0") for _ in range(3)] == [0.0, 0.0, 0.25]
    assert pacer.wait_s("node-1") == 0.0  # callers are paced apart
    now[0] = 0.25
    assert pacer.wait_s("node-0") == 0.0 and pacer.wait_s("node-0") == 0.25


async def test_an_agent_flooding_its_stream_is_read_at_its_rate_and_loses_nothing(plane_factory, monkeypatch):
    monkeypatch.setattr(api, "AGENT_MESSAGES", (5, 50.0))
    plane = await plane_factory()
    handled: dict[str, list[float]] = {"node-0": [], "node-1": []}
    telemetry = plane.cp.telemetry

    async def counted(node, message):
        handled[node].append(time.monotonic())
        await telemetry(node, message)

    monkeypatch.setattr(plane.cp, "telemetry", counted)
    flooding, other = plane.agent("node-0"), plane.agent("node-1")
    await plane.connected(2)
    for _ in range(40):
        flooding.send(telemetry=agent_pb2.Telemetry(time=time.time()))
    await eventually(lambda: len(handled["node-0"]) >= 10, what="the flood under way")
    sent = time.monotonic()
    other.send(telemetry=agent_pb2.Telemetry(time=time.time()))
    await eventually(lambda: len(handled["node-0"]) == 40 and handled["node-1"], what="every message handled")
    first, last = handled["node-0"][0], handled["node-0"][-1]
    assert last - first >= 0.9 * (40 - 5) / 50.0  # paced: 35 past the burst, 50 a second
    assert handled["node-1"][0] - sent < 0.3  # the other node is not held up behind it
    assert not flooding.call.done()  # slowed, not cut off
