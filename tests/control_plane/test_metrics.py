"""The control plane's /metrics in process: scripted agents report a straggler
through real gRPC, and a scrape over HTTP shows what the control plane knows."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_rollout import start_two_node_job, step_of

from drover.control_plane.server import start_server, stop_server
from drover.metrics import MetricsError
from drover.v1 import agent_pb2, jobs_pb2, state_pb2

from support import ROOT, eventually


def scrape(port: int) -> dict[tuple, float]:
    """(sample name, sorted label items) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_straggler_and_its_plan_are_in_the_metrics(plane_factory):
    plane = await plane_factory(metrics_address="127.0.0.1:0")
    job, a, b = await start_two_node_job(plane)
    for step in range(8):  # node-1/0 3x slow from step 4: plan 2 is pushed, not yet committed
        step_of(a, job.id, step, slow=step >= 4)
        step_of(b, job.id, step, slow=step >= 4)
        await asyncio.sleep(0.02)
    assert (await b.receive()).plan.version == 2
    progress = state_pb2.Progress(step=7, loss=4.5, lr=0.003, tokens_per_s=640.0, samples_per_s=20.0)
    a.send(telemetry=agent_pb2.Telemetry(time=time.time(), job_id=job.id, active_plan_version=1, progress=progress))
    await eventually(lambda: plane.cp.jobs[job.id].progress, what="the progress taken in")
    got = await asyncio.to_thread(scrape, plane.metrics_port)

    def device(name, d):
        return got[(name, (("device", d), ("job_id", job.id), ("node", d.split("/")[0])))]

    assert device("drover_device_straggling_rate", "node-1/0") == 3.0
    assert device("drover_device_straggling_rate", "node-0/0") == 1.0
    assert device("drover_device_compute_seconds_per_block", "node-1/0") == pytest.approx(0.03)
    assert got[("drover_job_plan_version", (("job_id", job.id),))] == 2
    assert got[("drover_job_committed_plan_version", (("job_id", job.id),))] == 1
    assert got[("drover_job_pending_rollouts", (("job_id", job.id),))] == 1
    assert got[("drover_job_step", (("job_id", job.id),))] == 7
    assert got[("drover_job_loss", (("job_id", job.id),))] == 4.5
    assert got[("drover_job_samples_per_second", (("job_id", job.id),))] == 20.0
    assert got[("drover_job_step_seconds", (("job_id", job.id),))] == 16 / 20.0  # the tiny job's global batch
    assert got[("drover_agents_connected", ())] == 2
    assert got[("drover_jobs_running", ())] == 1
    assert got[("drover_telemetry_lag_seconds_count", ())] >= 16
    assert got[("drover_detection_paused", ())] == 0  # an operator sees whether a pause is on
    await plane.jobs.SetDetection(jobs_pb2.SetDetectionRequest(paused=True))
    assert (await asyncio.to_thread(scrape, plane.metrics_port))[("drover_detection_paused", ())] == 1

    # Every server metric the shipped Grafana dashboard queries is one the server exports.
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "drover-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"drover_[a-z0-9_]+", target["expr"])
        if not name.startswith(("drover_agent_", "drover_nic_", "drover_link_"))
    }
    assert queried and queried <= {name for name, _ in got}

    # A node that goes away is no longer counted.
    a.call.cancel()
    await eventually(
        lambda: asyncio.to_thread(lambda: scrape(plane.metrics_port)[("drover_agents_connected", ())] == 1)
    )


async def test_a_metrics_address_in_use_is_refused_naming_it_and_the_database_is_let_go(plane_factory, tmp_path):
    plane = await plane_factory(metrics_address="127.0.0.1:0")
    taken = f"127.0.0.1:{plane.metrics_port}"
    with pytest.raises(MetricsError, match=f"--metrics = '{taken}': cannot listen there"):
        await start_server(str(tmp_path / "other.db"), "127.0.0.1:0", metrics_address=taken)
    with pytest.raises(MetricsError, match="--metrics = 'nowhere': expected HOST:PORT"):
        await start_server(str(tmp_path / "other.db"), "127.0.0.1:0", metrics_address="nowhere")
    served = await start_server(str(tmp_path / "other.db"), "127.0.0.1:0")  # not held by the failed start
    await stop_server(served)


def test_a_client_that_never_speaks_holds_up_no_scrape_and_stop_lets_go_of_the_port(tmp_path):
    from prometheus_client import CollectorRegistry, Gauge

    from drover.control_plane.identity import make_credentials
    from drover.metrics import serve, stop

    make_credentials(tmp_path, [], ["127.0.0.1"])
    registry = CollectorRegistry()
    Gauge("drover_test_value", "A value.", registry=registry).set(7)
    server, port = serve("127.0.0.1:0", registry, (tmp_path / "server.pem", tmp_path / "server.key"))
    silent = socket.create_connection(("127.0.0.1", port))  # connects, never starts TLS
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=5) as response:
            assert "drover_test_value 7.0" in response.read().decode()
    finally:
        silent.close()
        stop(server)
    with socket.socket() as again:  # no one listens there any more (its connections may linger)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_one_client_holding_many_idle_connections_leaves_room_for_the_scraper():
    from prometheus_client import CollectorRegistry, Gauge

    from drover.metrics import MAX_CONNECTIONS, serve, stop

    registry = CollectorRegistry()
    Gauge("drover_test_value", "A value.", registry=registry).set(7)
    server, port = serve("127.0.0.1:0", registry)
    stalled = []
    try:
        for _ in range(MAX_CONNECTIONS):  # from another address: connects, never sends a request
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", port))
            stalled.append(s)
        time.sleep(0.5)  # all accepted (or shut) by now
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert "drover_test_value 7.0" in response.read().decode()
    finally:
        for s in stalled:
            s.close()
        stop(server)
