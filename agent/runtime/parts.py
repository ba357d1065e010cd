"""A part's shard as a module plus AdamW state: built empty, packed into one
flat buffer for a peer, unpacked without copying, and assembled from the
shards someone else held (a migration or a checkpoint), re-sliced when the
TP size changed."""

from __future__ import annotations

import copy
import functools

import torch
from torch.overrides import TorchFunctionMode

from .model import EMBED, HEAD, DecoderConfig, build_part
from .optim import STATE_KEYS
from .tensor_parallel import shard, shard_block, split_dim, unshard


class _NoInit(TorchFunctionMode):
    """torch.nn.init's functions do nothing: on the meta device they would only run
    torch._refs, whose first use imports torch._dynamo (about a second per process)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@functools.cache
def _meta_module(cfg: DecoderConfig, kind: str) -> torch.nn.Module:
    # Built once per kind and copied: blocks are alike (the cost model's L identical blocks),
    # so block 0 stands for all.
    with torch.device("meta"), _NoInit():
        return build_part(cfg, 0 if kind == "block" else kind, seed=0, meta=True)


def meta_part(cfg: DecoderConfig, part) -> torch.nn.Module:
    """The part's module on the meta device (shapes, names and splits; no storage). Shared: do not change."""
    return _meta_module(cfg, "block" if isinstance(part, int) else part)


def warm_up(cfg: DecoderConfig) -> None:
    for part in (EMBED, 0, HEAD):
        meta_part(cfg, part)


def empty_part(cfg: DecoderConfig, part, t: int, r: int, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """An uninitialised module of the part's shard (t, r), to be filled by a transfer: its
    parameters, that is. Buffers are not moved (docs/models.md: constants its constructor
    makes), so a part with buffers is built once for real, from the job's `seed` as the first
    plan built it, to make them: to_empty left them as whatever memory held (a custom model's
    loss went wrong or NaN after a switch), and seed 0 remade a buffer drawn from the seeded
    generator otherwise than the job had it. (A template whose parameters alone are read may
    take any seed.)"""
    module = copy.deepcopy(meta_part(cfg, part)).to_empty(device=device)
    if next(module.buffers(), None) is not None:
        made = dict(build_part(cfg, part, seed=seed).named_buffers())
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                buffer.copy_(made[name])
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
            out[name] = buf[offset : offset + numel].view(shape)
            offset += numel
        return out

    params = take()
    moments = [take() for _ in STATE_KEYS]
    state = {name: {k: m[name] for k, m in zip(STATE_KEYS, moments)} for name, _, _ in shapes}
    return params, state


def assemble(
    cfg: DecoderConfig, part, t: int, r: int, pieces: dict, device: torch.device, seed: int
) -> tuple[torch.nn.Module, dict]:
    """A part's module and optimizer state for shard (t, r) from shards held elsewhere:
    pieces is {(t, r): (params, state)}, either shard (t, r) itself or all shards of one TP size;
    its buffers made from the job's seed."""
    module = empty_part(cfg, part, t, r, device, seed)
    if (t, r) in pieces:
        params, state = pieces[(t, r)]
    else:  # TP size changed: rebuild the full tensors, keep our slice
        t_old = next(iter(pieces))[0]
        ordered = [pieces[(t_old, i)] for i in range(t_old)]

        def reslice(pieces, name):  # a copy: replicated tensors would otherwise pin a whole received buffer
            dim = split_dim(module, name)
            return shard(unshard(pieces, dim), dim, t, r).clone()

        params = {n: reslice([o[0][n] for o in ordered], n) for n in ordered[0][0]}
        state = {n: {k: reslice([o[1][n][k] for o in ordered], n) for k in STATE_KEYS} for n in ordered[0][0]}
    for name, p in module.named_parameters():
        p.data = params[name]  # adopt the received tensors rather than copy them
    return module, state
