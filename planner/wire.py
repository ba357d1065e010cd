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


# -- typed messages <-> job-file mappings -----------------------------------------------
# A JobSpec's fields are named like the job file's keys, so one mapping serves both: the
# server checks a JobSpec through the job file's own checks (control_plane/jobfile.py) and
# the CLI writes a job file as a JobSpec. Enum values read as their short lower-case word
# (PRECISION_BF16 <-> "bf16"); fields left at proto3's default are absent (the job file's
# default applies), optional ones set to zero are present.


def _enum_prefix(enum_type) -> str:
    """ModelFamily -> MODEL_FAMILY_: the prefix every value name of the enum starts with."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(enum_type.name)).upper() + "_"


def message_to_fields(message) -> dict:
    """The job-file mapping of a message: present fields only, enums as words."""

    def value(fd, v):
        if fd.message_type is not None:
            return message_to_fields(v)
        if fd.enum_type is not None:
            known = fd.enum_type.values_by_number.get(v)
            return known.name.removeprefix(_enum_prefix(fd.enum_type)).lower() if known else v
        return v

    return {
        fd.name: [value(fd, v) for v in got] if fd.is_repeated else value(fd, got) for fd, got in message.ListFields()
    }


class FieldError(ValueError):
    """A value a message cannot hold, named by its key's path."""


def message_from_fields(data: dict, message, where: str = ""):
    """Fill `message` from a job-file mapping (unchecked: the server checks what it is sent).
    FieldError names the key of a value the message cannot hold."""
    for key, value in data.items():
        path = f"{where}{key}"
        if value is None:  # YAML's null: not given
            continue
        fd = message.DESCRIPTOR.fields_by_name.get(key)
        if fd is None:
            allowed = ", ".join(message.DESCRIPTOR.fields_by_name)
            raise FieldError(f"{path}: not a field of {message.DESCRIPTOR.name} (allowed: {allowed})")
        oneof = fd.containing_oneof
        if oneof is not None and message.WhichOneof(oneof.name):
            taken = message.WhichOneof(oneof.name)
            raise FieldError(f"{path}: {where}{taken} is set; only one of {', '.join(f.name for f in oneof.fields)}")
        try:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                _fill_map(fd, value, getattr(message, key), path)
            elif fd.message_type is not None and fd.is_repeated:
                for item in value:
                    message_from_fields(_mapping(item), getattr(message, key).add(), f"{path}[].")
            elif fd.message_type is not None:
                getattr(message, key).SetInParent()  # given, even empty: the server judges `checkpoint: {}`
                message_from_fields(_mapping(value), getattr(message, key), f"{path}.")
            elif fd.is_repeated:
                getattr(message, key).extend(_scalar(fd, v) for v in value)
            else:
                setattr(message, key, _scalar(fd, value))
        except FieldError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise FieldError(f"{path} = {str(value)[:100]}: {exc}") from None
    return message


def _mapping(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError("a mapping")
    return value


def _fill_map(fd, value, target, path: str) -> None:
    key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
    for k, v in _mapping(value).items():
        if value_fd.message_type is not None:
            message_from_fields(_mapping(v), target[_scalar(key_fd, k)], f"{path}[{k}].")
        else:
            target[_scalar(key_fd, k)] = _scalar(value_fd, v)


def _scalar(fd, value):
    if fd.enum_type is not None:
        word = f"{_enum_prefix(fd.enum_type)}{str(value).upper()}"
        if word not in fd.enum_type.values_by_name:
            words = [v.name.removeprefix(_enum_prefix(fd.enum_type)).lower() for v in fd.enum_type.values if v.number]
            raise ValueError(f"one of {', '.join(words)}")
        return fd.enum_type.values_by_name[word].number
    if fd.cpp_type == fd.CPPTYPE_DOUBLE and isinstance(value, str):
        return float(value)  # YAML 1.1 reads 1e-8 as a string
    if fd.cpp_type == fd.CPPTYPE_STRING and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # YAML reads `name: 2024` as a number
    return value
