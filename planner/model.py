"""The model: a decoder of `layers` identical blocks described by a few numbers
(section 2). `family` picks the block: gpt (LayerNorm, GELU MLP, multi-head
attention) or llama (RMSNorm, SwiGLU MLP, grouped-query attention, rotary
positions)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .spec_io import Fields, load_mapping


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

    def __post_init__(self):
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)

    def tp_divides(self, t: int) -> bool:
        """Rule 6: tensor parallelism splits whole heads, key/value heads and MLP columns."""
        return self.heads % t == 0 and self.ffn_hidden % t == 0 and self.kv_heads % t == 0

    @property
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
        h, f = self.hidden, self.ffn_hidden
        if self.family == "llama":  # q and o, k and v (kv_heads of heads), gate, up and down
            return 2 * h * h + 2 * h * (h * self.kv_heads // self.heads) + 3 * h * f
        return 4 * h * h + 2 * h * f

    @cached_property
    def embedding_params(self) -> int:  # PE (the head has its own, untied)
        return self.vocab * self.hidden

    @cached_property
    def activation_bytes(self) -> int:  # A
        return 2 * self.micro_batch * self.seq_len * self.hidden

    @cached_property
    def block_activation_memory(self) -> int:  # bytes per block per micro-batch in flight
        return 34 * self.micro_batch * self.seq_len * self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.block_params + 2 * self.embedding_params


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
}
FAMILIES = ("gpt", "llama")
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
    if family == "gpt" and kv_heads != heads:
        raise f.error("kv_heads", kv_heads, f"equal to heads ({heads}) for family gpt (multi-head attention)")
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
    return ModelSpec(
        name=f.string("name", Path(source).stem),
        layers=f.integer("layers", maximum=LIMITS["layers"]),
        hidden=hidden,
        ffn_hidden=f.integer("ffn_hidden", default_ffn_hidden(family, hidden), maximum=LIMITS["ffn_hidden"]),
        heads=heads,
        seq_len=f.integer("seq_len", maximum=LIMITS["seq_len"]),
        vocab=f.integer("vocab", maximum=LIMITS["vocab"]),
        global_batch=global_batch,
        micro_batch=micro_batch,
        mfu=f.number("mfu", 0.5, maximum=1.0),
        family=family,
        kv_heads=kv_heads,
        rope_theta=f.number("rope_theta", 10_000.0, maximum=1e9),
        norm_eps=f.number("norm_eps", 1e-5, maximum=0.1),
    )


def load_model(path: str | Path) -> ModelSpec:
    return model_from_dict(load_mapping(path, "model"), str(path))
