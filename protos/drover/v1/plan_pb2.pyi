from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stage(_message.Message):
    __slots__ = ("devices", "layers")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[str]
    layers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, devices: _Optional[_Iterable[str]] = ..., layers: _Optional[_Iterable[int]] = ...) -> None: ...

class Pipeline(_message.Message):
    __slots__ = ("micro_batches", "stages")
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    micro_batches: int
    stages: _containers.RepeatedCompositeFieldContainer[Stage]
    def __init__(self, micro_batches: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[Stage, _Mapping]]] = ...) -> None: ...

class Predicted(_message.Message):
    __slots__ = ("step_time_s", "samples_per_s", "ideal_samples_per_s")
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    IDEAL_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    step_time_s: float
    samples_per_s: float
    ideal_samples_per_s: float
    def __init__(self, step_time_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., ideal_samples_per_s: _Optional[float] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("strategy", "global_batch", "micro_batch", "pipelines", "removed", "predicted")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    global_batch: int
    micro_batch: int
    pipelines: _containers.RepeatedCompositeFieldContainer[Pipeline]
    removed: _containers.RepeatedScalarFieldContainer[str]
    predicted: Predicted
    def __init__(self, strategy: _Optional[str] = ..., global_batch: _Optional[int] = ..., micro_batch: _Optional[int] = ..., pipelines: _Optional[_Iterable[_Union[Pipeline, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ..., predicted: _Optional[_Union[Predicted, _Mapping]] = ...) -> None: ...
