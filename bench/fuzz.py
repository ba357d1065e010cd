"""The long fuzz campaign: hostile messages for every RPC (tests/fuzzing.py's
strategies) against a real `drover server` process on loopback, after one
job has run to completion. Reports the messages sent, the status codes
returned, crashes (the server exits), hangs (a call past its deadline, or a
health check slower than 1 s) and the server's RSS before and after; checks
that the completed job's history is byte for byte unchanged. Prints JSON.

    python bench/fuzz.py [--messages 100000] [--concurrency 32]

Targets: 100,000 messages, 0 crashes, 0 hangs, RSS growth under 50 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the strategies the tests use

from drover.cli.local_cluster import DROVER  # noqa: E402
from drover.planner.ports import free_port  # noqa: E402
from drover.v1 import agent_pb2, agent_pb2_grpc, jobs_pb2_grpc  # noqa: E402

from fuzzing import EXPECTED, agent_messages, answer, completed_job, history, job_service_calls  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def draw(strategy, count: int) -> list:
    """`count` examples of a strategy, as Hypothesis generates them for a test."""
    out = []

    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return out


async def agent_answer(channel, i: int, message: bytes) -> str:
    call = channel.stream_stream("/drover.v1.AgentService/Connect")(timeout=5)
    try:
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=f"fuzz{i % 500}")).SerializeToString())
        await call.write(message)
        await call.done_writing()
    except grpc.aio.AioRpcError:
        pass  # the server ended the stream before all was written: its status, below, says why
    code = (await call.code()).name
    if code == "INTERNAL" and "from Core" in (await call.details()):
        # gRPC's own client status for a write on a stream the server had already closed: counted
        # apart, so a server fault (INTERNAL with the control plane's message) stays visible.
        return "INTERNAL_CLIENT_SIDE"
    return "OK" if code == "DEADLINE_EXCEEDED" else code


async def campaign(address: str, server: subprocess.Popen, messages: int, concurrency: int) -> dict:
    channel = grpc.aio.insecure_channel(address)
    jobs, agents = jobs_pb2_grpc.JobServiceStub(channel), agent_pb2_grpc.AgentServiceStub(channel)
    job_id = await completed_job(jobs, agents)
    before = await history(jobs, job_id)
    known = [job_id, "node-0", "node-0/0", "fuzz0", "fuzz0/0"]
    started = time.monotonic()
    calls = draw(job_service_calls(known), messages // 2)
    stream_messages = draw(agent_messages(known), messages - len(calls))
    generated_s = time.monotonic() - started
    rss_before = rss_mb(server.pid)
    codes: Counter = Counter()
    slowest_health_s = 0.0
    queue: asyncio.Queue = asyncio.Queue()
    for call in calls:
        queue.put_nowait(("job", call))
    for i, message in enumerate(stream_messages):
        queue.put_nowait(("agent", (i, message)))

    async def worker():
        while not queue.empty():
            kind, item = queue.get_nowait()
            code = await answer(channel, item) if kind == "job" else await agent_answer(channel, *item)
            codes[code] += 1

    async def watch_health():
        nonlocal slowest_health_s
        health = health_pb2_grpc.HealthStub(channel)
        while not queue.empty():
            t = time.monotonic()
            try:
                await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.aio.AioRpcError:
                codes["HEALTH_FAILED"] += 1
            slowest_health_s = max(slowest_health_s, time.monotonic() - t)
            await asyncio.sleep(0.5)

    sent_at = time.monotonic()
    await asyncio.gather(watch_health(), *(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - sent_at
    unchanged = await history(jobs, job_id) == before
    rss_after = rss_mb(server.pid)
    await channel.close()
    unexpected = {c: n for c, n in codes.items() if c not in EXPECTED}
    return {
        "messages": sum(codes.values()),
        "generated_s": generated_s,
        "sent_s": elapsed,
        "messages_per_s": sum(codes.values()) / elapsed,
        "codes": dict(codes.most_common()),
        "unexpected_codes": unexpected,
        "hangs": unexpected.get("DEADLINE_EXCEEDED", 0),
        "crashes": int(server.poll() is not None),
        "slowest_health_check_s": slowest_health_s,
        "completed_job_history_unchanged": unchanged,
        "rss_mb": {"before": rss_before, "after": rss_after, "growth": rss_after - rss_before},
        "targets": {"messages": 100_000, "crashes": 0, "hangs": 0, "rss_growth_mb_below": 50},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        address, agent_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        log = open(Path(tmp) / "server.log", "w")
        server = subprocess.Popen(
            DROVER
            + [
                "server",
                "--insecure",
                "--emulation",
                "--db",
                str(Path(tmp) / "drover.db"),
                "--listen",
                address,
                "--agent-listen",
                agent_address,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(2)  # the server imports and binds
            # Insecure, every service answers on both ports: one channel reaches them all.
            result = asyncio.run(campaign(address, server, args.messages, args.concurrency))
        finally:
            server.terminate()
            server.wait(timeout=15)
            log.close()
        lines = (Path(tmp) / "server.log").read_text().splitlines()
        result["server_errors"] = [line[:300] for line in lines if " failed" in line or "Error" in line][:20]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
