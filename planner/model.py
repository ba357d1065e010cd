"""The model: a decoder of `layers` identical blocks described by a few numbers
(section 2). `family` picks the block: gpt (LayerNorm, GELU MLP, multi-head
attention), llama (RMSNorm, SwiGLU MLP, grouped-query attention, rotary
positions), or custom: the user's own parts, built by the Python function the
model file names (`entry_point`, docs/models.md). The planner imports no user
code: a custom model's parameter counts and tensor-parallel splits are counted
from its built parts on the user's side (agent/runtime/custom.py) and arrive
in the model as `counted`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .spec_io import MAX_INTEGER, Fields, load_mapping


@dataclass(frozen=True)
class Counted:
    """A custom model's parameters per part, and the sizes of the dimensions its block's
    weights split along under tensor parallelism (none: it runs with TP 1)."""

    block_params: int
    embedding_params: int
    head_params: int
    tp_split_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int  # L
    hidden: int  # h
    ffn_hidden: int  # f
    heads: int
    seq_len: int  # s
    vocab: int  # V
    global_batch: int  # B
    micro_batch: int  # b
    mfu: float = 0.5
    family: str = "gpt"
    kv_heads: int = 0  # key/value heads; 0 means heads (multi-head attention)
    # Numerics the cost model does not see, only the runtime (and Hugging Face configs).
    rope_theta: float = 10_000.0  # llama: base of the rotary frequencies
    norm_eps: float = 1e-5  # epsilon of LayerNorm (gpt) or RMSNorm (llama)
    entry_point: str = ""  # custom: "module:function" that builds each part
    # custom: what its built parts hold, counted where the user's code runs (never here):
    counted: Counted | None = None

    def __post_init__(self):
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)

    def tp_divides(self, t: int) -> bool:
        """Rule 6: tensor parallelism splits whole heads, key/value heads and MLP columns;
        a custom model's declared split dimensions too, and one that declares none runs unsplit."""
        rule6 = self.heads % t == 0 and self.ffn_hidden % t == 0 and self.kv_heads % t == 0
        if self.counted is not None:
            sizes = self.counted.tp_split_sizes
            return t == 1 or (rule6 and bool(sizes) and all(size % t == 0 for size in sizes))
        return rule6

    @cached_property  # read in the search's inner loops
    def micro_batches(self) -> int:  # M
        return self.global_batch // self.micro_batch

    @cached_property
    def block_flops(self) -> float:  # F: forward FLOP of one block per micro-batch
        b, s, h = self.micro_batch, self.seq_len, self.hidden
        return 2 * b * s * self.block_params + 4 * b * s * s * h

    @cached_property
    def head_flops(self) -> float:  # FH
        return 2 * self.micro_batch * self.seq_len * self.hidden * self.vocab

    @cached_property
    def block_params(self) -> int:  # P
        if self.counted is not None:
            return self.counted.block_params
        h, f = self.hidden, self.ffn_hidden
        if self.family == "llama":  # q and o, k and v (kv_heads of heads), gate, up and down
            return 2 * h * h + 2 * h * (h * self.kv_heads // self.heads) + 3 * h * f
        return 4 * h * h + 2 * h * f

    @cached_property
    def embedding_params(self) -> int:  # PE
        return self.counted.embedding_params if self.counted is not None else self.vocab * self.hidden

    @cached_property
    def head_params(self) -> int:  # PE too for gpt and llama: the head is untied, V x h
        return self.counted.head_params if self.counted is not None else self.vocab * self.hidden

    @cached_property
    def activation_bytes(self) -> int:  # A
        return 2 * self.micro_batch * self.seq_len * self.hidden

    @cached_property
    def block_activation_memory(self) -> int:  # bytes per block per micro-batch in flight
        return 34 * self.micro_batch * self.seq_len * self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.block_params + self.embedding_params + self.head_params


_KEYS = {
    "name",
    "family",
    "layers",
    "hidden",
    "ffn_hidden",
    "heads",
    "kv_heads",
    "seq_len",
    "vocab",
    "global_batch",
    "micro_batch",
    "mfu",
    "rope_theta",
    "norm_eps",
    "entry_point",
    "counted",
}
FAMILIES = ("gpt", "llama", "custom")
# module.path:function, importable where the workers run; never a file path.
ENTRY_POINT = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
COUNTED_KEYS = ("block_params", "embedding_params", "head_params", "tp_split_sizes")
# Far past any model trained today, and small enough that planning stays bounded: a model
# arrives from the network too.
LIMITS = {
    "layers": 1024,
    "hidden": 65536,
    "ffn_hidden": 262144,
    "heads": 1024,
    "seq_len": 1 << 20,
    "vocab": 1 << 22,
    "global_batch": 1 << 20,
}
MAX_MICRO_BATCHES = 1 << 16
# A GPU's share of its peak FLOP/s a block reaches: below 0.1% no job is worth planning, and at
# 5e-324 a block's time overflowed to infinity and planning divided by zero.
MIN_MFU = 1e-3


def default_ffn_hidden(family: str, hidden: int) -> int:
    if family == "llama":  # 2/3 of 4h, rounded up to a multiple of 256
        return 256 * -(-(8 * hidden // 3) // 256)
    return 4 * hidden


def model_from_dict(data: dict, source: str = "model") -> ModelSpec:
    f = Fields(data, source)
    f.reject_unknown(_KEYS)
    family = f.string("family", "gpt")
    if family not in FAMILIES:
        raise f.error("family", family, f"one of {', '.join(FAMILIES)}")
    hidden = f.integer("hidden", maximum=LIMITS["hidden"])
    heads = f.integer("heads", maximum=LIMITS["heads"])
    if hidden % heads:
        raise f.error("heads", heads, f"a divisor of hidden ({hidden})")
    kv_heads = f.integer("kv_heads", heads, maximum=heads)
    if family != "llama" and kv_heads != heads:
        raise f.error("kv_heads", kv_heads, f"equal to heads ({heads}) for family {family} (multi-head attention)")
    if heads % kv_heads:
        raise f.error("kv_heads", kv_heads, f"a divisor of heads ({heads})")
    global_batch = f.integer("global_batch", maximum=LIMITS["global_batch"])
    micro_batch = f.integer("micro_batch", maximum=global_batch)
    if global_batch % micro_batch:
        raise f.error("micro_batch", micro_batch, f"a divisor of global_batch ({global_batch})")
    if global_batch // micro_batch > MAX_MICRO_BATCHES:
        raise f.error(
            "micro_batch", micro_batch, f"at least global_batch / {MAX_MICRO_BATCHES} (micro-batches per step)"
        )
    name = f.name("name", f.string("name", Path(source).stem))
    entry_point, counted = "", None
    if family == "custom":
        entry_point = f.string("entry_point")
        if len(entry_point) > 200 or not ENTRY_POINT.fullmatch(entry_point):
            raise f.error("entry_point", entry_point[:200], "module.path:function (an importable Python name)")
        counted = counted_from(f)
    else:
        for key in ("entry_point", "counted"):
            if key in f.data:
                raise f.error(key, f.data[key], "only for family custom")
    return ModelSpec(
        name=name,
        layers=f.integer("layers", maximum=LIMITS["layers"]),
        hidden=hidden,
        ffn_hidden=f.integer("ffn_hidden", default_ffn_hidden(family, hidden), maximum=LIMITS["ffn_hidden"]),
        heads=heads,
        seq_len=f.integer("seq_len", maximum=LIMITS["seq_len"]),
        vocab=f.integer("vocab", maximum=LIMITS["vocab"]),
        global_batch=global_batch,
        micro_batch=micro_batch,
        mfu=f.number("mfu", 0.5, minimum=MIN_MFU, exclusive=False, maximum=1.0),
        family=family,
        kv_heads=kv_heads,
        rope_theta=f.number("rope_theta", 10_000.0, minimum=1.0, exclusive=False, maximum=1e9),
        norm_eps=f.number("norm_eps", 1e-5, minimum=1e-12, exclusive=False, maximum=0.1),
        entry_point=entry_point,
        counted=counted,
    )


def counted_from(f: Fields) -> Counted:
    if "counted" not in f.data:
        allowed = "the counts drover's CLI writes from the built parts (submit the model file through drover)"
        raise f.error("counted", "(missing)", allowed)
    c = f.mapping("counted")
    c.reject_unknown(set(COUNTED_KEYS))
    limit = MAX_INTEGER
    sizes = c.items("tp_split_sizes", [])
    if len(sizes) > 64 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= limit for n in sizes):
        raise c.error("tp_split_sizes", sizes[:64], f"at most 64 sizes, each from 1 to {limit}")
    return Counted(
        c.integer("block_params", maximum=limit),
        c.integer("embedding_params", maximum=limit),
        c.integer("head_params", maximum=limit),
        tuple(sizes),
    )


def load_model(path: str | Path) -> ModelSpec:
    return model_from_dict(load_mapping(path, "model"), str(path))
