"""Workers' logs read through the agents' streams (`drover job logs`).

A StreamLogs call becomes one ReadLogs per node, each with a request id of
its own; the agents answer with LogChunks on their streams, which are routed
here to the waiting call by request id, and accepted only from the node the
request went to. Flow control: a node sends at most WINDOW chunks ahead of
what the caller has taken (AckLogs give it more), and its agent sends
telemetry before any log chunk. A node whose stream ends, or that sends its last chunk,
is done; the call ends when every node is (or, following, when the job has
ended and every node said so), and a call that goes away stops its readers.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

from drover.v1 import agent_pb2, jobs_pb2

from .limits import ResourceExhausted
from .validation import PermissionDenied

MAX_TAIL_BYTES = 16 * 1024 * 1024
MAX_OPEN = 64  # log calls served at once by this control plane
WINDOW = 32  # data chunks (64 KiB each) a node may send a call ahead of its reader


@dataclass
class Request:
    node: str
    call: asyncio.Queue  # (node, LogChunk), or None once a node sent past its window


def call_queue(nodes: int) -> asyncio.Queue:
    """Room for every node's window and last chunk, and the None that ends a call whose
    agent ignored its window."""
    return asyncio.Queue(nodes * (WINDOW + 1) + 1)


class LogRouter:
    def __init__(self):
        self.requests: dict[str, Request] = {}  # request id -> where its chunks go
        self.calls = 0  # StreamLogs calls open

    def open(self, node: str, call: asyncio.Queue) -> str:
        request_id = secrets.token_hex(12)
        self.requests[request_id] = Request(node, call)
        return request_id

    def close(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def deliver(self, node: str, chunk: agent_pb2.LogChunk) -> None:
        """A chunk from `node`'s stream: checked against the request it names, then queued."""
        request = self.requests.get(chunk.request_id)
        if request is None:
            return  # the call went away meanwhile: nothing waits for it
        if request.node != node:
            raise PermissionDenied(f"log_chunk.request_id = {chunk.request_id[:64]!r}: not a request to {node}")
        if chunk.device and not chunk.device.startswith(node + "/"):
            raise PermissionDenied(f"log_chunk.device = {chunk.device[:80]!r}: node {node} sends its own logs only")
        if request.call.qsize() >= request.call.maxsize - 1:  # past its window: the call ends, memory bounded
            for request_id in [r for r, q in self.requests.items() if q.call is request.call]:
                self.close(request_id)
            request.call.put_nowait(None)
            return
        request.call.put_nowait((node, chunk))

    def node_gone(self, node: str) -> None:
        for request_id, request in list(self.requests.items()):
            if request.node == node:
                note = f"the agent of {node} disconnected"
                self.deliver(node, agent_pb2.LogChunk(request_id=request_id, end=True, note=note))


def lines_of(node: str, chunk: agent_pb2.LogChunk) -> jobs_pb2.LogLines | None:
    """What the client sees of a chunk: its data, or why a node's logs are unavailable."""
    if chunk.data:
        return jobs_pb2.LogLines(node=node, device=chunk.device, data=chunk.data)
    if chunk.end and chunk.note:
        return jobs_pb2.LogLines(node=node, unavailable=chunk.note)
    return None


async def stream(router: LogRouter, outboxes: dict, nodes: list[str], ask: agent_pb2.ReadLogs):
    """LogLines of `nodes` for one call: a ReadLogs like `ask` to each connected node, then what
    they send until each is done. Each node sends at most WINDOW chunks ahead: every chunk the
    caller takes is acknowledged (AckLogs, half a window at a time), so a slow reader slows the
    agents down instead of filling memory. The readers still open are stopped when the call ends."""
    call = call_queue(len(nodes))
    waiting: dict[str, str] = {}  # request id -> node
    taken: dict[str, int] = {}  # request id -> chunks taken since the last acknowledgement
    router.calls += 1
    try:
        for node in nodes:
            outbox = outboxes.get(node)
            if outbox is None:
                yield jobs_pb2.LogLines(node=node, unavailable=f"the agent of {node} is not connected")
                continue
            request_id = router.open(node, call)
            waiting[request_id], taken[request_id] = node, 0
            read = agent_pb2.ReadLogs()
            read.CopyFrom(ask)
            read.request_id, read.window = request_id, WINDOW
            outbox.put_nowait(agent_pb2.ControlMessage(command=agent_pb2.Command(read_logs=read)))
        while waiting:
            item = await call.get()
            if item is None:
                raise ResourceExhausted("an agent sent logs past its window; ask again")
            node, chunk = item
            if chunk.request_id not in waiting:
                continue
            lines = lines_of(node, chunk)
            if lines is not None:
                yield lines  # returns once the caller's stream took it
            if chunk.end:
                router.close(chunk.request_id)
                del waiting[chunk.request_id]
            elif chunk.data:
                taken[chunk.request_id] += 1
                if taken[chunk.request_id] >= WINDOW // 2 and node in outboxes:
                    ack = agent_pb2.AckLogs(request_id=chunk.request_id, chunks=taken[chunk.request_id])
                    outboxes[node].put_nowait(agent_pb2.ControlMessage(command=agent_pb2.Command(ack_logs=ack)))
                    taken[chunk.request_id] = 0
    finally:
        router.calls -= 1
        for request_id, node in waiting.items():
            router.close(request_id)
            if node in outboxes:
                stop = agent_pb2.Command(stop_logs=agent_pb2.StopLogs(request_id=request_id))
                outboxes[node].put_nowait(agent_pb2.ControlMessage(command=stop))
