"""A small client of the job service for the CLI and `drover up`."""

from __future__ import annotations

import json
import os

import grpc
from google.protobuf import json_format

from drover.v1 import jobs_pb2, jobs_pb2_grpc

DEFAULT_ADDRESS = os.environ.get("DROVER_CONTROL_PLANE", "127.0.0.1:50051")


def connect(address: str = DEFAULT_ADDRESS) -> jobs_pb2_grpc.JobServiceStub:
    return jobs_pb2_grpc.JobServiceStub(grpc.insecure_channel(address))


def to_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def to_json(message) -> str:
    return json.dumps(to_dict(message), indent=2)


__all__ = ["connect", "to_dict", "to_json", "jobs_pb2", "DEFAULT_ADDRESS"]
