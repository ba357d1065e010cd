"""A small client of the job service for the CLI and `drover up`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
from google.protobuf import json_format

from drover.v1 import jobs_pb2, jobs_pb2_grpc

DEFAULT_ADDRESS = os.environ.get("DROVER_CONTROL_PLANE", "127.0.0.1:50051")


def connect(address: str = DEFAULT_ADDRESS) -> jobs_pb2_grpc.JobServiceStub:
    return jobs_pb2_grpc.JobServiceStub(grpc.insecure_channel(address))


def submit_job(stub: jobs_pb2_grpc.JobServiceStub, job_file: Path, out_dir: Path | None = None) -> jobs_pb2.Job:
    """Submit a job file; a model path inside it is relative to the file's folder. Without
    `out_dir` the control plane picks where the job's output goes. OSError if unreadable."""
    return stub.SubmitJob(
        jobs_pb2.SubmitJobRequest(
            job_yaml=job_file.read_text(),
            base_dir=str(job_file.parent.resolve()),
            out_dir=str(out_dir.resolve()) if out_dir else "",
        )
    )


def to_dict(message) -> dict:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def to_json(message) -> str:
    return json.dumps(to_dict(message), indent=2)


__all__ = ["connect", "submit_job", "to_dict", "to_json", "jobs_pb2", "DEFAULT_ADDRESS"]
