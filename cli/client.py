"""The CLI's side of the client (drover.client): connecting from its options, and JSON output."""

from __future__ import annotations

import json
import os
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from drover.client import Client, Target
from drover.v1 import jobs_pb2

from .models import ModelReader

DEFAULT_ADDRESS = os.environ.get("DROVER_CONTROL_PLANE", "127.0.0.1:50051")


def connect(target: Target) -> Client:
    """The CLI's client of the control plane (drover.client)."""
    return Client(target)


def submit_job(
    client: Client, job_file: Path, out_dir: str = "", resume: str | None = None, reader=None
) -> jobs_pb2.Job:
    """Submit a job file, read here with its model file inlined (a model path inside it is
    relative to the file's folder; a custom model counted). SpecError for a bad file."""
    return client.submit_file(job_file, out_dir, resume, reader or ModelReader())


def to_dict(message) -> dict:
    """The message as JSON's types: proto3's JSON mapping writes 64-bit integers as strings
    (for JavaScript); a script reading `--json` gets numbers."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(message.DESCRIPTOR, data)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64}
_INT64 |= {FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _numbers(descriptor, data: dict) -> dict:
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"]
            if inner.type in _INT64:
                data[field.name] = {k: int(v) for k, v in value.items()}
            elif inner.message_type is not None:
                data[field.name] = {k: _numbers(inner.message_type, v) for k, v in value.items()}
        elif field.message_type is not None and field.message_type.full_name.startswith("drover."):
            items = value if field.is_repeated else [value]
            for item in items:
                _numbers(field.message_type, item)
        elif field.type in _INT64:
            data[field.name] = [int(v) for v in value] if field.is_repeated else int(value)
    return data


def to_json(message) -> str:
    return json.dumps(to_dict(message), indent=2)


__all__ = ["Target", "connect", "submit_job", "to_dict", "to_json", "jobs_pb2", "DEFAULT_ADDRESS"]
