"""The model: a GPT-style decoder described by a few numbers (section 2)."""

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

    @property
    def micro_batches(self) -> int:  # M
        return self.global_batch // self.micro_batch

    @cached_property
    def block_flops(self) -> float:  # F: forward FLOP of one block per micro-batch
        b, s, h, f = self.micro_batch, self.seq_len, self.hidden, self.ffn_hidden
        return 2 * b * s * (4 * h * h + 2 * h * f) + 4 * b * s * s * h

    @cached_property
    def head_flops(self) -> float:  # FH
        return 2 * self.micro_batch * self.seq_len * self.hidden * self.vocab

    @cached_property
    def block_params(self) -> int:  # P
        h = self.hidden
        return 4 * h * h + 2 * h * self.ffn_hidden

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


_KEYS = {"name", "layers", "hidden", "ffn_hidden", "heads", "seq_len", "vocab",
         "global_batch", "micro_batch", "mfu"}


def model_from_dict(data: dict, source: str = "model") -> ModelSpec:
    f = Fields(data, source)
    f.reject_unknown(_KEYS)
    hidden = f.integer("hidden")
    heads = f.integer("heads")
    if hidden % heads:
        raise f.error("heads", heads, f"a divisor of hidden ({hidden})")
    global_batch = f.integer("global_batch")
    micro_batch = f.integer("micro_batch")
    if global_batch % micro_batch:
        raise f.error("micro_batch", micro_batch, f"a divisor of global_batch ({global_batch})")
    return ModelSpec(
        name=f.string("name", Path(source).stem),
        layers=f.integer("layers"),
        hidden=hidden,
        ffn_hidden=f.integer("ffn_hidden", 4 * hidden),
        heads=heads,
        seq_len=f.integer("seq_len"),
        vocab=f.integer("vocab"),
        global_batch=global_batch,
        micro_batch=micro_batch,
        mfu=f.number("mfu", 0.5, maximum=1.0),
    )


def load_model(path: str | Path) -> ModelSpec:
    return model_from_dict(load_mapping(path, "model"), str(path))
