"""Workers' logs read through the agents' streams (`drover job logs`).

A StreamLogs call becomes one ReadLogs per node, each with a request id of
its own; the agents answer with LogChunks on their streams, which are routed
here to the waiting call by request id, and accepted only from the node the
request went to. A node whose stream ends, or that sends its last chunk,
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
QUEUED = 256  # chunks waiting for a slow reader before the call is ended


@dataclass
class Request:
    node: str
    call: asyncio.Queue  # (node, LogChunk), or None once more waited than QUEUED


def call_queue() -> asyncio.Queue:
    return asyncio.Queue(QUEUED + 1)  # room for the None that ends an overflowing call


class LogRouter:
    def __init__(self):
        self.requests: dict[str, Request] = {}  # request id -> where its chunks go

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
        if request.call.qsize() >= QUEUED:  # a reader too slow for the logs: its call ends, memory stays bounded
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
    they send until each is done; the readers still open are stopped when the call ends."""
    call = call_queue()
    waiting: dict[str, str] = {}  # request id -> node
    try:
        for node in nodes:
            outbox = outboxes.get(node)
            if outbox is None:
                yield jobs_pb2.LogLines(node=node, unavailable=f"the agent of {node} is not connected")
                continue
            request_id = router.open(node, call)
            waiting[request_id] = node
            read = agent_pb2.ReadLogs()
            read.CopyFrom(ask)
            read.request_id = request_id
            outbox.put_nowait(agent_pb2.ControlMessage(command=agent_pb2.Command(read_logs=read)))
        while waiting:
            item = await call.get()
            if item is None:
                raise ResourceExhausted(f"more than {QUEUED} log chunks waited for this reader; ask again")
            node, chunk = item
            if chunk.request_id not in waiting:
                continue
            lines = lines_of(node, chunk)
            if lines is not None:
                yield lines
            if chunk.end:
                router.close(chunk.request_id)
                del waiting[chunk.request_id]
    finally:
        for request_id, node in waiting.items():
            router.close(request_id)
            if node in outboxes:
                stop = agent_pb2.Command(stop_logs=agent_pb2.StopLogs(request_id=request_id))
                outboxes[node].put_nowait(agent_pb2.ControlMessage(command=stop))
