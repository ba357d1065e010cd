"""Control-plane ingest: many emulated agents streaming telemetry to one
`drover server` process (real gRPC on loopback), once on a SQLite file and
once on PostgreSQL (a local server from Debian's binaries), side by side.

Each emulated agent opens the agent stream, says hello with 8 devices and
sends one telemetry message a second (8 device samples) at a random phase.
Reports the sustained rate, whether any sample was lost, the lag from send
to stored (read back from the database every 100 ms), and the server's CPU
and memory. Prints JSON.

    python bench/ingest.py [--agents 1000] [--seconds 30] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from sqlalchemy import create_engine, text

from drover.planner.ports import free_port
from drover.storage.local_postgres import LocalPostgres
from drover.v1 import agent_pb2, agent_pb2_grpc, jobs_pb2, jobs_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]

DEVICES = 8
STREAMS_PER_CONNECTION = 50  # the server takes 64 streams a connection (control_plane/api.py, SERVER_LIMITS)
# A connection of its own per channel: by default gRPC shares one between channels to one address.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def agent(stub, index: int, seconds: float, sent: list[int], start_gate: asyncio.Event) -> None:
    node = f"emu-{index}"
    queue: asyncio.Queue = asyncio.Queue()
    queue.put_nowait(
        agent_pb2.AgentMessage(
            hello=agent_pb2.Hello(
                node=node,
                agent_version="bench",
                devices=[
                    agent_pb2.Device(id=f"{node}/{i}", kind="cpu", name="cpu", memory_gib=8, tflops=0.05)
                    for i in range(DEVICES)
                ],
            )
        )
    )

    async def requests():
        while True:
            message = await queue.get()
            if message is None:
                return
            yield message

    call = stub.Connect(requests())
    reader = asyncio.create_task(_drain(call))
    await start_gate.wait()
    await asyncio.sleep(random.random())  # agents are not in lock step
    end = time.time() + seconds
    step = 0
    while time.time() < end:
        queue.put_nowait(
            agent_pb2.AgentMessage(
                telemetry=agent_pb2.Telemetry(
                    time=time.time(),
                    job_id="",
                    devices=[
                        agent_pb2.DeviceSample(device=f"{node}/{i}", step=step, compute_s_per_block=0.01 + 0.001 * i)
                        for i in range(DEVICES)
                    ],
                )
            )
        )
        sent[0] += 1
        step += 1
        await asyncio.sleep(1.0)
    queue.put_nowait(None)
    reader.cancel()


async def _drain(call) -> None:
    async for _ in call:
        pass


async def connected(jobs) -> int:
    """Connected nodes, over every page of the listing."""
    count, token = 0, None
    while token != "":
        page = await jobs.ListNodes(jobs_pb2.ListNodesRequest(page_size=1000, page_token=token or ""))
        count += sum(n.connected for n in page.nodes)
        token = page.next_page_token
    return count


def poll_lags(url: str, stop: list[bool], lags: list[float]) -> None:
    """Read new telemetry rows every 100 ms; each one's lag is now minus its send time."""
    last, engine = 0, create_engine(url)
    query = text("SELECT id, time FROM telemetry WHERE id > :last ORDER BY id")
    with engine.connect() as connection:
        while not stop[0]:
            now = time.time()
            rows = connection.execute(query, {"last": last}).fetchall()
            connection.commit()  # a new snapshot next time (PostgreSQL)
            for row_id, sent_at in rows:
                lags.append(now - sent_at)
                last = row_id
            time.sleep(0.1)
    engine.dispose()


async def measure(args, url: str) -> dict:
    address = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drover.cli",
            "server",
            "--insecure",
            "--db",
            url,
            "--listen",
            address,
            "--agent-listen",
            f"127.0.0.1:{free_port()}",
        ],  # agents reach the stream on either port here
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        count = -(-args.agents // STREAMS_PER_CONNECTION)  # as separate agents' connections would carry them
        channels = [grpc.aio.insecure_channel(address, options=OWN_CONNECTION) for _ in range(count)]
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), 30)
        stubs = [agent_pb2_grpc.AgentServiceStub(ch) for ch in channels]
        sent, gate = [0], asyncio.Event()
        tasks = [asyncio.create_task(agent(stubs[i % count], i, args.seconds, sent, gate)) for i in range(args.agents)]
        jobs = jobs_pb2_grpc.JobServiceStub(channels[0])
        hello_start = time.time()
        while await connected(jobs) < args.agents:
            await asyncio.sleep(0.5)  # measure the steady state, not the hellos of the connection storm
        hellos_s = time.time() - hello_start
        stop, lags = [False], []
        poller = asyncio.get_running_loop().run_in_executor(None, poll_lags, url, stop, lags)
        cpu0, t0 = cpu_seconds(server.pid), time.time()
        gate.set()
        rss = []
        while not all(t.done() for t in tasks):
            rss.append(rss_mib(server.pid))
            await asyncio.sleep(1)
        elapsed = time.time() - t0
        cpu = cpu_seconds(server.pid) - cpu0
        await asyncio.sleep(2)  # the last flush
        stop[0] = True
        await poller
        engine = create_engine(url)
        with engine.connect() as connection:
            stored = connection.execute(text("SELECT count(*) FROM telemetry")).scalar()
        engine.dispose()
        for ch in channels:
            await ch.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    lags.sort()
    return {
        "store": url.split(":", 1)[0],
        "agents": args.agents,
        "devices_per_agent": DEVICES,
        "seconds": args.seconds,
        "seconds_until_every_agent_registered": hellos_s,
        "messages_sent": sent[0],
        "samples_sent": sent[0] * DEVICES,
        "samples_stored": stored,
        "lost": sent[0] * DEVICES - stored,
        "sustained_messages_per_s": sent[0] / elapsed,
        "sustained_samples_per_s": stored / elapsed,
        "lag_s": {
            "p50": statistics.median(lags) if lags else None,
            "p99": lags[int(0.99 * (len(lags) - 1))] if lags else None,
            "max": lags[-1] if lags else None,
        },
        "target_lag_p99_below_s": 1.0,
        "server_cpu_cores": cpu / elapsed,
        "server_rss_mib_max": max(rss, default=0.0),
        "note": "lag is read back from the database every 100 ms, so it is an upper bound by up to 0.1 s",
    }


async def main_async(args) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            if store == "sqlite":
                results[store] = await measure(args, f"sqlite:///{Path(tmp) / 'ingest.db'}")
            elif store == "postgresql":
                server = LocalPostgres(Path(tempfile.mkdtemp(prefix="drover-pg-")))
                try:
                    results[store] = await measure(args, server.database())
                finally:
                    server.stop()
            else:
                raise SystemExit(f"--stores: {store!r} is not sqlite or postgresql")
    p99 = {name: r["lag_s"]["p99"] for name, r in results.items()}
    return {
        "stores": results,
        "lag_p99_s": p99,
        "sustained_samples_per_s": {name: r["sustained_samples_per_s"] for name, r in results.items()},
        "target_lag_p99_below_s": 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--stores", default="sqlite,postgresql", help="Comma-separated: sqlite, postgresql.")
    print(json.dumps(asyncio.run(main_async(parser.parse_args())), indent=1))


if __name__ == "__main__":
    main()
