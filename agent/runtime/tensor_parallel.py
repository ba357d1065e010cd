"""Megatron-style tensor parallelism applied to a one-device block.

A block says how its weights split by a class attribute, `tp_splits`
(parameter name -> dimension); one that declares none runs with TP 1.

gpt: q, k, v and fc are split by output rows (column-parallel: each rank
keeps heads/t heads and ffn/t units), proj and out by input columns
(row-parallel: partial sums all-reduced). llama: q, k, v split by heads too
(heads/t query heads and kv_heads/t key/value heads, so each rank's query
heads find their shared key/value heads locally), gate and up by rows, o and
down by columns. `enter` is identity forward and all-reduce backward; `exit`
is all-reduce forward and identity backward. Norms are replicated. Shard
(t, r) of a tensor is always the same slice of the full tensor, which is
what lets a block move between groups of different sizes. A user's block
(docs/models.md) follows the same contract.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn


def split_dim(module: nn.Module, name: str) -> int | None:
    """The dimension the module's parameter `name` is split along in a TP group; None:
    replicated (norms, and everything in embeddings and heads, which declare no splits)."""
    return getattr(module, "tp_splits", {}).get(name)


def shard(tensor: torch.Tensor, dim: int | None, t: int, r: int) -> torch.Tensor:
    if t == 1 or dim is None:
        return tensor
    return tensor.chunk(t, dim=dim)[r].clone()  # a copy: a view would keep the whole tensor alive


def unshard(shards: list[torch.Tensor], dim: int | None) -> torch.Tensor:
    """The full tensor from the shards of ranks 0..t-1."""
    if len(shards) == 1 or dim is None:
        return shards[0]
    return torch.cat(shards, dim=dim)


def wait_unwatched(work, group=None) -> None:
    """Wait for a collective or point-to-point `work` as gloo does: until it ends or fails, or
    its timeout. A worker with an agent waits with its WorldWatch.wait instead, which gives up
    once its world has lost a member."""
    work.wait()


class WaitClock:
    """Seconds spent in tensor-parallel all-reduces, so a worker can report
    its own compute apart from waiting for a slow partner in its group. One
    per worker, handed to its blocks by join_group; `wait(work, group)` waits
    for each all-reduce (see wait_unwatched)."""

    def __init__(self, wait=wait_unwatched):
        self.seconds, self.wait = 0.0, wait

    def all_reduce(self, tensor, group) -> None:
        start = time.perf_counter()
        self.wait(dist.all_reduce(tensor, group=group, async_op=True), group)
        self.seconds += time.perf_counter() - start


class _Enter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, clock):
        ctx.group, ctx.clock = group, clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.clock.all_reduce(grad, ctx.group)
        return grad, None, None


class _Exit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, clock):
        x = x.contiguous().clone()
        clock.all_reduce(x, group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class Enter(nn.Module):
    def __init__(self, group, clock: WaitClock):
        super().__init__()
        self.group, self.clock = group, clock

    def forward(self, x):
        return _Enter.apply(x, self.group, self.clock)


class Exit(nn.Module):
    def __init__(self, group, clock: WaitClock):
        super().__init__()
        self.group, self.clock = group, clock

    def forward(self, x):
        return _Exit.apply(x, self.group, self.clock)


def shard_block(block: nn.Module, t: int, r: int) -> nn.Module:
    """Keep shard r of t of the block's split weights (the group's hooks come with join_group)."""
    if t == 1:
        return block
    with torch.no_grad():
        for name, param in list(block.named_parameters()):
            dim = split_dim(block, name)
            if dim is not None:
                module_name, attr = name.rsplit(".", 1) if "." in name else ("", name)
                setattr(block.get_submodule(module_name), attr, nn.Parameter(shard(param.data, dim, t, r)))
    return block


def join_group(block: nn.Module, group, clock: WaitClock) -> None:
    """Route the block's split regions through the group's all-reduces, timed by `clock`."""
    block.enter, block.exit = Enter(group, clock), Exit(group, clock)
