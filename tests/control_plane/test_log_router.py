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
    call = logs.call_queue(1)
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


async def one_node_call():
    """A call on node-1's logs, started: (router, outboxes, the call, its first item to come,
    the ReadLogs node-1 was sent)."""
    router = logs.LogRouter()
    outboxes = {"node-1": asyncio.Queue()}
    call = logs.stream(router, outboxes, ["node-1"], agent_pb2.ReadLogs(job_id="j"))
    first = asyncio.ensure_future(anext(call))
    await asyncio.sleep(0)
    return router, outboxes, call, first, (await outboxes["node-1"].get()).command.read_logs


async def test_what_the_reader_takes_is_acknowledged_so_the_agent_may_send_more():
    router, outboxes, call, first, read = await one_node_call()
    assert read.window == logs.WINDOW
    for _ in range(logs.WINDOW):  # a whole window, as the agent may send before any ack
        router.deliver("node-1", chunk(read.request_id))
    await first
    for _ in range(logs.WINDOW - 1):
        await anext(call)
    after = asyncio.ensure_future(anext(call))  # the caller comes back for more: the last is taken
    await asyncio.sleep(0)
    acks = []
    while not outboxes["node-1"].empty():
        acks.append((await outboxes["node-1"].get()).command.ack_logs)
    assert [a.chunks for a in acks] == [logs.WINDOW // 2, logs.WINDOW // 2]  # all taken, all acknowledged
    assert {a.request_id for a in acks} == {read.request_id}
    router.deliver("node-1", chunk(read.request_id, "", b"", end=True))
    with pytest.raises(StopAsyncIteration):
        await after
    assert router.requests == {} and router.calls == 0 and outboxes["node-1"].empty()


async def test_an_agent_sending_past_its_window_ends_the_call_and_is_told_to_stop():
    router, outboxes, call, first, read = await one_node_call()
    for _ in range(3 * logs.WINDOW):  # nobody takes them: past its window
        router.deliver("node-1", chunk(read.request_id))
    assert (await first).data == b"x"
    with pytest.raises(logs.ResourceExhausted):
        while True:
            await anext(call)
    assert router.requests == {} and router.calls == 0
    messages = []
    while not outboxes["node-1"].empty():
        messages.append((await outboxes["node-1"].get()).command)
    assert messages[-1].stop_logs.request_id == read.request_id
