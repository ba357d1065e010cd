"""A part's parameters and AdamW state as one flat buffer, for moving it to a peer."""

from __future__ import annotations

import copy
import functools

import torch

from .model import EMBED, HEAD, Block, Embedding, GPTConfig, Head
from .optim import STATE_KEYS
from .tensor_parallel import shard_block


@functools.cache
def _meta_module(cfg: GPTConfig, kind: type) -> torch.nn.Module:
    # Building on the meta device skips initialisation, but its first use of
    # each layer type costs about a second: build once per kind and copy.
    with torch.device("meta"):
        return kind(cfg)


def warm_up(cfg: GPTConfig) -> None:
    for kind in (Embedding, Block, Head):
        _meta_module(cfg, kind)


def empty_part(cfg: GPTConfig, part, t: int = 1, r: int = 0, device="cpu") -> torch.nn.Module:
    """An uninitialised module of the part's shard (t, r), to be filled by a transfer."""
    kind = {EMBED: Embedding, HEAD: Head}.get(part, Block)
    module = copy.deepcopy(_meta_module(cfg, kind)).to_empty(device=device)
    if isinstance(part, int):
        shard_block(module, t, r)
    return module


def pack(module: torch.nn.Module, state: dict) -> torch.Tensor:
    """Parameters, then Adam's first moments, then second moments, flat."""
    names = [n for n, _ in module.named_parameters()]
    tensors = [p.data for _, p in module.named_parameters()]
    tensors += [state[n][k] for k in STATE_KEYS for n in names]
    return torch.cat([t.flatten() for t in tensors])


def unpack(template: torch.nn.Module, buf: torch.Tensor) -> tuple[dict, dict]:
    """(params, state) keyed by parameter name, shaped like the template's:
    views into `buf`, which they keep alive, so nothing is copied."""
    shapes = [(n, p.shape, p.numel()) for n, p in template.named_parameters()]
    offset = 0

    def take():
        nonlocal offset
        out = {}
        for name, shape, numel in shapes:
            out[name] = buf[offset:offset + numel].view(shape)
            offset += numel
        return out
    params = take()
    moments = [take() for _ in STATE_KEYS]
    state = {name: {k: m[name] for k, m in zip(STATE_KEYS, moments)} for name, _, _ in shapes}
    return params, state
