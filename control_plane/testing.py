"""A pytest plugin for integrators: a real control plane in process, and simulated agents.

Installed with Drover and registered through the `pytest11` entry point, so any test suite
that has Drover installed gets two fixtures, with nothing to import:

- `drover_control_plane`: a control plane served in a thread of its own on a free loopback
  port (insecure, loopback only), over a SQLite file in the test's temporary directory.
  `.address` is where to point a client; `.jobs()` is a JobService stub.
- `drover_agent`: a factory of simulated agents. `drover_agent("node-0", devices=2,
  rates={"node-0/1": 3.0})` connects a node whose devices run the steps of the jobs placed on
  it without torch: each step reports its compute (a fixed base, times the device's rate, for
  devices the newest plan gives work), follows every plan it is sent, reports progress where
  rank 0 is, and reports the job completed after its last step. `set_rate` changes a device's
  rate mid-job, as a straggler would, and so does the Straggle RPC; StreamLogs gets a line per
  step each device ran.

Everything in between is the real thing: gRPC, the SQLite store, detection, the planner,
rollouts. A scheduler's test against it runs in a second or two:

    def test_my_scheduler(drover_control_plane, drover_agent):
        drover_agent("node-0"); drover_agent("node-1", rates={"node-1/0": 3.0})
        my_scheduler.submit(drover_control_plane.address, "job.yaml")
        ...
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest

from drover.planner.wire import job_state, plan_from_proto
from drover.v1 import agent_pb2, agent_pb2_grpc, jobs_pb2, jobs_pb2_grpc, state_pb2

from .server import start_server, stop_server

STEP_S = 0.005  # a simulated step's wall time
BASE_S = 0.01  # a healthy device's compute per block per micro-batch, as reported
LOG_TAIL_BYTES = 1024 * 1024  # the most of a device's log sent, as an agent's default tail
LOG_CHUNK_BYTES = 64 * 1024  # a LogChunk's data at most, as an agent's


class _LoopThread:
    """An asyncio loop of its own in a daemon thread, for code the test calls synchronously."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class ControlPlaneServer:
    """`drover server --insecure` in process: started on construction, `stop()` ends it."""

    def __init__(self, db: Path, **options):
        """options: start_server's (e.g. detector=DetectorSettings(...), metrics_address=...)."""
        self._thread = _LoopThread("drover-control-plane")
        self.served = self._thread.run(start_server(str(db), "127.0.0.1:0", emulation=True, **options))
        self.address = f"127.0.0.1:{self.served.port}"
        self._channels: list[grpc.Channel] = []

    def jobs(self) -> jobs_pb2_grpc.JobServiceStub:
        """A JobService stub (synchronous) on a channel closed with the server."""
        self._channels.append(grpc.insecure_channel(self.address))
        return jobs_pb2_grpc.JobServiceStub(self._channels[-1])

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._thread.run(stop_server(self.served))
        self._thread.close()


def _all_nodes(stub) -> list:
    nodes, request = [], jobs_pb2.ListNodesRequest(page_size=1000)
    while True:
        page = stub.ListNodes(request)
        nodes += page.nodes
        if not page.next_page_token:
            return nodes
        request.page_token = page.next_page_token


class SimulatedAgent:
    """One node's agent stream, driven in a thread of its own (see the module's docstring)."""

    def __init__(self, address: str, node: str, devices: int = 2, rates: dict[str, float] | None = None, nics=()):
        self.node, self.address = node, address
        self.devices = [f"{node}/{i}" for i in range(devices)]
        self.nics = list(nics)
        self.rates = dict(rates or {})
        self.jobs: dict[str, dict] = {}  # job id -> what this node knows of it
        self._straggles: list[agent_pb2.Straggle] = []  # asked for through Straggle, from their step
        self._thread = _LoopThread(f"drover-agent-{node}")
        self._task = self._thread.run(self._start())
        with grpc.insecure_channel(address) as channel:  # returns once the control plane has it
            stub, deadline = jobs_pb2_grpc.JobServiceStub(channel), time.monotonic() + 10
            while not any(n.name == node and n.connected for n in _all_nodes(stub)):
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the control plane at {address} did not list {node} within 10 s")
                time.sleep(0.01)

    async def _start(self) -> asyncio.Task:
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._channel = grpc.aio.insecure_channel(self.address)
        hello = agent_pb2.Hello(
            node=self.node,
            agent_version="simulated",
            # As fast as the compute it reports (BASE_S a block) makes it for small models: the
            # planner then finds every device worth a stage, as on a real cluster, and a
            # straggler is planned around rather than left out from the start.
            devices=[
                agent_pb2.Device(id=d, kind="cpu", name="simulated", memory_gib=80.0, tflops=0.01) for d in self.devices
            ],
            nics=self.nics,
        )
        self._outbox.put_nowait(agent_pb2.AgentMessage(hello=hello))

        async def requests():
            while True:
                yield await self._outbox.get()

        self._call = agent_pb2_grpc.AgentServiceStub(self._channel).Connect(requests())
        return asyncio.get_running_loop().create_task(self._follow())

    def set_rate(self, device: str, rate: float) -> None:
        """From the next step, `device` takes `rate` times a healthy device's time."""
        self.rates[device] = rate

    async def _follow(self) -> None:
        async for message in self._call:
            kind = message.WhichOneof("body")
            if kind == "start_job":
                start = message.start_job
                self.jobs[start.job_id] = {
                    "steps": start.steps,
                    "ranks": dict(start.ranks),
                    "plans": {start.plan_version: plan_from_proto(start.plan)},
                    "step": -1,
                    "state": "running",
                }
                asyncio.get_running_loop().create_task(self._run(start.job_id))
            elif kind == "plan" and message.plan.job_id in self.jobs:
                self.jobs[message.plan.job_id]["plans"][message.plan.version] = plan_from_proto(message.plan.plan)
            elif kind == "command":
                self._obey(message.command)

    def _obey(self, command: agent_pb2.Command) -> None:
        order = command.WhichOneof("body")
        if order == "cancel" and command.cancel.job_id in self.jobs:
            self.jobs[command.cancel.job_id]["state"] = "cancelled"
        elif order == "straggle":
            self._straggles.append(command.straggle)
        elif order == "read_logs":
            self._send_logs(command.read_logs)

    def _send_logs(self, ask: agent_pb2.ReadLogs) -> None:
        """Each asked device's log: a line per step it ran (the tail of it), then the end;
        `follow` ends there too."""
        job = self.jobs.get(ask.job_id)
        devices = [d for d in (ask.devices or self.devices) if job is not None and d in job["ranks"]]
        for device in devices:
            log = "".join(f"{device}: step {step}\n" for step in range(job["step"] + 1)).encode()
            data = log[-min(ask.tail_bytes or LOG_TAIL_BYTES, LOG_TAIL_BYTES) :]
            for at in range(0, len(data), LOG_CHUNK_BYTES):  # as a real agent sends them
                piece = data[at : at + LOG_CHUNK_BYTES]
                chunk = agent_pb2.LogChunk(request_id=ask.request_id, device=device, data=piece)
                self._outbox.put_nowait(agent_pb2.AgentMessage(log_chunk=chunk))
        note = "" if devices else f"no logs of {ask.job_id} on {self.node}"
        end = agent_pb2.LogChunk(request_id=ask.request_id, end=True, note=note)
        self._outbox.put_nowait(agent_pb2.AgentMessage(log_chunk=end))

    async def _run(self, job_id: str) -> None:
        job = self.jobs[job_id]
        rank0 = min(job["ranks"], key=job["ranks"].get)
        for step in range(job["steps"]):
            if job["state"] != "running":
                return
            await asyncio.sleep(STEP_S)
            for straggle in [s for s in self._straggles if s.from_step <= step]:
                self.rates[straggle.device] = straggle.rate
                self._straggles.remove(straggle)
            version = max(job["plans"])
            working = {d for p in job["plans"][version].pipelines for s in p.stages for d in s.devices}
            samples = [
                agent_pb2.DeviceSample(
                    device=d, step=step, compute_s_per_block=BASE_S * self.rates.get(d, 1.0) if d in working else 0.0
                )
                for d in self.devices
                if d in job["ranks"]
            ]
            telemetry = agent_pb2.Telemetry(
                time=time.time(), job_id=job_id, active_plan_version=version, devices=samples
            )
            if rank0 in self.devices:
                slowest = max((s.compute_s_per_block for s in samples if s.compute_s_per_block), default=BASE_S)
                progress = state_pb2.Progress(step=step, loss=1.0 / (step + 1), lr=1e-3, samples_per_s=1.0 / slowest)
                telemetry.progress.CopyFrom(progress)
                telemetry.steps.append(progress)
            self._outbox.put_nowait(agent_pb2.AgentMessage(telemetry=telemetry))
            job["step"] = step
        job["state"] = "completed"
        status = agent_pb2.JobStatus(
            job_id=job_id, state=job_state("completed"), step=job["steps"] - 1, active_plan_version=max(job["plans"])
        )
        self._outbox.put_nowait(agent_pb2.AgentMessage(status=status))

    def stop(self) -> None:
        """Close the stream (the control plane sees the node go)."""

        async def close():
            self._call.cancel()
            self._task.cancel()
            await self._channel.close()

        self._thread.run(close())
        self._thread.close()


@pytest.fixture
def drover_control_plane(tmp_path):
    """A control plane served in process on a free loopback port (see drover.control_plane.testing)."""
    server = ControlPlaneServer(tmp_path / "drover.db")
    yield server
    server.stop()


@pytest.fixture
def drover_agent(drover_control_plane):
    """drover_agent(node, devices=2, rates={device: rate}, nics=()) -> a connected SimulatedAgent."""
    agents: list[SimulatedAgent] = []

    def connect(node: str, devices: int = 2, rates: dict[str, float] | None = None, nics=()) -> SimulatedAgent:
        agents.append(SimulatedAgent(drover_control_plane.address, node, devices, rates, nics))
        return agents[-1]

    yield connect
    for agent in agents:
        agent.stop()
