from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelFamily(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_FAMILY_UNSPECIFIED: _ClassVar[ModelFamily]
    MODEL_FAMILY_GPT: _ClassVar[ModelFamily]
    MODEL_FAMILY_LLAMA: _ClassVar[ModelFamily]
    MODEL_FAMILY_CUSTOM: _ClassVar[ModelFamily]

class Decay(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECAY_UNSPECIFIED: _ClassVar[Decay]
    DECAY_CONSTANT: _ClassVar[Decay]
    DECAY_COSINE: _ClassVar[Decay]

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    PRECISION_FP32: _ClassVar[Precision]
    PRECISION_BF16: _ClassVar[Precision]
MODEL_FAMILY_UNSPECIFIED: ModelFamily
MODEL_FAMILY_GPT: ModelFamily
MODEL_FAMILY_LLAMA: ModelFamily
MODEL_FAMILY_CUSTOM: ModelFamily
DECAY_UNSPECIFIED: Decay
DECAY_CONSTANT: Decay
DECAY_COSINE: Decay
PRECISION_UNSPECIFIED: Precision
PRECISION_FP32: Precision
PRECISION_BF16: Precision

class JobSpec(_message.Message):
    __slots__ = ("name", "model", "steps", "seed", "optimizer", "schedule", "data", "init", "checkpoint", "eval", "precision", "resume", "tensorboard", "resources", "recoveries")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    TENSORBOARD_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: ModelSpec
    steps: int
    seed: int
    optimizer: Optimizer
    schedule: Schedule
    data: str
    init: str
    checkpoint: Checkpointing
    eval: Evaluation
    precision: Precision
    resume: str
    tensorboard: bool
    resources: Resources
    recoveries: Recoveries
    def __init__(self, name: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., steps: _Optional[int] = ..., seed: _Optional[int] = ..., optimizer: _Optional[_Union[Optimizer, _Mapping]] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., data: _Optional[str] = ..., init: _Optional[str] = ..., checkpoint: _Optional[_Union[Checkpointing, _Mapping]] = ..., eval: _Optional[_Union[Evaluation, _Mapping]] = ..., precision: _Optional[_Union[Precision, str]] = ..., resume: _Optional[str] = ..., tensorboard: _Optional[bool] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., recoveries: _Optional[_Union[Recoveries, _Mapping]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "family", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "seq_len", "vocab", "global_batch", "micro_batch", "mfu", "rope_theta", "norm_eps", "entry_point", "counted")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    FFN_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    MFU_FIELD_NUMBER: _ClassVar[int]
    ROPE_THETA_FIELD_NUMBER: _ClassVar[int]
    NORM_EPS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINT_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    family: ModelFamily
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    seq_len: int
    vocab: int
    global_batch: int
    micro_batch: int
    mfu: float
    rope_theta: float
    norm_eps: float
    entry_point: str
    counted: Counted
    def __init__(self, name: _Optional[str] = ..., family: _Optional[_Union[ModelFamily, str]] = ..., layers: _Optional[int] = ..., hidden: _Optional[int] = ..., ffn_hidden: _Optional[int] = ..., heads: _Optional[int] = ..., kv_heads: _Optional[int] = ..., seq_len: _Optional[int] = ..., vocab: _Optional[int] = ..., global_batch: _Optional[int] = ..., micro_batch: _Optional[int] = ..., mfu: _Optional[float] = ..., rope_theta: _Optional[float] = ..., norm_eps: _Optional[float] = ..., entry_point: _Optional[str] = ..., counted: _Optional[_Union[Counted, _Mapping]] = ...) -> None: ...

class Counted(_message.Message):
    __slots__ = ("block_params", "embedding_params", "head_params", "tp_split_sizes")
    BLOCK_PARAMS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    HEAD_PARAMS_FIELD_NUMBER: _ClassVar[int]
    TP_SPLIT_SIZES_FIELD_NUMBER: _ClassVar[int]
    block_params: int
    embedding_params: int
    head_params: int
    tp_split_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_params: _Optional[int] = ..., embedding_params: _Optional[int] = ..., head_params: _Optional[int] = ..., tp_split_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class Optimizer(_message.Message):
    __slots__ = ("lr", "betas", "eps", "weight_decay", "clip_norm")
    LR_FIELD_NUMBER: _ClassVar[int]
    BETAS_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    lr: float
    betas: _containers.RepeatedScalarFieldContainer[float]
    eps: float
    weight_decay: float
    clip_norm: float
    def __init__(self, lr: _Optional[float] = ..., betas: _Optional[_Iterable[float]] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., clip_norm: _Optional[float] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("warmup_steps", "decay", "min_lr")
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_FIELD_NUMBER: _ClassVar[int]
    warmup_steps: int
    decay: Decay
    min_lr: float
    def __init__(self, warmup_steps: _Optional[int] = ..., decay: _Optional[_Union[Decay, str]] = ..., min_lr: _Optional[float] = ...) -> None: ...

class Checkpointing(_message.Message):
    __slots__ = ("dir", "every_steps", "keep")
    DIR_FIELD_NUMBER: _ClassVar[int]
    EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    dir: str
    every_steps: int
    keep: int
    def __init__(self, dir: _Optional[str] = ..., every_steps: _Optional[int] = ..., keep: _Optional[int] = ...) -> None: ...

class Evaluation(_message.Message):
    __slots__ = ("every_steps", "samples")
    EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    every_steps: int
    samples: int
    def __init__(self, every_steps: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("nodes", "devices")
    NODES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    devices: int
    def __init__(self, nodes: _Optional[int] = ..., devices: _Optional[int] = ...) -> None: ...

class Recoveries(_message.Message):
    __slots__ = ("max", "within_steps")
    MAX_FIELD_NUMBER: _ClassVar[int]
    WITHIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    max: int
    within_steps: int
    def __init__(self, max: _Optional[int] = ..., within_steps: _Optional[int] = ...) -> None: ...
