"""The planner's Plan and the wire's drover.v1.Plan: the JSON form of one is
the other (protobuf JSON mapping with the .proto's field names)."""

from __future__ import annotations

from google.protobuf import json_format

from drover.v1 import plan_pb2, state_pb2

from .plan import Plan, plan_from_dict

# For both ends of the agent stream: it carries small messages a few times a second, and
# HTTP/2 bandwidth probing would add a ping and a wake-up to each.
STREAM_OPTIONS = [("grpc.http2.bdp_probe", 0)]


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT is on this machine: where running without TLS is allowed."""
    return address.rsplit(":", 1)[0] in LOOPBACK


def host_port(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 address in brackets ([2001:db8::5]:29500), as URLs and gRPC want it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    return host.strip("[]") in ("127.0.0.1", "localhost", "::1")


def job_state(name: str) -> state_pb2.JobState:
    """'running' -> JOB_STATE_RUNNING: storage and the domain keep the short names."""
    return state_pb2.JobState.Value(f"JOB_STATE_{name.upper()}")


def job_state_name(value: state_pb2.JobState) -> str:
    """JOB_STATE_RUNNING -> 'running'."""
    return state_pb2.JobState.Name(value).removeprefix("JOB_STATE_").lower()


def plan_to_proto(plan: Plan) -> plan_pb2.Plan:
    return json_format.ParseDict(plan.to_dict(), plan_pb2.Plan())


def plan_from_proto(message: plan_pb2.Plan, source: str = "plan") -> Plan:
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    if not message.HasField("predicted"):
        data.pop("predicted", None)
    return plan_from_dict(data, source)
