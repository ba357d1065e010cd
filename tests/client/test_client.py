"""drover.client against a real control plane in process and simulated agents (the plugin's
fixtures): typed results, events with their details, the final state, and errors by code."""

from __future__ import annotations

import grpc
import pytest

from drover.client import AsyncClient, Client, EventKind, FailedPrecondition, InvalidArgument, NotFound, job_spec
from drover.v1 import jobspec_pb2, state_pb2

from support import ROOT, TINY_JOB


def test_a_job_submitted_watched_and_waited_for(drover_control_plane, drover_agent):
    drover_agent("node-0")
    drover_agent("node-1", rates={"node-1/1": 3.0})
    with Client(drover_control_plane.address) as drover:
        job = drover.submit_file(ROOT / "examples" / "jobs" / "tiny.yaml", out_dir="out")
        assert job.state == state_pb2.JOB_STATE_RUNNING and job.steps == 30
        assert job.spec.model.layers == 4 and job.spec.optimizer.lr == 3e-3  # as taken, defaults filled in
        assert job.spec.name == "tiny" and job.spec.model.ffn_hidden == 256 and job.spec.model.mfu == 0.5
        assert job.spec.model.family == jobspec_pb2.MODEL_FAMILY_GPT and job.spec.model.kv_heads == 4
        kinds = [event.kind for event in drover.watch(job.id)]  # until the job ends
        assert kinds[0] == "job_started" and kinds[-1] == "job_completed"
        assert drover.wait(job.id, timeout_s=10) == "completed"
        assert [e.kind for e in drover.events(job.id)] == kinds
        started = drover.events(job.id)[0]
        assert started.details["devices"] == ["node-0/0", "node-0/1", "node-1/0", "node-1/1"]
        assert (
            started.type == EventKind.EVENT_KIND_JOB_STARTED
            and list(started.payload.devices) == started.details["devices"]
        )
        detected = [e.payload for e in drover.events(job.id) if e.type == EventKind.EVENT_KIND_STRAGGLER_DETECTED]
        assert [(d.device, round(d.rate, 1)) for d in detected] == [("node-1/1", 3.0)]
        committed = [e.payload for e in drover.events(job.id) if e.type == EventKind.EVENT_KIND_PLAN_COMMITTED]
        assert committed[0].plan_version == 1 and committed[0].plan.pipelines  # the plan, typed
        assert [j.id for j in drover.list()] == [job.id]
        assert [p.version for p in drover.plans(job.id)][0] == 1 and drover.plan(job.id).version >= 1
        assert [p.step for p in drover.history(job.id)] == list(range(30))
        assert {n.name for n in drover.nodes()} == {"node-0", "node-1"}
        assert drover.drain("node-1").drained and not drover.undrain("node-1").drained


def test_errors_come_as_the_status_codes_exceptions_with_the_servers_words(drover_control_plane, drover_agent):
    with Client(drover_control_plane.address) as drover:
        with pytest.raises(NotFound) as missing:
            drover.get("job-404")
        assert "job-404" in missing.value.details() and missing.value.code().name == "NOT_FOUND"
        assert isinstance(missing.value, grpc.RpcError)  # what code catching grpc's errors expects
        with pytest.raises(InvalidArgument, match="steps"):
            drover.submit(job_spec(TINY_JOB.replace("steps: 30", "steps: -1")))
        # Refused before it is sent, as the server refuses: InvalidArgument, not a ValueError.
        with pytest.raises(InvalidArgument, match="stepz"):
            drover.submit({"stepz": 1})
        with pytest.raises(InvalidArgument, match="a mapping"):
            drover.submit("steps: 3\nmodel: ../models/tiny.yaml\n")  # the model must be inline
        with pytest.raises(InvalidArgument, match="no-such-job.yaml"):
            drover.submit_file("no-such-job.yaml")
        with pytest.raises(InvalidArgument):
            drover.submit("steps: [3\n")
        with pytest.raises(FailedPrecondition, match="start agents first"):
            drover.submit(job_spec(TINY_JOB))  # no agent yet
        drover_agent("node-0")
        job = drover.submit(job_spec(TINY_JOB))
        assert drover.wait(job.id, timeout_s=10) == "completed"
        with pytest.raises(FailedPrecondition, match="only a running or pending job can be cancelled"):
            drover.cancel(job.id)


async def test_the_asyncio_client(drover_control_plane, drover_agent):
    drover_agent("node-0")
    async with AsyncClient(drover_control_plane.address) as drover:
        job = await drover.submit(job_spec(TINY_JOB), out_dir="out")
        kinds = [event.kind async for event in drover.watch(job.id)]
        assert kinds[-1] == "job_completed" and await drover.wait(job.id) == "completed"
        assert [j.id for j in await drover.list()] == [job.id]
        assert len(await drover.history(job.id)) == 30
        with pytest.raises(NotFound):
            await drover.get("job-404")


def test_a_plain_connection_closed_mid_call_is_no_credentials_mistake():
    # Only a connection closed while connecting means a TLS server: one that dies during a stream
    # ("Stream removed (Socket closed)") read as "give --ca and --token-file".
    from drover.client import Unauthenticated, Unavailable, error_of

    class Failed(grpc.RpcError):
        def __init__(self, details):
            self._details = details

        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return self._details

    connecting = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed"
    assert isinstance(error_of(Failed(connecting), plain=True), Unauthenticated)
    assert isinstance(error_of(Failed("Stream removed (Socket closed)"), plain=True), Unavailable)
    assert isinstance(error_of(Failed(connecting), plain=False), Unavailable)
