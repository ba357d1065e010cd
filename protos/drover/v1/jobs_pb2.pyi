from drover.v1 import events_pb2 as _events_pb2
from drover.v1 import jobspec_pb2 as _jobspec_pb2
from drover.v1 import plan_pb2 as _plan_pb2
from drover.v1 import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "job_yaml", "out_dir")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    JOB_YAML_FIELD_NUMBER: _ClassVar[int]
    OUT_DIR_FIELD_NUMBER: _ClassVar[int]
    spec: _jobspec_pb2.JobSpec
    job_yaml: str
    out_dir: str
    def __init__(self, spec: _Optional[_Union[_jobspec_pb2.JobSpec, _Mapping]] = ..., job_yaml: _Optional[str] = ..., out_dir: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "state", "model_name", "steps", "seed", "step", "plan_version", "committed_plan_version", "detail", "created", "out_dir", "progress", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    OUT_DIR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: _state_pb2.JobState
    model_name: str
    steps: int
    seed: int
    step: int
    plan_version: int
    committed_plan_version: int
    detail: str
    created: float
    out_dir: str
    progress: _state_pb2.Progress
    spec: _jobspec_pb2.JobSpec
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[_state_pb2.JobState, str]] = ..., model_name: _Optional[str] = ..., steps: _Optional[int] = ..., seed: _Optional[int] = ..., step: _Optional[int] = ..., plan_version: _Optional[int] = ..., committed_plan_version: _Optional[int] = ..., detail: _Optional[str] = ..., created: _Optional[float] = ..., out_dir: _Optional[str] = ..., progress: _Optional[_Union[_state_pb2.Progress, _Mapping]] = ..., spec: _Optional[_Union[_jobspec_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ("job_id", "nodes_told")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_TOLD_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    nodes_told: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., nodes_told: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("time", "step", "job_id", "kind", "details_json", "type", "job_pending", "job_started", "job_completed", "job_failed", "job_cancelled", "straggler_detected", "slow_link_suspected", "link_measured", "replan_skipped", "plan_pushed", "plan_committed", "migration_done", "workers_failed", "device_lost", "node_lost", "recovery_started", "recovered", "node_joined", "join_skipped")
    TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JOB_PENDING_FIELD_NUMBER: _ClassVar[int]
    JOB_STARTED_FIELD_NUMBER: _ClassVar[int]
    JOB_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    JOB_FAILED_FIELD_NUMBER: _ClassVar[int]
    JOB_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_DETECTED_FIELD_NUMBER: _ClassVar[int]
    SLOW_LINK_SUSPECTED_FIELD_NUMBER: _ClassVar[int]
    LINK_MEASURED_FIELD_NUMBER: _ClassVar[int]
    REPLAN_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    PLAN_PUSHED_FIELD_NUMBER: _ClassVar[int]
    PLAN_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_DONE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FAILED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_LOST_FIELD_NUMBER: _ClassVar[int]
    NODE_LOST_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_STARTED_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    NODE_JOINED_FIELD_NUMBER: _ClassVar[int]
    JOIN_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    time: float
    step: int
    job_id: str
    kind: str
    details_json: str
    type: _events_pb2.EventKind
    job_pending: _events_pb2.JobPending
    job_started: _events_pb2.JobStarted
    job_completed: _events_pb2.JobCompleted
    job_failed: _events_pb2.JobFailed
    job_cancelled: _events_pb2.JobCancelled
    straggler_detected: _events_pb2.StragglerDetected
    slow_link_suspected: _events_pb2.SlowLinkSuspected
    link_measured: _events_pb2.LinkMeasured
    replan_skipped: _events_pb2.ReplanSkipped
    plan_pushed: _events_pb2.PlanPushed
    plan_committed: _events_pb2.PlanCommitted
    migration_done: _events_pb2.MigrationDone
    workers_failed: _events_pb2.WorkersFailed
    device_lost: _events_pb2.DeviceLost
    node_lost: _events_pb2.NodeLost
    recovery_started: _events_pb2.RecoveryStarted
    recovered: _events_pb2.Recovered
    node_joined: _events_pb2.NodeJoined
    join_skipped: _events_pb2.JoinSkipped
    def __init__(self, time: _Optional[float] = ..., step: _Optional[int] = ..., job_id: _Optional[str] = ..., kind: _Optional[str] = ..., details_json: _Optional[str] = ..., type: _Optional[_Union[_events_pb2.EventKind, str]] = ..., job_pending: _Optional[_Union[_events_pb2.JobPending, _Mapping]] = ..., job_started: _Optional[_Union[_events_pb2.JobStarted, _Mapping]] = ..., job_completed: _Optional[_Union[_events_pb2.JobCompleted, _Mapping]] = ..., job_failed: _Optional[_Union[_events_pb2.JobFailed, _Mapping]] = ..., job_cancelled: _Optional[_Union[_events_pb2.JobCancelled, _Mapping]] = ..., straggler_detected: _Optional[_Union[_events_pb2.StragglerDetected, _Mapping]] = ..., slow_link_suspected: _Optional[_Union[_events_pb2.SlowLinkSuspected, _Mapping]] = ..., link_measured: _Optional[_Union[_events_pb2.LinkMeasured, _Mapping]] = ..., replan_skipped: _Optional[_Union[_events_pb2.ReplanSkipped, _Mapping]] = ..., plan_pushed: _Optional[_Union[_events_pb2.PlanPushed, _Mapping]] = ..., plan_committed: _Optional[_Union[_events_pb2.PlanCommitted, _Mapping]] = ..., migration_done: _Optional[_Union[_events_pb2.MigrationDone, _Mapping]] = ..., workers_failed: _Optional[_Union[_events_pb2.WorkersFailed, _Mapping]] = ..., device_lost: _Optional[_Union[_events_pb2.DeviceLost, _Mapping]] = ..., node_lost: _Optional[_Union[_events_pb2.NodeLost, _Mapping]] = ..., recovery_started: _Optional[_Union[_events_pb2.RecoveryStarted, _Mapping]] = ..., recovered: _Optional[_Union[_events_pb2.Recovered, _Mapping]] = ..., node_joined: _Optional[_Union[_events_pb2.NodeJoined, _Mapping]] = ..., join_skipped: _Optional[_Union[_events_pb2.JoinSkipped, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "page_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StreamLogsRequest(_message.Message):
    __slots__ = ("job_id", "node", "device", "tail_bytes", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node: str
    device: str
    tail_bytes: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., node: _Optional[str] = ..., device: _Optional[str] = ..., tail_bytes: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("node", "device", "data", "unavailable")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    node: str
    device: str
    data: bytes
    unavailable: str
    def __init__(self, node: _Optional[str] = ..., device: _Optional[str] = ..., data: _Optional[bytes] = ..., unavailable: _Optional[str] = ...) -> None: ...

class PlanRecord(_message.Message):
    __slots__ = ("job_id", "version", "reason", "committed", "created", "plan")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    reason: str
    committed: bool
    created: float
    plan: _plan_pb2.Plan
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., reason: _Optional[str] = ..., committed: _Optional[bool] = ..., created: _Optional[float] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("job_id", "version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "page_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[PlanRecord]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[PlanRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplanRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SetDetectionRequest(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class SetDetectionResponse(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class NodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "connected", "drained", "devices", "nics", "last_seen", "links")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    connected: bool
    drained: bool
    devices: _containers.RepeatedScalarFieldContainer[str]
    nics: _containers.RepeatedScalarFieldContainer[str]
    last_seen: float
    links: _containers.RepeatedCompositeFieldContainer[Link]
    def __init__(self, name: _Optional[str] = ..., connected: _Optional[bool] = ..., drained: _Optional[bool] = ..., devices: _Optional[_Iterable[str]] = ..., nics: _Optional[_Iterable[str]] = ..., last_seen: _Optional[float] = ..., links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("nic", "peer", "gbps", "time")
    NIC_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    nic: str
    peer: str
    gbps: float
    time: float
    def __init__(self, nic: _Optional[str] = ..., peer: _Optional[str] = ..., gbps: _Optional[float] = ..., time: _Optional[float] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QueryTelemetryRequest(_message.Message):
    __slots__ = ("job_id", "device", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    device: str
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., device: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class TelemetryPoint(_message.Message):
    __slots__ = ("time", "device", "step", "compute_s_per_block", "rate")
    TIME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    time: float
    device: str
    step: int
    compute_s_per_block: float
    rate: float
    def __init__(self, time: _Optional[float] = ..., device: _Optional[str] = ..., step: _Optional[int] = ..., compute_s_per_block: _Optional[float] = ..., rate: _Optional[float] = ...) -> None: ...

class QueryTelemetryResponse(_message.Message):
    __slots__ = ("points",)
    POINTS_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[TelemetryPoint]
    def __init__(self, points: _Optional[_Iterable[_Union[TelemetryPoint, _Mapping]]] = ...) -> None: ...

class QueryHistoryRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "page_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class HistoryPoint(_message.Message):
    __slots__ = ("step", "time", "loss", "lr", "samples_per_s", "plan_version", "rates")
    class RatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    step: int
    time: float
    loss: float
    lr: float
    samples_per_s: float
    plan_version: int
    rates: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., time: _Optional[float] = ..., loss: _Optional[float] = ..., lr: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., plan_version: _Optional[int] = ..., rates: _Optional[_Mapping[str, float]] = ...) -> None: ...

class QueryHistoryResponse(_message.Message):
    __slots__ = ("points", "next_page_token")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[HistoryPoint]
    next_page_token: str
    def __init__(self, points: _Optional[_Iterable[_Union[HistoryPoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StraggleRequest(_message.Message):
    __slots__ = ("device", "rate", "from_step")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    device: str
    rate: float
    from_step: int
    def __init__(self, device: _Optional[str] = ..., rate: _Optional[float] = ..., from_step: _Optional[int] = ...) -> None: ...

class StraggleResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...
