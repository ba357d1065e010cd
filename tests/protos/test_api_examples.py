"""The grpcurl calls of docs/api.md, made the way grpcurl makes them: the service and message
types found through the server's reflection, the request parsed from the documented JSON. Every
call a reader may make is run against a real control plane with a finished job, and answers
with the documented response type."""

from __future__ import annotations

import re

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


def test_every_reader_call_in_the_reference_answers_as_documented(drover_control_plane, drover_agent):
    drover_agent("node-0")
    with Client(drover_control_plane.address) as drover:
        job = drover.submit(job_spec(TINY_JOB), out_dir="out")
        assert drover.wait(job.id, timeout_s=20) == "completed"
    calls = documented_calls()
    channel = grpc.insecure_channel(drover_control_plane.address)
    pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))  # as grpcurl: no .proto files
    service = pool.FindServiceByName("drover.v1.JobService")
    assert sorted(c["name"] for c in calls) == sorted(m.name for m in service.methods)  # every RPC has one
    ran = []
    for call in (c for c in calls if c["role"] == "reader" or c["name"] == "SubmitJob"):
        method = service.FindMethodByName(call["name"])
        assert method.input_type.name == call["request"] and method.output_type.name == call["response"]
        request = json_format.Parse(call["body"].replace("job-1", job.id), GetMessageClass(method.input_type)())
        response_class = GetMessageClass(method.output_type)
        path, wire = "/" + call["path"], (lambda m: m.SerializeToString(), response_class.FromString)
        if call["stream"]:
            replies = list(channel.unary_stream(path, *wire)(request))
        else:
            replies = [channel.unary_unary(path, *wire)(request)]
        assert all(type(r).DESCRIPTOR.full_name == f"drover.v1.{call['response']}" for r in replies)
        ran.append(call["name"])
    channel.close()
    submitted = json_format.Parse(calls[0]["body"], jobs_pb2.SubmitJobRequest())
    assert calls[0]["name"] == "SubmitJob" and submitted.spec.steps == 30  # the JobSpec as documented, and it ran:
    with Client(drover_control_plane.address) as drover:
        assert [drover.wait(j.id, timeout_s=20) for j in drover.list()] == ["completed", "completed"]
    assert set(ran) == {
        "SubmitJob", "GetJob", "ListJobs", "WatchEvents", "ListEvents", "GetPlan", "ListPlans", "ListNodes",
        "QueryTelemetry", "QueryHistory",
    }  # fmt: skip
