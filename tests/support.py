"""Helpers the tests share: a scripted agent stream, an in-process control
plane, and `eventually` for conditions that become true asynchronously."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from drover.control_plane.api import start_server, stop_server
from drover.control_plane.controller import ControlPlane
from drover.v1 import agent_pb2, agent_pb2_grpc, jobs_pb2, jobs_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
TINY_JOB = (ROOT / "examples" / "jobs" / "tiny.yaml").read_text()
JOBS_DIR = str(ROOT / "examples" / "jobs")


async def eventually(check, timeout_s: float = 10.0, every_s: float = 0.05, what: str = "condition"):
    """Await `check()` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s (last: {result!r})")
        await asyncio.sleep(every_s)


def cpu_device(device_id: str) -> agent_pb2.Device:
    return agent_pb2.Device(id=device_id, kind="cpu", name="cpu", memory_gib=8, tflops=0.05)


class ScriptedAgent:
    """An agent stream driven by the test: what it sends, and what comes back."""

    def __init__(self, stub: agent_pb2_grpc.AgentServiceStub, node: str, devices: int = 2):
        self.node = node
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.outbox.put_nowait(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
            node=node, agent_version="test", devices=[cpu_device(f"{node}/{i}") for i in range(devices)])))

        async def requests():
            while True:
                yield await self.outbox.get()
        self.call = stub.Connect(requests())

    def send(self, **body) -> None:
        self.outbox.put_nowait(agent_pb2.AgentMessage(**body))

    def report(self, job_id: str, step: int, compute: dict[str, float], version: int = 1) -> None:
        """Telemetry for one step: compute seconds per block of each named device."""
        self.send(telemetry=agent_pb2.Telemetry(time=time.time(), job_id=job_id, active_plan_version=version, devices=[
            agent_pb2.DeviceSample(device=d, step=step, compute_s_per_block=c) for d, c in compute.items()]))

    async def receive(self, timeout_s: float = 10.0) -> agent_pb2.ControlMessage:
        return await asyncio.wait_for(self.call.read(), timeout_s)


@dataclass
class Plane:
    """A control plane served in process on a real port, over a real SQLite file."""
    cp: ControlPlane
    jobs: jobs_pb2_grpc.JobServiceStub
    agents: agent_pb2_grpc.AgentServiceStub
    channel: grpc.aio.Channel
    tmp: Path

    def agent(self, node: str, devices: int = 2) -> ScriptedAgent:
        return ScriptedAgent(self.agents, node, devices)

    async def connected(self, count: int) -> None:
        async def enough():
            nodes = await self.jobs.ListNodes(jobs_pb2.ListNodesRequest())
            return sum(n.connected for n in nodes.nodes) >= count
        await eventually(enough, what=f"{count} agents connected")

    async def submit(self, job_yaml: str = TINY_JOB) -> jobs_pb2.Job:
        return await self.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(job_yaml=job_yaml, base_dir=JOBS_DIR,
                                                                   out_dir=str(self.tmp / "out")))

    async def events(self, job_id: str) -> list[jobs_pb2.Event]:
        return [e async for e in _until_quiet(self.jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id)))]


async def _until_quiet(stream, quiet_s: float = 0.3):
    """The events stored so far: a running job's watch never ends by itself."""
    iterator = stream.__aiter__()
    while True:
        try:
            yield await asyncio.wait_for(iterator.__anext__(), quiet_s)
        except (asyncio.TimeoutError, StopAsyncIteration):
            stream.cancel()
            return


async def serve_plane(tmp: Path, **options):
    """Start a Plane; returns (plane, stop coroutine function)."""
    server, cp, port = await start_server(str(tmp / "drover.db"), "127.0.0.1:0", **options)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    plane = Plane(cp, jobs_pb2_grpc.JobServiceStub(channel), agent_pb2_grpc.AgentServiceStub(channel), channel, tmp)

    async def stop():
        await channel.close()
        await stop_server(server, cp)
    return plane, stop
