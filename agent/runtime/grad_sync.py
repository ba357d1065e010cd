"""Summing gradients across the pipelines that hold each part.

Pipelines may split the blocks differently, so the sync is not per stage but
per run of parts with the same holders (layout.sync_groups): one all-reduce
of one flat buffer per group. Two modes:

shard: every holder has the same TP size, so devices holding the same shard
  sum it directly.
full: the holders' TP sizes differ, so shards do not line up; every device
  contributes a full-size buffer with its shard in place and zeros elsewhere
  (a tensor replicated in a TP group counted once, by its member 0), and
  keeps its own slice of the sum.

Either way each shard ends with exactly the gradient the full tensor would
have in single-process training, which AdamW (element-wise) then applies.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import layout
from .tensor_parallel import shard, split_dim, wait_unwatched


def sync_gradients(
    sync_groups: list[tuple[layout.SyncGroup, object]],
    parts: dict[layout.Part, torch.nn.Module],
    role: layout.Role,
    device: torch.device,
    wait=wait_unwatched,
) -> None:
    """Sum each part's gradient over the pipelines that hold it; sync_groups pairs each of
    this worker's sync groups with its process group. `wait(work, group)` waits for each
    all-reduce (a worker's WorldWatch.wait: given up once its world is over)."""
    for group, pg in sync_groups:
        params = [(part, name, p) for part in group.parts for name, p in parts[part].named_parameters()]
        if group.mode == "shard":
            flat = torch.cat([p.grad.flatten() for _, _, p in params])
            wait(dist.all_reduce(flat, group=pg, async_op=True), pg)
            offset = 0
            for _, _, p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            continue
        # Holders differ in TP size: sum full-size gradients, own shard in place.
        t, r = len(role.group), role.tp_rank
        fulls = []
        for part, name, p in params:
            dim = split_dim(parts[part], name)
            full = torch.zeros(_full_shape(p.shape, dim, t), device=device)
            if dim is not None:
                full.narrow(dim, r * p.shape[dim], p.shape[dim]).copy_(p.grad)
            elif r == 0:  # replicated in the TP group: count it once
                full.copy_(p.grad)
            fulls.append(full)
        flat = torch.cat([f.flatten() for f in fulls])
        wait(dist.all_reduce(flat, group=pg, async_op=True), pg)
        offset = 0
        for (part, name, p), full in zip(params, fulls):
            summed = flat[offset : offset + full.numel()].view_as(full)
            p.grad.copy_(shard(summed, split_dim(parts[part], name), t, r))
            offset += full.numel()


def _full_shape(shape: torch.Size, dim: int | None, t: int) -> list[int]:
    full = list(shape)
    if dim is not None:
        full[dim] *= t
    return full
