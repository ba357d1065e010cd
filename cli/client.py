"""A small client of the job service for the CLI and `drover up`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
from google.protobuf import json_format

from drover.control_plane.jobfile import read_job_file
from drover.v1 import jobs_pb2, jobs_pb2_grpc

DEFAULT_ADDRESS = os.environ.get("DROVER_CONTROL_PLANE", "127.0.0.1:50051")


def connect(address: str = DEFAULT_ADDRESS) -> jobs_pb2_grpc.JobServiceStub:
    return jobs_pb2_grpc.JobServiceStub(grpc.insecure_channel(address))


def submit_job(stub: jobs_pb2_grpc.JobServiceStub, job_file: Path, out_dir: str = "") -> jobs_pb2.Job:
    """Submit a job file, read here with its model file inlined (a model path inside it is
    relative to the file's folder). `out_dir` is relative to each agent's data root; empty:
    the control plane's default. SpecError for a bad or unreadable file."""
    return stub.SubmitJob(jobs_pb2.SubmitJobRequest(job_yaml=read_job_file(job_file), out_dir=out_dir))


def to_dict(message) -> dict:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def to_json(message) -> str:
    return json.dumps(to_dict(message), indent=2)


__all__ = ["connect", "submit_job", "to_dict", "to_json", "jobs_pb2", "DEFAULT_ADDRESS"]
