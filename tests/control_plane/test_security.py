"""Identity and authorisation with the real server over TLS on loopback:
clients by bearer token and role, agents by node certificate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from drover.agent.daemon import _credentials as agent_credentials
from drover.client import Client, Target, Unauthenticated, job_spec
from drover.control_plane import api
from drover.control_plane.api import ROLE_OF
from drover.control_plane.identity import make_credentials
from drover.control_plane.server import start_server, stop_server
from drover.v1 import agent_pb2_grpc, jobs_pb2, jobs_pb2_grpc, state_pb2

from support import TINY_JOB, ScriptedAgent, eventually, run_cli


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_credentials(folder, ["node-0", "node-1"], ["localhost", "127.0.0.1"])
    return folder


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """Another cluster's CA, certificates and tokens: none of it is trusted by ours."""
    folder = tmp_path_factory.mktemp("other")
    make_credentials(folder, ["node-0"], ["localhost", "127.0.0.1"])
    return folder


@pytest_asyncio.fixture
async def served(tmp_path, certs):
    served = await start_server(str(tmp_path / "drover.db"), "127.0.0.1:0", agent_address="127.0.0.1:0", tls_dir=certs)
    yield served
    await stop_server(served)


def client(served, certs: Path, token: str | None = None) -> jobs_pb2_grpc.JobServiceStub:
    tls = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    if token is not None:
        tls = grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(token))
    return jobs_pb2_grpc.JobServiceStub(grpc.aio.secure_channel(f"127.0.0.1:{served.port}", tls))


def token_of(certs: Path, name: str) -> str:
    return (certs / f"{name}.token").read_text().strip()


def agent_stub(served, folder: Path, node: str) -> agent_pb2_grpc.AgentServiceStub:
    channel = grpc.aio.secure_channel(f"127.0.0.1:{served.agent_port}", agent_credentials(folder, node))
    return agent_pb2_grpc.AgentServiceStub(channel)


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


def test_every_rpc_of_the_job_service_has_a_role():
    assert set(ROLE_OF) == set(jobs_pb2.DESCRIPTOR.services_by_name["JobService"].methods_by_name)


async def test_clients_without_a_valid_token_are_unauthenticated(served, certs, other_ca):
    for stub in (
        client(served, certs),
        client(served, certs, "not-a-token"),
        client(served, certs, token_of(other_ca, "admin")),
    ):
        assert await code_of(stub.ListJobs(jobs_pb2.ListJobsRequest())) == grpc.StatusCode.UNAUTHENTICATED


async def test_roles_decide_what_a_client_may_do(served, certs):
    reader, operator = (
        client(served, certs, token_of(certs, "reader")),
        client(served, certs, token_of(certs, "operator")),
    )
    admin = client(served, certs, token_of(certs, "admin"))
    assert (await reader.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []
    assert (
        await code_of(reader.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(TINY_JOB))))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    assert await code_of(reader.DrainNode(jobs_pb2.NodeRequest(node="node-0"))) == grpc.StatusCode.PERMISSION_DENIED
    paused = jobs_pb2.SetDetectionRequest(paused=True)
    assert await code_of(operator.SetDetection(paused)) == grpc.StatusCode.PERMISSION_DENIED
    assert (await admin.SetDetection(paused)).paused
    # Emulation is off unless the server is started with it, even for an admin.
    straggle = jobs_pb2.StraggleRequest(device="node-0/0", rate=2.0)
    assert await code_of(admin.Straggle(straggle)) == grpc.StatusCode.PERMISSION_DENIED


async def test_refused_callers_are_logged_once_a_minute_per_peer_and_method(served, certs, caplog, monkeypatch):
    monkeypatch.setattr(api, "_logged_at", {})
    reader = client(served, certs, token_of(certs, "reader"))
    for _ in range(3):
        submit = reader.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(TINY_JOB)))
        assert await code_of(submit) == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(client(served, certs, "not-a-token").ListJobs(jobs_pb2.ListJobsRequest()))
    impostor = ScriptedAgent(agent_stub(served, certs, "node-0"), "node-1")
    with pytest.raises(grpc.aio.AioRpcError):
        await impostor.receive()
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
    assert len(refused) == 3, refused
    submit, listing, hello = refused
    assert submit.startswith("refused SubmitJob from 127.0.0.1:") and "role reader" in submit
    assert listing.startswith("refused ListJobs from 127.0.0.1:") and "bearer token" in listing
    assert hello.startswith("refused Connect from 127.0.0.1:") and "node-0" in hello
    assert "not-a-token" not in "".join(refused)


async def test_a_plain_connection_is_refused(served):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{served.port}")
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    assert await code_of(stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5)) == grpc.StatusCode.UNAVAILABLE


async def test_an_agent_speaks_only_for_its_own_node(served, certs):
    jobs = client(served, certs, token_of(certs, "operator"))
    impostor = ScriptedAgent(agent_stub(served, certs, "node-0"), "node-1")  # node-0's certificate
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await impostor.receive()
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node-0" in info.value.details()
    assert (await jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes == []  # nothing of it was kept


async def test_an_agent_reports_only_for_its_devices_and_its_jobs(served, certs):
    jobs = client(served, certs, token_of(certs, "operator"))
    node0 = ScriptedAgent(agent_stub(served, certs, "node-0"), "node-0")

    async def connected():
        return [n.name for n in (await jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes if n.connected]

    await eventually(connected, what="node-0 connected")
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(TINY_JOB)))  # placed on node-0 alone
    assert (await node0.receive()).start_job.job_id == job.id
    node1 = ScriptedAgent(agent_stub(served, certs, "node-1"), "node-1")
    await eventually(lambda: _has(connected(), "node-1"), what="node-1 connected")
    node1.report(job.id, 0, {"node-1/0": 0.01})  # a job with no workers on node-1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node1.receive()
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    node0.report(job.id, 0, {"node-1/0": 9.0})  # another node's device
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node0.receive()
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # Neither moved the job: still running, nothing of theirs kept.
    assert (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).state == state_pb2.JOB_STATE_RUNNING
    assert list((await jobs.QueryTelemetry(jobs_pb2.QueryTelemetryRequest(job_id=job.id))).points) == []


async def _has(names, name: str) -> bool:
    return name in await names


async def test_certificates_of_another_ca_are_refused_both_ways(served, certs, other_ca, tmp_path):
    # An agent with another cluster's certificate cannot connect.
    stranger = ScriptedAgent(agent_stub(served, other_ca, "node-0"), "node-0")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stranger.receive()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # And our agent believes no control plane whose certificate our CA did not sign.
    fake = await start_server(str(tmp_path / "fake.db"), "127.0.0.1:0", agent_address="127.0.0.1:0", tls_dir=other_ca)
    try:
        ours = ScriptedAgent(agent_stub(fake, certs, "node-0"), "node-0")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ours.receive()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert fake.cp.outboxes == {}  # the fake heard no hello
    finally:
        await stop_server(fake)


async def test_a_client_that_does_not_trust_the_servers_certificate_is_unauthenticated(served, certs, other_ca):
    """No call is made: the TLS handshake fails, which gRPC reports as UNAVAILABLE like a server
    that is down; drover.client names it what it is, so a retry loop does not spin on it."""
    target = Target(f"127.0.0.1:{served.port}", (other_ca / "ca.pem").read_bytes(), token_of(certs, "admin"))
    with Client(target) as drover, pytest.raises(Unauthenticated) as info:
        await asyncio.to_thread(drover.list)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "TLS handshake failed" in info.value.details()


async def test_a_client_without_tls_is_told_the_server_serves_tls(served):
    # It read "no control plane answered at that address", with the server up.
    with Client(Target(f"127.0.0.1:{served.port}")) as drover, pytest.raises(Unauthenticated) as info:
        await asyncio.to_thread(drover.list)
    assert "closed a connection without TLS" in info.value.details() and "--ca" in info.value.details()


async def test_the_cli_refuses_a_ca_file_without_a_certificate_and_an_empty_token(served, certs, tmp_path):
    (tmp_path / "empty.token").write_text("\n")
    address = f"127.0.0.1:{served.port}"
    common = ["job", "list", "--control-plane", address]
    not_a_ca = await asyncio.to_thread(
        run_cli, *common, "--ca", str(certs / "admin.token"), "--token-file", str(certs / "admin.token")
    )
    assert not_a_ca.returncode == 2 and "--ca" in not_a_ca.stderr and "holds no PEM certificate" in not_a_ca.stderr
    empty = await asyncio.to_thread(
        run_cli, *common, "--ca", str(certs / "ca.pem"), "--token-file", str(tmp_path / "empty.token")
    )
    assert empty.returncode == 2 and "--token-file" in empty.stderr and "is empty" in empty.stderr
    for out in (not_a_ca, empty):
        assert len(out.stderr.splitlines()) == 1, out.stderr  # no gRPC C-core lines either


async def test_each_port_serves_only_its_own_services(served, certs):
    # A node's certificate and an admin token reached the job service on the agent port, and the
    # client port's health and reflection named the agent service.
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    admin = grpc.access_token_call_credentials(token_of(certs, "admin"))
    node = grpc.composite_channel_credentials(agent_credentials(certs, "node-0"), admin)
    on_agent_port = jobs_pb2_grpc.JobServiceStub(grpc.aio.secure_channel(f"127.0.0.1:{served.agent_port}", node))
    with pytest.raises(grpc.aio.AioRpcError) as info:  # and told where to go (it read "Method not found!")
        await on_agent_port.ListNodes(jobs_pb2.ListNodesRequest())
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "--listen port" in info.value.details()
    on_client_port = agent_pb2_grpc.AgentServiceStub(
        grpc.aio.secure_channel(f"127.0.0.1:{served.port}", agent_credentials(certs, "node-0"))
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ScriptedAgent(on_client_port, "node-0").receive()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "--agent-listen port" in info.value.details()
    tls = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    health = health_pb2_grpc.HealthStub(grpc.aio.secure_channel(f"127.0.0.1:{served.port}", tls))
    agents = health_pb2.HealthCheckRequest(service="drover.v1.AgentService")
    assert await code_of(health.Check(agents)) == grpc.StatusCode.NOT_FOUND
    jobs = health_pb2.HealthCheckRequest(service="drover.v1.JobService")
    assert (await health.Check(jobs)).status == health_pb2.HealthCheckResponse.SERVING
    assert await code_of(client(served, certs).ListJobs(jobs_pb2.ListJobsRequest())) == grpc.StatusCode.UNAUTHENTICATED


async def test_a_node_certificate_cannot_pose_as_the_control_plane(tmp_path, certs):
    """A node named like a host still gets no name a client would accept for the server."""
    from drover.control_plane.identity import add_node

    add_node(certs, "localhost")
    posing = tmp_path / "posing"
    posing.mkdir()
    for name, source in (
        ("ca.pem", "ca.pem"),
        ("server.pem", "node-localhost.pem"),
        ("server.key", "node-localhost.key"),
        ("tokens.json", "tokens.json"),
    ):
        (posing / name).write_bytes((certs / source).read_bytes())
    fake = await start_server(str(tmp_path / "fake.db"), "localhost:0", agent_address="localhost:0", tls_dir=posing)
    try:
        stub = jobs_pb2_grpc.JobServiceStub(
            grpc.aio.secure_channel(
                f"localhost:{fake.port}", grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
            )
        )
        assert await code_of(stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5)) == grpc.StatusCode.UNAVAILABLE

    finally:
        await stop_server(fake)


async def test_a_server_certificate_for_another_name_is_unauthenticated(tmp_path):
    # The server's certificate names 127.0.0.1 and the client dials localhost: gRPC's "Hostname
    # Verification Check failed" came out as UNAVAILABLE, "no control plane answered".
    folder = tmp_path / "certs"
    make_credentials(folder, ["node-0"], ["127.0.0.1"])
    served = await start_server(str(tmp_path / "d.db"), "127.0.0.1:0", agent_address="127.0.0.1:0", tls_dir=folder)
    try:
        target = Target(f"localhost:{served.port}", (folder / "ca.pem").read_bytes(), token_of(folder, "admin"))
        with Client(target) as drover, pytest.raises(Unauthenticated) as info:
            await asyncio.to_thread(drover.list)
        assert "names the address dialled" in info.value.details()
    finally:
        await stop_server(served)
