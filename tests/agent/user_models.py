"""Users' models for tests/agent/test_custom.py: the example's parts, and ways to get the
protocol wrong. Imported by name (family custom's entry_point), in the test and its workers."""

from __future__ import annotations

import torch
import torch.nn as nn
from parallel_decoder import Head, ParallelBlock, build  # examples/models: test_custom puts it on the path


class UnsplitBlock(ParallelBlock):
    tp_splits = {}


class SplitHead(Head):
    tp_splits = {"out.weight": 0}


class NoSuchWeight(ParallelBlock):
    tp_splits = {"qkv.weight": 0}


class ScaledBlock(ParallelBlock):
    """A block with a buffer: a constant its constructor makes (docs/models.md)."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("scale", torch.full((config.hidden,), 0.5))

    def forward(self, x):
        return super().forward(x) * self.scale + x * (1 - self.scale)


class DrawnBlock(ScaledBlock):
    """A buffer drawn from the generator Drover seeds from (seed, part): the same in every build
    of the part, but not at seed 0 (a moved block's buffer was remade with seed 0)."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = 0.5 + 0.2 * torch.randn(config.hidden)


class WrongHead(Head):
    def forward(self, x):
        return self.norm(x)


def unsplit(config, part, seed):
    return UnsplitBlock(config) if isinstance(part, int) else build(config, part, seed)


def scaled(config, part, seed):
    return ScaledBlock(config) if isinstance(part, int) else build(config, part, seed)


def drawn(config, part, seed):
    return DrawnBlock(config) if isinstance(part, int) else build(config, part, seed)


def returns_a_tensor(config, part, seed):
    return torch.zeros(1)


def split_head(config, part, seed):
    return SplitHead(config) if part == "head" else build(config, part, seed)


def names_no_such_weight(config, part, seed):
    return NoSuchWeight(config) if isinstance(part, int) else build(config, part, seed)


def blocks_differ(config, part, seed):
    if isinstance(part, int) and part % 2:
        return nn.Linear(config.hidden, config.hidden)
    return build(config, part, seed)


def wrong_head(config, part, seed):
    return WrongHead(config) if part == "head" else build(config, part, seed)


def raises(config, part, seed):
    raise RuntimeError("out of ideas")
