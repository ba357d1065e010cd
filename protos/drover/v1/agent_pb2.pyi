from drover.v1 import plan_pb2 as _plan_pb2
from drover.v1 import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("hello", "telemetry", "status", "log_chunk")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LOG_CHUNK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    telemetry: Telemetry
    status: JobStatus
    log_chunk: LogChunk
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., status: _Optional[_Union[JobStatus, _Mapping]] = ..., log_chunk: _Optional[_Union[LogChunk, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("start_job", "plan", "command", "recover")
    START_JOB_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    RECOVER_FIELD_NUMBER: _ClassVar[int]
    start_job: StartJob
    plan: PlanUpdate
    command: Command
    recover: Recover
    def __init__(self, start_job: _Optional[_Union[StartJob, _Mapping]] = ..., plan: _Optional[_Union[PlanUpdate, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., recover: _Optional[_Union[Recover, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "devices", "nics", "agent_version", "jobs", "probe_port", "advertise_address")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    nics: _containers.RepeatedCompositeFieldContainer[Nic]
    agent_version: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    probe_port: int
    advertise_address: str
    def __init__(self, node: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[Nic, _Mapping]]] = ..., agent_version: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., probe_port: _Optional[int] = ..., advertise_address: _Optional[str] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "kind", "name", "memory_gib", "tflops", "intra_gbps")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FIELD_NUMBER: _ClassVar[int]
    INTRA_GBPS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    name: str
    memory_gib: float
    tflops: float
    intra_gbps: float
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., memory_gib: _Optional[float] = ..., tflops: _Optional[float] = ..., intra_gbps: _Optional[float] = ...) -> None: ...

class Nic(_message.Message):
    __slots__ = ("name", "type", "gbps", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    gbps: float
    address: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., gbps: _Optional[float] = ..., address: _Optional[str] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("time", "job_id", "active_plan_version", "devices", "nics", "migrations", "progress", "stalled_devices", "lost_devices", "links", "steps")
    TIME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    STALLED_DEVICES_FIELD_NUMBER: _ClassVar[int]
    LOST_DEVICES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    time: float
    job_id: str
    active_plan_version: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceSample]
    nics: _containers.RepeatedCompositeFieldContainer[NicSample]
    migrations: _containers.RepeatedCompositeFieldContainer[Migration]
    progress: _state_pb2.Progress
    stalled_devices: _containers.RepeatedScalarFieldContainer[str]
    lost_devices: _containers.RepeatedScalarFieldContainer[str]
    links: _containers.RepeatedCompositeFieldContainer[LinkSample]
    steps: _containers.RepeatedCompositeFieldContainer[_state_pb2.Progress]
    def __init__(self, time: _Optional[float] = ..., job_id: _Optional[str] = ..., active_plan_version: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceSample, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[NicSample, _Mapping]]] = ..., migrations: _Optional[_Iterable[_Union[Migration, _Mapping]]] = ..., progress: _Optional[_Union[_state_pb2.Progress, _Mapping]] = ..., stalled_devices: _Optional[_Iterable[str]] = ..., lost_devices: _Optional[_Iterable[str]] = ..., links: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., steps: _Optional[_Iterable[_Union[_state_pb2.Progress, _Mapping]]] = ...) -> None: ...

class Migration(_message.Message):
    __slots__ = ("step", "plan_version", "bytes_moved", "blocks_moved", "seconds", "recovered_from", "steps_redone")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_MOVED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FROM_FIELD_NUMBER: _ClassVar[int]
    STEPS_REDONE_FIELD_NUMBER: _ClassVar[int]
    step: int
    plan_version: int
    bytes_moved: int
    blocks_moved: int
    seconds: float
    recovered_from: str
    steps_redone: int
    def __init__(self, step: _Optional[int] = ..., plan_version: _Optional[int] = ..., bytes_moved: _Optional[int] = ..., blocks_moved: _Optional[int] = ..., seconds: _Optional[float] = ..., recovered_from: _Optional[str] = ..., steps_redone: _Optional[int] = ...) -> None: ...

class DeviceSample(_message.Message):
    __slots__ = ("device", "step", "compute_s_per_block", "p2p_wait_s", "grad_sync_s")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    P2P_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    GRAD_SYNC_S_FIELD_NUMBER: _ClassVar[int]
    device: str
    step: int
    compute_s_per_block: float
    p2p_wait_s: float
    grad_sync_s: float
    def __init__(self, device: _Optional[str] = ..., step: _Optional[int] = ..., compute_s_per_block: _Optional[float] = ..., p2p_wait_s: _Optional[float] = ..., grad_sync_s: _Optional[float] = ...) -> None: ...

class NicSample(_message.Message):
    __slots__ = ("nic", "tx_bytes_per_s", "rx_bytes_per_s")
    NIC_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    nic: str
    tx_bytes_per_s: float
    rx_bytes_per_s: float
    def __init__(self, nic: _Optional[str] = ..., tx_bytes_per_s: _Optional[float] = ..., rx_bytes_per_s: _Optional[float] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "state", "step", "active_plan_version", "detail")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: _state_pb2.JobState
    step: int
    active_plan_version: int
    detail: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[_state_pb2.JobState, str]] = ..., step: _Optional[int] = ..., active_plan_version: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class StartJob(_message.Message):
    __slots__ = ("job_id", "model_yaml", "steps", "seed", "world_size", "ranks", "master_addr", "master_port", "plan_version", "plan", "out_dir", "generation", "previous_plan", "previous_ranks")
    class RanksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class PreviousRanksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_YAML_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OUT_DIR_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PLAN_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RANKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model_yaml: str
    steps: int
    seed: int
    world_size: int
    ranks: _containers.ScalarMap[str, int]
    master_addr: str
    master_port: int
    plan_version: int
    plan: _plan_pb2.Plan
    out_dir: str
    generation: int
    previous_plan: _plan_pb2.Plan
    previous_ranks: _containers.ScalarMap[str, int]
    def __init__(self, job_id: _Optional[str] = ..., model_yaml: _Optional[str] = ..., steps: _Optional[int] = ..., seed: _Optional[int] = ..., world_size: _Optional[int] = ..., ranks: _Optional[_Mapping[str, int]] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., plan_version: _Optional[int] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ..., out_dir: _Optional[str] = ..., generation: _Optional[int] = ..., previous_plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ..., previous_ranks: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Recover(_message.Message):
    __slots__ = ("job_id", "generation", "ranks", "master_addr", "master_port", "plan_version", "plan")
    class RanksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    ranks: _containers.ScalarMap[str, int]
    master_addr: str
    master_port: int
    plan_version: int
    plan: _plan_pb2.Plan
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., ranks: _Optional[_Mapping[str, int]] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., plan_version: _Optional[int] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ...) -> None: ...

class PlanUpdate(_message.Message):
    __slots__ = ("job_id", "version", "plan")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    plan: _plan_pb2.Plan
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("straggle", "cancel", "stop_workers", "probe_links", "read_logs", "stop_logs", "ack_logs", "forget_job")
    STRAGGLE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    STOP_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PROBE_LINKS_FIELD_NUMBER: _ClassVar[int]
    READ_LOGS_FIELD_NUMBER: _ClassVar[int]
    STOP_LOGS_FIELD_NUMBER: _ClassVar[int]
    ACK_LOGS_FIELD_NUMBER: _ClassVar[int]
    FORGET_JOB_FIELD_NUMBER: _ClassVar[int]
    straggle: Straggle
    cancel: CancelJob
    stop_workers: StopWorkers
    probe_links: ProbeLinks
    read_logs: ReadLogs
    stop_logs: StopLogs
    ack_logs: AckLogs
    forget_job: ForgetJob
    def __init__(self, straggle: _Optional[_Union[Straggle, _Mapping]] = ..., cancel: _Optional[_Union[CancelJob, _Mapping]] = ..., stop_workers: _Optional[_Union[StopWorkers, _Mapping]] = ..., probe_links: _Optional[_Union[ProbeLinks, _Mapping]] = ..., read_logs: _Optional[_Union[ReadLogs, _Mapping]] = ..., stop_logs: _Optional[_Union[StopLogs, _Mapping]] = ..., ack_logs: _Optional[_Union[AckLogs, _Mapping]] = ..., forget_job: _Optional[_Union[ForgetJob, _Mapping]] = ...) -> None: ...

class ForgetJob(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ReadLogs(_message.Message):
    __slots__ = ("request_id", "job_id", "devices", "tail_bytes", "follow", "window")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    job_id: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    tail_bytes: int
    follow: bool
    window: int
    def __init__(self, request_id: _Optional[str] = ..., job_id: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., tail_bytes: _Optional[int] = ..., follow: _Optional[bool] = ..., window: _Optional[int] = ...) -> None: ...

class AckLogs(_message.Message):
    __slots__ = ("request_id", "chunks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunks: int
    def __init__(self, request_id: _Optional[str] = ..., chunks: _Optional[int] = ...) -> None: ...

class StopLogs(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("request_id", "device", "data", "end", "note")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    device: str
    data: bytes
    end: bool
    note: str
    def __init__(self, request_id: _Optional[str] = ..., device: _Optional[str] = ..., data: _Optional[bytes] = ..., end: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class ProbeLinks(_message.Message):
    __slots__ = ("job_id", "targets")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    targets: _containers.RepeatedCompositeFieldContainer[LinkTarget]
    def __init__(self, job_id: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[LinkTarget, _Mapping]]] = ...) -> None: ...

class LinkTarget(_message.Message):
    __slots__ = ("nic", "peer", "address", "port", "bytes")
    NIC_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    nic: str
    peer: str
    address: str
    port: int
    bytes: int
    def __init__(self, nic: _Optional[str] = ..., peer: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class LinkSample(_message.Message):
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

class StopWorkers(_message.Message):
    __slots__ = ("job_id", "devices")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ...) -> None: ...

class Straggle(_message.Message):
    __slots__ = ("device", "rate", "from_step")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    device: str
    rate: float
    from_step: int
    def __init__(self, device: _Optional[str] = ..., rate: _Optional[float] = ..., from_step: _Optional[int] = ...) -> None: ...

class CancelJob(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...
