"""Helpers the tests share: a scripted agent stream, an in-process control
plane, and `eventually` for conditions that become true asynchronously."""

from __future__ import annotations

import ast
import asyncio
import gc
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from drover.client import job_spec
from drover.control_plane.controller import ControlPlane
from drover.control_plane.jobfile import read_job_file
from drover.control_plane.server import start_server, stop_server
from drover.planner.cluster import cluster_from_dict
from drover.planner.model import model_from_dict
from drover.planner.plan import plan_from_dict
from drover.v1 import agent_pb2, agent_pb2_grpc, events_pb2, jobs_pb2, jobs_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
# The job file as the CLI reads it (the model inline), as text for tests to edit; job_spec makes it a JobSpec.
TINY_JOB = yaml.safe_dump(read_job_file(ROOT / "examples" / "jobs" / "tiny.yaml"), sort_keys=False)


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


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse with the cyclic collector held off: a collection inside it can finalize an earlier
    test's leftover asyncio task, whose logged error formats a traceback with ast.parse, and CPython
    3.11 then fails the outer parse ("AST constructor recursion depth mismatch", seen in CI)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if enabled:
            gc.enable()


def cpu_device(device_id: str, tflops: float = 0.05) -> agent_pb2.Device:
    return agent_pb2.Device(id=device_id, kind="cpu", name="cpu", memory_gib=8, tflops=tflops)


class ScriptedAgent:
    """An agent stream driven by the test: what it sends, and what comes back."""

    def __init__(
        self,
        stub: agent_pb2_grpc.AgentServiceStub,
        node: str,
        devices: int = 2,
        jobs=(),
        nics=(),
        probe_port=0,
        tflops: float = 0.05,
    ):
        """`jobs`: the JobStatus of jobs the agent says it runs (after a reconnect); `nics` and
        `probe_port`: what it says it has for link probes."""
        self.node = node
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.outbox.put_nowait(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node=node,
                    agent_version="test",
                    devices=[cpu_device(f"{node}/{i}", tflops) for i in range(devices)],
                    jobs=list(jobs),
                    nics=list(nics),
                    probe_port=probe_port,
                )
            )
        )

        async def requests():
            while True:
                yield await self.outbox.get()

        self.call = stub.Connect(requests())

    def send(self, **body) -> None:
        self.outbox.put_nowait(agent_pb2.AgentMessage(**body))

    def report(self, job_id: str, step: int, compute: dict[str, float], version: int = 1) -> None:
        """Telemetry for one step: compute seconds per block of each named device."""
        self.send(
            telemetry=agent_pb2.Telemetry(
                time=time.time(),
                job_id=job_id,
                active_plan_version=version,
                devices=[
                    agent_pb2.DeviceSample(device=d, step=step, compute_s_per_block=c) for d, c in compute.items()
                ],
            )
        )

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
    port: int
    metrics_port: int = 0  # /metrics's, with metrics_address="127.0.0.1:0"

    def agent(self, node: str, devices: int = 2, jobs=(), nics=(), probe_port=0, tflops=0.05) -> ScriptedAgent:
        return ScriptedAgent(self.agents, node, devices, jobs, nics, probe_port, tflops)

    async def connected(self, count: int) -> None:
        async def enough():
            nodes = await self.jobs.ListNodes(jobs_pb2.ListNodesRequest())
            return sum(n.connected for n in nodes.nodes) >= count

        await eventually(enough, what=f"{count} agents connected")

    async def submit(self, job_yaml: str = TINY_JOB) -> jobs_pb2.Job:
        return await self.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(job_yaml)))  # out: jobs/JOB_ID

    async def events(self, job_id: str) -> list[jobs_pb2.Event]:
        """The job's events so far, each checked to come typed: its kind's enum and payload."""
        events = [e async for e in _until_quiet(self.jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id)))]
        for e in events:
            assert events_pb2.EventKind.Name(e.type) == f"EVENT_KIND_{e.kind.upper()}", e
            assert e.WhichOneof("payload") == e.kind, e
        return events


async def _until_quiet(stream, quiet_s: float = 0.3):
    """The events stored so far: a running job's watch never ends by itself."""
    iterator = stream.__aiter__()
    while True:
        try:
            yield await asyncio.wait_for(iterator.__anext__(), quiet_s)
        except (TimeoutError, StopAsyncIteration):
            stream.cancel()
            return


async def serve_plane(tmp: Path, **options):
    """Start a Plane; returns (plane, stop coroutine function)."""
    served = await start_server(str(tmp / "drover.db"), "127.0.0.1:0", emulation=True, **options)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{served.port}")
    jobs, agents = jobs_pb2_grpc.JobServiceStub(channel), agent_pb2_grpc.AgentServiceStub(channel)
    plane = Plane(served.cp, jobs, agents, channel, tmp, served.port, served.metrics_port)

    async def stop():
        await channel.close()
        await stop_server(served)

    return plane, stop


# -- runs compared with the single-process reference ---------------------------------


def trace(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]


def losses(out: Path) -> list[float]:
    return [t["loss"] for t in trace(out)]


def assert_matches_reference(out: Path, reference: Path) -> None:
    """Every tensor within 1e-4 relative (in norm: Adam divides by tiny second moments, so
    single elements near zero amplify reassociation), losses within 1e-5."""
    want, got = torch.load(reference / "model.pt"), torch.load(out / "model.pt")
    assert want.keys() == got.keys()
    for key in want:
        assert got[key].shape == want[key].shape, key
        rel = ((got[key] - want[key]).norm() / want[key].norm()).item()
        assert rel < 1e-4, (key, rel)
    assert losses(out) == pytest.approx(losses(reference), rel=1e-5)


# -- plans over local/0..3 for the tiny model (4 blocks, 8 micro-batches) -----------------


def local_plan(*pipelines, removed=()):
    """local_plan((micro_batches, [([device indices], (start, end)), ...]), ...) for local devices."""
    return plan_from_dict(
        {
            "strategy": "test",
            "global_batch": 16,
            "micro_batch": 2,
            "removed": [f"local/{d}" for d in removed],
            "pipelines": [
                {
                    "micro_batches": m,
                    "stages": [
                        {"devices": [f"local/{d}" for d in devices], "layers": list(span)} for devices, span in stages
                    ],
                }
                for m, stages in pipelines
            ],
        }
    )


DP2_PP2 = local_plan((4, [([0], (0, 2)), ([1], (2, 4))]), (4, [([2], (0, 2)), ([3], (2, 4))]))
UNEVEN = local_plan((5, [([0], (0, 1)), ([1], (1, 4))]), (3, [([2], (0, 3)), ([3], (3, 4))]))
TP2 = local_plan((8, [([0, 1], (0, 2)), ([2, 3], (2, 4))]))
MIXED_TP = local_plan((5, [([0, 1], (0, 3)), ([2], (3, 4))]), (3, [([3], (0, 4))]))
# local/2 removed, then local/3 removed while local/2 returns, then three pipelines.
SHRINK = local_plan((8, [([0, 1], (0, 3)), ([3], (3, 4))]), removed=[2])
REJOIN = local_plan((3, [([2], (0, 4))]), (5, [([1], (0, 1)), ([0], (1, 4))]), removed=[3])
# TP 2 -> 4 -> 1 on 7 workers: activations cross in min(t, t') pieces and are gathered; the
# groups list their devices out of rank order (as a grown job's may).
TP2_TP4_TP1 = local_plan((8, [([1, 0], (0, 1)), ([4, 2, 5, 3], (1, 3)), ([6], (3, 4))]))
THREE = local_plan((2, [([0], (0, 4))]), (3, [([1], (0, 4))]), (3, [([2, 3], (0, 4))]))


# -- clusters and models with named variants ------------------------------------------

A100 = {"name": "A100-80G", "tflops": 312, "memory_gib": 80}
NICS = {
    "infiniband": [{"type": "infiniband", "gbps": 200, "count": 8}],
    "roce": [{"type": "roce", "gbps": 200, "count": 8}],
    "ethernet": [],
}

# name -> (node count, per-node NIC kinds cycled, rates)
CLUSTER_VARIANTS = {
    "healthy": (4, ["infiniband"], {}),
    "one-straggler": (4, ["infiniband"], {"n1/3": 3.0}),
    "hopeless-straggler": (4, ["infiniband"], {"n2/0": 12.0}),
    "failed": (4, ["infiniband"], {"n0/5": "inf"}),
    "eight-failed": (8, ["infiniband"], {"n0/5": "inf"}),
    "slow-node": (4, ["infiniband"], {f"n3/{j}": 2.0 for j in range(8)}),
    "ib-roce": (4, ["infiniband", "roce"], {}),
    "ib-ethernet": (4, ["infiniband", "ethernet"], {}),
    "one-ethernet": (8, ["infiniband"] * 7 + ["ethernet"], {}),  # n7 syncs over TCP only
}

MODEL_VARIANTS = {
    "gpt-7b": dict(
        layers=32, hidden=4096, ffn_hidden=16384, heads=32, seq_len=4096, vocab=32000, global_batch=256, micro_batch=1
    ),
    "gpt-1b": dict(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=32000, global_batch=128, micro_batch=2),
    # two key/value heads: rule 6 allows TP of 1 or 2 only
    "llama-gqa": dict(
        family="llama",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=2,
        seq_len=4096,
        vocab=128256,
        global_batch=256,
        micro_batch=1,
    ),
}


def make_cluster(variant: str = "healthy", **rates):
    nodes, kinds, variant_rates = CLUSTER_VARIANTS[variant]
    data = {
        "name": variant,
        "defaults": {"gpus": 8, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": NICS["infiniband"]},
        "nodes": [{"name": f"n{i}", "nics": NICS[kinds[i % len(kinds)]]} for i in range(nodes)],
        "rates": {**variant_rates, **{k.replace("_", "/"): v for k, v in rates.items()}},
    }
    return cluster_from_dict(data, variant)


def make_model(variant: str = "gpt-7b", **overrides):
    return model_from_dict({"name": variant, **MODEL_VARIANTS[variant], **overrides}, variant)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    drover = shutil.which("drover", path=str(ROOT / ".venv" / "bin")) or shutil.which("drover")
    cmd = [drover] if drover else [sys.executable, "-m", "drover.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, cwd=ROOT, timeout=60)


def run_bench(script: str, *args: str) -> dict:
    """A bench/ script's JSON report, run as a user runs it (from the checkout, exit status 0)."""
    run = subprocess.run(
        [sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# -- a page as a headless browser draws it ------------------------------------------


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))


def rendered(chromium: str, page: Path) -> tuple[list[tuple[str, dict]], list[str]]:
    """(every element of the page's DOM after its scripts ran, as (tag, attributes); the console
    messages it logged) in headless Chromium."""
    run = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
        + ["--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    parser = _Elements()
    parser.feed(run.stdout)
    return parser.elements, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
