"""The grpcurl calls of docs/api.md, made the way grpcurl makes them: the service and message
types found through the server's reflection, the request parsed from the documented JSON. Every
call is run against a real control plane (the readers' on a finished job, the operators' and
admins' on a running one) and answers with the documented response type."""

from __future__ import annotations

import re
import time

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from drover.client import Client, job_spec
from drover.v1 import jobs_pb2

from support import ROOT, TINY_JOB

CALL = re.compile(
    r"### JobService\.(?P<name>\w+)\n\n`\w+\((?P<request>\w+)\) returns \((?P<stream>stream )?(?P<response>\w+)\)`"
    r".*?Role: (?P<role>\w+)\..*?-d '(?P<body>[^']*)'.*?localhost:50051 (?P<path>drover\.v1\.JobService/\w+)",
    re.S,
)


def documented_calls() -> list[dict]:
    return [m.groupdict() for m in CALL.finditer((ROOT / "docs" / "api.md").read_text())]


def until(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Reflected:
    """JobService as grpcurl sees it: found through reflection, called with JSON bodies."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(self.channel))  # as grpcurl: no .proto files
        self.service = pool.FindServiceByName("drover.v1.JobService")

    def call(self, call: dict, job_id: str) -> list:
        """Make a documented call on `job_id` (for the docs' job-1); its replies, each checked to
        be of the documented type."""
        method = self.service.FindMethodByName(call["name"])
        assert method.input_type.name == call["request"] and method.output_type.name == call["response"]
        request = json_format.Parse(call["body"].replace("job-1", job_id), GetMessageClass(method.input_type)())
        path, wire = (
            "/" + call["path"],
            (lambda m: m.SerializeToString(), GetMessageClass(method.output_type).FromString),
        )
        if call["stream"]:
            replies = list(self.channel.unary_stream(path, *wire)(request, timeout=20))
        else:
            replies = [self.channel.unary_unary(path, *wire)(request, timeout=20)]
        assert all(type(r).DESCRIPTOR.full_name == f"drover.v1.{call['response']}" for r in replies)
        return replies


def test_every_reader_call_in_the_reference_answers_as_documented(drover_control_plane, drover_agent):
    drover_agent("node-0")
    with Client(drover_control_plane.address) as drover:
        job = drover.submit(job_spec(TINY_JOB), out_dir="out")
        assert drover.wait(job.id, timeout_s=20) == "completed"
    calls = documented_calls()
    api = Reflected(drover_control_plane.address)
    assert sorted(c["name"] for c in calls) == sorted(m.name for m in api.service.methods)  # every RPC has one
    ran = [c["name"] for c in calls if (c["role"] == "reader" or c["name"] == "SubmitJob") and api.call(c, job.id)]
    api.channel.close()
    submitted = json_format.Parse(calls[0]["body"], jobs_pb2.SubmitJobRequest())
    assert calls[0]["name"] == "SubmitJob" and submitted.spec.steps == 30  # the JobSpec as documented, and it ran:
    with Client(drover_control_plane.address) as drover:
        assert [drover.wait(j.id, timeout_s=20) for j in drover.list()] == ["completed", "completed"]
    assert set(ran) == {
        "SubmitJob", "GetJob", "ListJobs", "WatchEvents", "ListEvents", "GetPlan", "ListPlans", "ListNodes",
        "QueryTelemetry", "QueryHistory",
    }  # fmt: skip


def test_every_operator_and_admin_call_in_the_reference_does_what_it_says(drover_control_plane, drover_agent):
    drover_agent("node-0")
    node_1 = drover_agent("node-1")
    long_job = job_spec(TINY_JOB)
    long_job.steps = 100_000  # runs until cancelled
    with Client(drover_control_plane.address) as drover:
        job = drover.submit(long_job, out_dir="out")
        until(lambda: drover.get(job.id).step >= 3, timeout_s=20)
        calls = {c["name"]: c for c in documented_calls() if c["role"] != "reader" and c["name"] != "SubmitJob"}
        api = Reflected(drover_control_plane.address)
        [straggled] = api.call(calls.pop("Straggle"), job.id)
        assert straggled.node == "node-1"
        until(lambda: node_1.rates.get("node-1/0") == 3.0, timeout_s=10)
        api.call(calls.pop("Replan"), job.id)
        api.call(calls.pop("SetDetection"), job.id)
        logs = b"".join(lines.data for lines in api.call(calls.pop("StreamLogs"), job.id))
        assert b"node-0/0: step 0\n" in logs and b"node-1/1: step 0\n" in logs
        assert api.call(calls.pop("DrainNode"), job.id)[0].drained
        assert not api.call(calls.pop("UndrainNode"), job.id)[0].drained
        api.call(calls.pop("CancelJob"), job.id)
        assert drover.wait(job.id, timeout_s=20) == "cancelled"
        [deleted] = api.call(calls.pop("DeleteJob"), job.id)
        assert deleted.job_id == job.id and sorted(deleted.nodes_told) == ["node-0", "node-1"]
        assert [j.id for j in drover.list()] == []
        assert calls == {}  # every documented call ran
        api.channel.close()
