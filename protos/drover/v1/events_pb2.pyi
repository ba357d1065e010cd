from drover.v1 import plan_pb2 as _plan_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_JOB_PENDING: _ClassVar[EventKind]
    EVENT_KIND_JOB_STARTED: _ClassVar[EventKind]
    EVENT_KIND_JOB_COMPLETED: _ClassVar[EventKind]
    EVENT_KIND_JOB_FAILED: _ClassVar[EventKind]
    EVENT_KIND_JOB_CANCELLED: _ClassVar[EventKind]
    EVENT_KIND_STRAGGLER_DETECTED: _ClassVar[EventKind]
    EVENT_KIND_SLOW_LINK_SUSPECTED: _ClassVar[EventKind]
    EVENT_KIND_LINK_MEASURED: _ClassVar[EventKind]
    EVENT_KIND_REPLAN_SKIPPED: _ClassVar[EventKind]
    EVENT_KIND_PLAN_PUSHED: _ClassVar[EventKind]
    EVENT_KIND_PLAN_COMMITTED: _ClassVar[EventKind]
    EVENT_KIND_MIGRATION_DONE: _ClassVar[EventKind]
    EVENT_KIND_WORKERS_FAILED: _ClassVar[EventKind]
    EVENT_KIND_DEVICE_LOST: _ClassVar[EventKind]
    EVENT_KIND_NODE_LOST: _ClassVar[EventKind]
    EVENT_KIND_RECOVERY_STARTED: _ClassVar[EventKind]
    EVENT_KIND_RECOVERED: _ClassVar[EventKind]
    EVENT_KIND_NODE_JOINED: _ClassVar[EventKind]
    EVENT_KIND_JOIN_SKIPPED: _ClassVar[EventKind]
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_JOB_PENDING: EventKind
EVENT_KIND_JOB_STARTED: EventKind
EVENT_KIND_JOB_COMPLETED: EventKind
EVENT_KIND_JOB_FAILED: EventKind
EVENT_KIND_JOB_CANCELLED: EventKind
EVENT_KIND_STRAGGLER_DETECTED: EventKind
EVENT_KIND_SLOW_LINK_SUSPECTED: EventKind
EVENT_KIND_LINK_MEASURED: EventKind
EVENT_KIND_REPLAN_SKIPPED: EventKind
EVENT_KIND_PLAN_PUSHED: EventKind
EVENT_KIND_PLAN_COMMITTED: EventKind
EVENT_KIND_MIGRATION_DONE: EventKind
EVENT_KIND_WORKERS_FAILED: EventKind
EVENT_KIND_DEVICE_LOST: EventKind
EVENT_KIND_NODE_LOST: EventKind
EVENT_KIND_RECOVERY_STARTED: EventKind
EVENT_KIND_RECOVERED: EventKind
EVENT_KIND_NODE_JOINED: EventKind
EVENT_KIND_JOIN_SKIPPED: EventKind

class JobPending(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class JobStarted(_message.Message):
    __slots__ = ("nodes", "devices", "plan_version")
    NODES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    devices: _containers.RepeatedScalarFieldContainer[str]
    plan_version: int
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., devices: _Optional[_Iterable[str]] = ..., plan_version: _Optional[int] = ...) -> None: ...

class JobCompleted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobFailed(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class JobCancelled(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StragglerDetected(_message.Message):
    __slots__ = ("device", "rate")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    device: str
    rate: float
    def __init__(self, device: _Optional[str] = ..., rate: _Optional[float] = ...) -> None: ...

class SlowLinkSuspected(_message.Message):
    __slots__ = ("device",)
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    device: str
    def __init__(self, device: _Optional[str] = ...) -> None: ...

class LinkMeasured(_message.Message):
    __slots__ = ("node", "nic", "gbps", "was_gbps")
    NODE_FIELD_NUMBER: _ClassVar[int]
    NIC_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    WAS_GBPS_FIELD_NUMBER: _ClassVar[int]
    node: str
    nic: str
    gbps: float
    was_gbps: float
    def __init__(self, node: _Optional[str] = ..., nic: _Optional[str] = ..., gbps: _Optional[float] = ..., was_gbps: _Optional[float] = ...) -> None: ...

class ReplanSkipped(_message.Message):
    __slots__ = ("reason", "rates", "links", "current_step_s", "proposed_step_s", "gain_s", "migration_s", "steps_left")
    class RatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LinksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REASON_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_S_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_STEP_S_FIELD_NUMBER: _ClassVar[int]
    GAIN_S_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_LEFT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    rates: _containers.ScalarMap[str, float]
    links: _containers.ScalarMap[str, float]
    current_step_s: float
    proposed_step_s: float
    gain_s: float
    migration_s: float
    steps_left: int
    def __init__(self, reason: _Optional[str] = ..., rates: _Optional[_Mapping[str, float]] = ..., links: _Optional[_Mapping[str, float]] = ..., current_step_s: _Optional[float] = ..., proposed_step_s: _Optional[float] = ..., gain_s: _Optional[float] = ..., migration_s: _Optional[float] = ..., steps_left: _Optional[int] = ...) -> None: ...

class PlanPushed(_message.Message):
    __slots__ = ("plan_version", "reason")
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    plan_version: int
    reason: str
    def __init__(self, plan_version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PlanCommitted(_message.Message):
    __slots__ = ("plan_version", "plan")
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan_version: int
    plan: _plan_pb2.Plan
    def __init__(self, plan_version: _Optional[int] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ...) -> None: ...

class MigrationDone(_message.Message):
    __slots__ = ("plan_version", "bytes_moved", "blocks_moved", "seconds")
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_MOVED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    plan_version: int
    bytes_moved: int
    blocks_moved: int
    seconds: float
    def __init__(self, plan_version: _Optional[int] = ..., bytes_moved: _Optional[int] = ..., blocks_moved: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class WorkersFailed(_message.Message):
    __slots__ = ("node", "detail")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    node: str
    detail: str
    def __init__(self, node: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class DeviceLost(_message.Message):
    __slots__ = ("node", "devices", "silent_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    silent_s: float
    def __init__(self, node: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., silent_s: _Optional[float] = ...) -> None: ...

class NodeLost(_message.Message):
    __slots__ = ("node", "after_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AFTER_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    after_s: float
    def __init__(self, node: _Optional[str] = ..., after_s: _Optional[float] = ...) -> None: ...

class RecoveryStarted(_message.Message):
    __slots__ = ("lost", "devices", "plan_version", "world")
    LOST_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    lost: _containers.RepeatedScalarFieldContainer[str]
    devices: _containers.RepeatedScalarFieldContainer[str]
    plan_version: int
    world: int
    def __init__(self, lost: _Optional[_Iterable[str]] = ..., devices: _Optional[_Iterable[str]] = ..., plan_version: _Optional[int] = ..., world: _Optional[int] = ...) -> None: ...

class Recovered(_message.Message):
    __slots__ = ("recovered_from", "plan_version", "steps_redone", "seconds", "bytes_moved")
    RECOVERED_FROM_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEPS_REDONE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    recovered_from: str
    plan_version: int
    steps_redone: int
    seconds: float
    bytes_moved: int
    def __init__(self, recovered_from: _Optional[str] = ..., plan_version: _Optional[int] = ..., steps_redone: _Optional[int] = ..., seconds: _Optional[float] = ..., bytes_moved: _Optional[int] = ...) -> None: ...

class NodeJoined(_message.Message):
    __slots__ = ("node", "devices", "plan_version")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    node: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    plan_version: int
    def __init__(self, node: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., plan_version: _Optional[int] = ...) -> None: ...

class JoinSkipped(_message.Message):
    __slots__ = ("node", "step_s_now", "step_s_grown", "steps_left", "migration_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STEP_S_NOW_FIELD_NUMBER: _ClassVar[int]
    STEP_S_GROWN_FIELD_NUMBER: _ClassVar[int]
    STEPS_LEFT_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    step_s_now: float
    step_s_grown: float
    steps_left: int
    migration_s: float
    def __init__(self, node: _Optional[str] = ..., step_s_now: _Optional[float] = ..., step_s_grown: _Optional[float] = ..., steps_left: _Optional[int] = ..., migration_s: _Optional[float] = ...) -> None: ...
