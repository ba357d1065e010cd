"""The control plane's gRPC edge, in process over a real port and a real
SQLite file, with a scripted agent stream: bad input gets the right status
code, the server keeps running, nothing stored is lost or half-written."""

from __future__ import annotations

import asyncio
import math
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from drover.client import job_spec
from drover.control_plane.api import _peer_host
from drover.planner.wire import host_port
from drover.storage.models import TelemetrySample
from drover.v1 import agent_pb2, jobs_pb2, jobspec_pb2, state_pb2

from support import TINY_JOB as JOB
from support import cpu_device, eventually, serve_plane


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def test_health_and_reflection(plane):
    channel = plane.channel
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="drover.v1.JobService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_submit_pushes_start_job_and_stores_plan_v1(plane):
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="out"))
    start = (await agent.receive()).start_job
    assert start.job_id == job.id and start.world_size == 2 and dict(start.ranks) == {"node-0/0": 0, "node-0/1": 1}
    plans = await jobs.ListPlans(jobs_pb2.ListPlansRequest(job_id=job.id))
    assert [p.version for p in plans.plans] == [1] and not plans.plans[0].committed
    # The agent reports version 1 active: the plan is committed (observed generation meets desired).
    agent.send(
        telemetry=agent_pb2.Telemetry(
            time=1.0,
            job_id=job.id,
            active_plan_version=1,
            devices=[agent_pb2.DeviceSample(device="node-0/0", step=0, compute_s_per_block=0.01)],
        )
    )
    for _ in range(100):
        if (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).committed_plan_version == 1:
            break
        await asyncio.sleep(0.05)
    assert (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).committed_plan_version == 1
    forced = await jobs.Replan(jobs_pb2.ReplanRequest(job_id=job.id, reason="test"))
    assert forced.version == 2 and (await agent.receive()).plan.version == 2


@pytest.mark.parametrize(
    "yaml_text, fragment",
    [
        (JOB.replace("steps: 30", "steps: 0"), "'steps' = 0"),
        # The server opens no path it is sent: not a model file, not /etc/shadow.
        ("model: ../models/tiny.yaml\nsteps: 3\n", "the server opens no paths"),
        ("model: /etc/shadow\nsteps: 3\n", "the server opens no paths"),
        ("steps: 3\n", "'model'"),
        # A 411-byte alias bomb: refused before it expands.
        (
            "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
            "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\nmodel: *d\nsteps: 3\n",
            "aliases are not allowed",
        ),
        ("name: " + "x" * 70_000 + "\n", "at most 65536"),
        ("model: {layers: 2}\nsteps: 3\n", "'hidden'"),
        ("model: [unclosed\n", "plain YAML"),
    ],
)
async def test_malformed_job_yaml_is_invalid_argument(plane, yaml_text, fragment):
    jobs = plane.jobs
    plane.agent("node-0")
    await plane.connected(1)
    code, details = await code_of(jobs.SubmitJob(jobs_pb2.SubmitJobRequest(job_yaml=yaml_text)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in details
    assert (await jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []


def spec_with(**changes) -> jobspec_pb2.JobSpec:
    spec = job_spec(JOB)
    for path, value in changes.items():
        *parents, name = path.split("__")
        target = spec
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, name, value)
    return spec


@pytest.mark.parametrize(
    "spec, fragment",
    [
        (spec_with(steps=0), "'steps'"),
        (spec_with(model__heads=3), "'heads' = 3"),
        (spec_with(model__family=7), "spec.model.family = 7"),
        (spec_with(optimizer__lr=0.0), "lr' = 0"),
        (spec_with(data="/etc"), "'data' = '/etc'"),
        (spec_with(checkpoint__dir="../up"), "'checkpoint.dir' = '../up'"),
        (spec_with(precision=9), "spec.precision = 9"),
        (spec_with(resources__nodes=0), "'resources.nodes' = 0"),
        (jobspec_pb2.JobSpec(steps=3), "'model'"),
    ],
)
async def test_a_bad_job_spec_is_invalid_argument_naming_the_field(plane, spec, fragment):
    plane.agent("node-0")
    await plane.connected(1)
    code, details = await code_of(plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in details, details
    assert (await plane.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []


async def test_a_job_spec_takes_the_job_files_whole_ranges(plane):
    plane.agent("node-0")
    await plane.connected(1)
    job = await plane.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec_with(seed=(1 << 63) - 1)))
    assert job.seed == (1 << 63) - 1 and job.spec.seed == (1 << 63) - 1


async def test_a_job_is_given_as_exactly_one_of_spec_and_yaml(plane):
    plane.agent("node-0")
    await plane.connected(1)
    for request in (jobs_pb2.SubmitJobRequest(), jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), job_yaml=JOB)):
        code, details = await code_of(plane.jobs.SubmitJob(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "exactly one of spec and job_yaml" in details


async def test_unknown_ids_are_not_found(plane):
    jobs = plane.jobs
    for call in (
        jobs.GetJob(jobs_pb2.GetJobRequest(job_id="nope")),
        jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id="nope")),
        jobs.ListPlans(jobs_pb2.ListPlansRequest(job_id="nope")),
        jobs.GetPlan(jobs_pb2.GetPlanRequest(job_id="nope")),
        jobs.QueryTelemetry(jobs_pb2.QueryTelemetryRequest(job_id="nope")),
        jobs.DrainNode(jobs_pb2.NodeRequest(node="nope")),
        jobs.Straggle(jobs_pb2.StraggleRequest(device="nope/0", rate=2.0)),
    ):
        code, details = await code_of(call)
        assert code == grpc.StatusCode.NOT_FOUND and "nope" in details


async def test_a_request_without_its_job_id_is_invalid_not_an_unknown_job(plane):
    jobs = plane.jobs
    for call in (
        jobs.GetJob(jobs_pb2.GetJobRequest()),
        jobs.CancelJob(jobs_pb2.CancelJobRequest()),
        jobs.ListEvents(jobs_pb2.ListEventsRequest()),
        jobs.QueryHistory(jobs_pb2.QueryHistoryRequest()),
    ):
        code, details = await code_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "job_id: '' is empty" in details, details


async def test_a_detection_pause_outlives_a_restart_of_the_control_plane(tmp_path):
    plane, stop = await serve_plane(tmp_path)
    assert not plane.cp.detection_paused
    assert (await plane.jobs.SetDetection(jobs_pb2.SetDetectionRequest(paused=True))).paused
    await stop()
    plane, stop = await serve_plane(tmp_path)  # the same database
    try:
        assert plane.cp.detection_paused
        await plane.jobs.SetDetection(jobs_pb2.SetDetectionRequest(paused=False))
    finally:
        await stop()
    plane, stop = await serve_plane(tmp_path)
    try:
        assert not plane.cp.detection_paused
    finally:
        await stop()


async def test_preconditions_and_bad_values(plane):
    jobs = plane.jobs
    code, details = await code_of(jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "agents" in details
    plane.agent("node-0")
    await plane.connected(1)
    code, details = await code_of(jobs.Straggle(jobs_pb2.StraggleRequest(device="node-0/0", rate=0.5)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "rate" in details
    # The wire's bound states only the bound broken: it said ">= 0", and the job's check ">= 1".
    spec = job_spec(JOB)
    spec.steps = (1 << 40) + 1
    code, details = await code_of(jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.endswith("= 1099511627777: at most 1099511627776")
    # The bound of cluster files and the detector (1e6): 1e11 was taken.
    code, details = await code_of(jobs.Straggle(jobs_pb2.StraggleRequest(device="node-0/0", rate=1e11)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "<= 1e+06" in details


@pytest.mark.parametrize(
    "sample, fragment",
    [
        (dict(compute_s_per_block=math.nan), "compute_s_per_block"),
        (dict(compute_s_per_block=-1.0), "compute_s_per_block"),
        (dict(compute_s_per_block=1e9), "compute_s_per_block"),
        (dict(compute_s_per_block=0.1, p2p_wait_s=math.inf), "p2p_wait_s"),
        (dict(compute_s_per_block=0.1, step=-4), "step"),
    ],
)
async def test_bad_telemetry_rejected_and_nothing_kept(plane, sample, fragment):
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    await agent.receive()
    agent.send(
        telemetry=agent_pb2.Telemetry(
            time=1.0,
            job_id=job.id,
            active_plan_version=1,
            devices=[agent_pb2.DeviceSample(device="node-0/0", **{"step": 1, **sample})],
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await agent.receive()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()
    points = await jobs.QueryTelemetry(jobs_pb2.QueryTelemetryRequest(job_id=job.id))
    assert list(points.points) == []
    assert (
        await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    ).state == state_pb2.JOB_STATE_RUNNING  # server carries on


@pytest.mark.parametrize(
    "hello, fragment",
    [
        (agent_pb2.Hello(node="rack/1", devices=[cpu_device("rack/1/0")]), "hello.node"),
        (agent_pb2.Hello(node="node-9", devices=[cpu_device("node-8/0")]), "hello.devices[0].id"),
        (agent_pb2.Hello(node="node-9", devices=[cpu_device("node-9/")]), "hello.devices[0].id"),
        (agent_pb2.Hello(node="node-9", devices=[cpu_device("node-9/a/../0")]), "hello.devices[0].id"),
        (agent_pb2.Hello(node="node-9", devices=[cpu_device("node-9/0"), cpu_device("node-9/0")]), "more than once"),
        (
            agent_pb2.Hello(
                node="node-9", devices=[cpu_device("node-9/0")], nics=[agent_pb2.Nic(name="ib0", type="infiniband")] * 2
            ),
            "hello.nics.name",
        ),
        (agent_pb2.Hello(node="node-9", nics=[agent_pb2.Nic(name="ib0", type="ib")]), "hello.nics[0].type"),
        (agent_pb2.Hello(node="node-9", nics=[agent_pb2.Nic(name="", type="roce")]), "hello.nics[0].name"),
        (agent_pb2.Hello(node="node-9", advertise_address="0.0.0.0"), "hello.advertise_address"),
        (
            agent_pb2.Hello(node="node-9", nics=[agent_pb2.Nic(name="e", type="ethernet", address="255.255.255.255")]),
            "hello.nics[0].address",
        ),
    ],
)
async def test_bad_hello_rejected_and_nothing_kept(plane, hello, fragment):
    jobs, agents = plane.jobs, plane.agents
    outbox: asyncio.Queue = asyncio.Queue()
    outbox.put_nowait(agent_pb2.AgentMessage(hello=hello))

    async def requests():
        while True:
            yield await outbox.get()

    call = agents.Connect(requests())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), 10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()
    plane.agent("node-0")  # the server carries on, and kept nothing of the bad hello
    await plane.connected(1)
    assert [n.name for n in (await jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes] == ["node-0"]


async def test_a_nodes_last_seen_follows_its_messages(plane):
    # It stayed at the hello's time while the node streamed telemetry for minutes.
    agent = plane.agent("node-0")
    await plane.connected(1)

    async def last_seen() -> float:
        return (await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())).nodes[0].last_seen

    at_hello = await last_seen()
    await asyncio.sleep(0.3)
    agent.send(telemetry=agent_pb2.Telemetry(time=time.time()))

    async def moved() -> float:
        seen = await last_seen()
        return seen if seen > at_hello + 0.25 else 0.0

    assert await eventually(moved, timeout_s=5, what="last_seen past the hello") <= time.time()


async def test_wrong_generation_rejected(plane):
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    await agent.receive()
    agent.send(telemetry=agent_pb2.Telemetry(time=1.0, job_id=job.id, active_plan_version=7))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await agent.receive()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "active_plan_version" in info.value.details()
    assert (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).committed_plan_version == 0


async def test_cancel_twice_is_failed_precondition(plane):
    jobs = plane.jobs
    plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    assert (await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))).state == state_pb2.JOB_STATE_CANCELLED
    code, _ = await code_of(jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_device_that_stops_reporting_is_stopped_and_the_job_goes_on_without_it(plane_factory):
    """Silent while the others report: hung, holding them up. Its agent is told to stop its
    worker, and the rest get a new world without it."""
    plane = await plane_factory(device_silence_s=1.0)
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    await agent.receive()
    for step in range(12):  # node-0/1 falls silent after step 2; node-0/0 goes on
        agent.report(job.id, step, {"node-0/0": 0.01, **({"node-0/1": 0.01} if step < 3 else {})})
        await asyncio.sleep(0.25)
    stop = (await agent.receive()).command.stop_workers
    assert stop.job_id == job.id and list(stop.devices) == ["node-0/1"]
    recover = (await agent.receive()).recover
    assert dict(recover.ranks) == {"node-0/0": 0}
    assert (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).state == state_pb2.JOB_STATE_RUNNING
    kinds = [e.kind for e in await plane.events(job.id)]
    assert "device_lost" in kinds and "recovery_started" in kinds


async def test_a_failed_flush_keeps_its_samples_and_the_flusher_goes_on(plane, monkeypatch):
    cp, jobs = plane.cp, plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    await agent.receive()
    write, failures = cp.store._insert_and_trim, []

    def fails_once(*args):
        if not failures:
            failures.append("disk full")
            raise OSError("disk full")
        return write(*args)

    monkeypatch.setattr(cp.store, "_insert_and_trim", fails_once)
    agent.send(
        telemetry=agent_pb2.Telemetry(
            time=time.time(),
            job_id=job.id,
            active_plan_version=1,
            devices=[agent_pb2.DeviceSample(device="node-0/0", step=1, compute_s_per_block=0.1)],
        )
    )
    for _ in range(100):  # the periodic flush, not a query's, must store it
        if failures and cp.store.count(TelemetrySample) == 1:
            break
        await asyncio.sleep(0.05)
    assert failures and cp.store.count(TelemetrySample) == 1


async def test_one_server_per_port_and_per_database(plane, tmp_path):
    """Split brain: a second server on the same port or the same database refuses to start."""
    from drover.control_plane.server import start_server
    from drover.storage.db import StoreInUse

    with pytest.raises(RuntimeError, match="(?i)bind|port"):
        await start_server(str(tmp_path / "other.db"), f"127.0.0.1:{plane.port}")
    with pytest.raises(StoreInUse, match="in use"):
        await start_server(str(plane.tmp / "drover.db"), "127.0.0.1:0")


async def test_listings_come_in_pages(plane):
    """Without pages, 20,000 jobs or 500 plan versions once made a listing fail for everyone."""
    for i in range(7):
        plane.agent(f"node-{i}", devices=1)
    await plane.connected(7)
    seen, token, pages = [], "", 0
    while True:
        page = await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest(page_size=3, page_token=token))
        seen += [n.name for n in page.nodes]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"node-{i}" for i in range(7)] and pages == 3
    # "6\u00b2" is a digit to str.isdigit but not to int(): the fuzzer's find.
    tokens = ["x; DROP TABLE", "6\u00b2"]
    bad_requests = [jobs_pb2.ListNodesRequest(page_size=5000)] + [
        jobs_pb2.ListNodesRequest(page_token=t) for t in tokens
    ]
    for bad in bad_requests:
        code, details = await code_of(plane.jobs.ListNodes(bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "page_" in details


async def test_training_progress_reaches_job_status_and_outlives_the_job(plane):
    """Loss, lr and tokens/s ride on telemetry; GetJob shows them while the job runs and after
    it ends (stored); a diverged loss (NaN) is reported as such; a step past the job is refused."""
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    await agent.receive()

    def progress(**figures):
        fields = {"step": 3, "loss": 2.5, "lr": 0.003, "tokens_per_s": 1500.0, "samples_per_s": 47.0} | figures
        agent.send(telemetry=agent_pb2.Telemetry(time=1.0, job_id=job.id, progress=state_pb2.Progress(**fields)))

    async def shown(step: int):
        job_now = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
        return job_now.progress if job_now.HasField("progress") and job_now.progress.step == step else None

    progress()
    got = await eventually(lambda: shown(3), what="progress")
    assert (got.step, got.loss, got.lr, got.tokens_per_s) == (3, 2.5, 0.003, 1500.0) and not got.HasField("val_loss")
    progress(step=4, loss=math.nan, val_loss=3.25, val_step=4)
    got = await eventually(lambda: shown(4), what="step 4")
    assert math.isnan(got.loss) and got.val_loss == 3.25 and got.val_step == 4
    await plane.cp.flush()
    await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    ended = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))  # from storage now
    assert ended.state == state_pb2.JOB_STATE_CANCELLED and ended.progress.step == 4
    assert ended.progress.val_loss == 3.25
    listed = await jobs.ListJobs(jobs_pb2.ListJobsRequest())
    assert listed.jobs[0].progress.step == 4


async def test_progress_past_the_job_is_invalid(plane):
    jobs = plane.jobs
    agent = plane.agent("node-0")
    await plane.connected(1)
    job = await jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec(JOB), out_dir="o"))
    await agent.receive()
    agent.send(telemetry=agent_pb2.Telemetry(time=1.0, job_id=job.id, progress=state_pb2.Progress(step=30, lr=1.0)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await agent.receive()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "progress.step = 30" in info.value.details()
    assert not (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).HasField("progress")


@pytest.mark.parametrize(
    "peer, host",
    [
        ("ipv4:10.0.0.5:41234", "10.0.0.5"),
        ("ipv6:[2001:db8::5]:41234", "2001:db8::5"),
        ("ipv6:%5B::1%5D:41234", "::1"),  # as grpc percent-encodes it
        ("ipv6:[::1]:5", "::1"),
        ("unix:/tmp/socket", "127.0.0.1"),
    ],
)
def test_an_agents_address_is_read_from_its_peer_string_ipv6_too(peer, host):
    assert _peer_host(peer) == host


def test_host_port_brackets_ipv6():
    assert host_port("10.0.0.5", 29500) == "10.0.0.5:29500"
    assert host_port("2001:db8::5", 29500) == "[2001:db8::5]:29500"


async def test_workers_rendezvous_at_the_address_rank_0s_agent_advertises(plane):
    hello = agent_pb2.Hello(
        node="node-0", agent_version="test", devices=[cpu_device("node-0/0")], advertise_address="10.1.2.3"
    )
    outbox: asyncio.Queue = asyncio.Queue()
    outbox.put_nowait(agent_pb2.AgentMessage(hello=hello))

    async def requests():
        while True:
            yield await outbox.get()

    call = plane.agents.Connect(requests())
    await plane.connected(1)
    await plane.submit()
    start = (await asyncio.wait_for(call.read(), 10)).start_job
    assert start.master_addr == "10.1.2.3" and start.master_port != 0
    call.cancel()


async def test_an_advertised_address_that_is_no_ip_address_is_refused(plane):
    bad = agent_pb2.Hello(node="node-0", agent_version="t", devices=[cpu_device("node-0/0")], advertise_address="a b")
    call = plane.agents.Connect(iter([agent_pb2.AgentMessage(hello=bad)]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.advertise_address = 'a b': one host's IP address" in caught.value.details()


async def test_a_server_whose_grpc_stop_is_cancelled_still_writes_and_closes_its_store(tmp_path):
    # On SIGTERM gRPC's stop raised CancelledError: the buffered telemetry was never written,
    # nor the database closed.
    from drover.control_plane.server import start_server, stop_server
    from drover.storage import queries
    from drover.storage.db import Store, sqlite_url

    served = await start_server(str(tmp_path / "d.db"), "127.0.0.1:0", emulation=True)
    sample = dict(job_id="", device="node-0/0", time=time.time(), step=1, compute_s_per_block=0.1)
    served.cp.store.buffer_samples(TelemetrySample, [sample])
    grpc_stop = served.server.stop

    async def cancelled(grace):
        raise asyncio.CancelledError

    served.server.stop = cancelled
    try:
        with pytest.raises(asyncio.CancelledError):
            await stop_server(served)
    finally:
        await grpc_stop(grace=None)
    store = Store(sqlite_url(str(tmp_path / "d.db")))  # StoreInUse, had it not been closed
    try:
        assert [t.step for t in store.read(lambda s: queries.telemetry(s, "", "node-0/0"))] == [1]
    finally:
        store.close()


async def test_a_request_that_meets_a_closed_store_is_unavailable_and_logs_no_error(plane, caplog):
    # A request still being handled as the server stopped logged "cannot schedule new futures
    # after shutdown" as an ERROR, and answered INTERNAL.
    plane.cp.store.close()
    with caplog.at_level("ERROR", logger="drover.server"):
        code, details = await code_of(plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()))
    assert code == grpc.StatusCode.UNAVAILABLE and "stopping" in details
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []


async def test_event_watches_are_bounded_and_a_closed_one_frees_its_slot(plane, monkeypatch):
    from drover.control_plane import api

    monkeypatch.setattr(api, "MAX_WATCHES", 2)
    plane.agent("node-0")
    await plane.connected(1)
    job = await plane.submit()
    watch = lambda: plane.jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job.id))  # noqa: E731
    first, second = watch(), watch()
    await first.read(), await second.read()  # both open, each past its first event
    code, details = await code_of(_first_of(watch()))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "2 event watches" in details
    first.cancel()
    await eventually(lambda: _opens(watch()), what="a slot freed by the closed watch")
    second.cancel()


async def _first_of(call):
    try:
        return await call.read()
    finally:
        call.cancel()


async def _opens(call) -> bool:
    try:
        await call.read()
        return True
    except grpc.aio.AioRpcError:
        return False
    finally:
        call.cancel()
