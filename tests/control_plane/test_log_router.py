"""Routing log chunks from agents to `drover job logs` calls (control_plane/logs.py)."""

from __future__ import annotations

import asyncio

import pytest

from drover.control_plane import logs
from drover.control_plane.validation import PermissionDenied
from drover.v1 import agent_pb2


def chunk(request_id, device="node-1/0", data=b"x", **fields):
    return agent_pb2.LogChunk(request_id=request_id, device=device, data=data, **fields)


async def collect(router, outboxes, nodes, replies):
    """Run one call; `replies(read_logs)` answers each ReadLogs sent down a node's outbox."""
    got = []

    async def answer():
        for node, outbox in outboxes.items():
            message = await outbox.get()
            for reply in replies(node, message.command.read_logs):
                router.deliver(node, reply)

    answering = asyncio.create_task(answer())
    async for lines in logs.stream(router, outboxes, nodes, agent_pb2.ReadLogs(job_id="j")):
        got.append(lines)
    await answering
    return got


async def test_each_nodes_chunks_reach_the_call_and_it_ends_when_all_are_done():
    router = logs.LogRouter()
    outboxes = {"node-0": asyncio.Queue(), "node-1": asyncio.Queue()}

    def replies(node, read):
        return [chunk(read.request_id, f"{node}/0", node.encode()), chunk(read.request_id, "", b"", end=True)]

    got = await collect(router, outboxes, ["node-0", "node-1", "node-2"], replies)
    pieces = {(g.node, g.device, g.data) for g in got if g.data}
    assert pieces == {("node-0", "node-0/0", b"node-0"), ("node-1", "node-1/0", b"node-1")}
    assert [g.unavailable for g in got if g.unavailable] == ["the agent of node-2 is not connected"]
    assert router.requests == {}


async def test_a_chunk_for_another_nodes_request_or_device_is_refused():
    router = logs.LogRouter()
    call = logs.call_queue()
    request_id = router.open("node-1", call)
    with pytest.raises(PermissionDenied, match="not a request to node-0"):
        router.deliver("node-0", chunk(request_id, "node-0/0"))
    with pytest.raises(PermissionDenied, match="its own logs only"):
        router.deliver("node-1", chunk(request_id, "node-0/0"))
    router.deliver("node-1", chunk("unknown-request"))  # a call gone meanwhile: dropped
    assert call.empty()


async def test_a_node_that_disconnects_ends_its_part_with_why():
    router = logs.LogRouter()
    outboxes = {"node-1": asyncio.Queue()}

    def replies(node, read):
        router.node_gone(node)
        return []

    got = await collect(router, outboxes, ["node-1"], replies)
    assert [g.unavailable for g in got] == ["the agent of node-1 disconnected"]


async def test_a_reader_too_slow_ends_its_call_and_the_agents_are_told_to_stop(monkeypatch):
    monkeypatch.setattr(logs, "QUEUED", 3)
    router = logs.LogRouter()
    outboxes = {"node-1": asyncio.Queue()}
    call = logs.stream(router, outboxes, ["node-1"], agent_pb2.ReadLogs(job_id="j"))
    first = asyncio.ensure_future(anext(call))
    await asyncio.sleep(0)
    read = (await outboxes["node-1"].get()).command.read_logs
    for _ in range(10):
        router.deliver("node-1", chunk(read.request_id))
    assert (await first).data == b"x"
    with pytest.raises(logs.ResourceExhausted):
        while True:
            await anext(call)
    assert router.requests == {}
    stop = (await outboxes["node-1"].get()).command.stop_logs
    assert stop.request_id == read.request_id
