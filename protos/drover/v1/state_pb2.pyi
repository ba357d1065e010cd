from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_COMPLETED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
JOB_STATE_PENDING: JobState

class Progress(_message.Message):
    __slots__ = ("step", "loss", "lr", "tokens_per_s", "samples_per_s", "val_loss", "val_step")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    samples_per_s: float
    val_loss: float
    val_step: int
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., lr: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., val_loss: _Optional[float] = ..., val_step: _Optional[int] = ...) -> None: ...
