"""The model on disk: per-shard checkpoints and the final gathered model.

Checkpoint and restart is the baseline that live switching replaces
(bench/migration.py): after the last step every part shard is written once,
as `PART-T-R.pt` (parameters and AdamW moments, on the CPU), by the lowest
rank holding it; new workers, possibly on a plan with other TP sizes, load
their shards from there, re-slicing when the size they need was not saved.

The final model (model.pt) is the whole model in one state dict with the
single-process model's names, gathered to rank 0 from the shards of the
smallest TP size holding each part, so a parallel run compares key by key
with the reference.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.plan import Plan

from . import layout
from .model import GPTConfig, part_prefix
from .parts import assemble
from .tensor_parallel import unshard


def save_checkpoint(
    directory: Path,
    rank: int,
    plan: Plan,
    ranks: dict[str, int],
    layers: int,
    parts: dict[layout.Part, torch.nn.Module],
    state: dict,
) -> None:
    """One file per part shard, written by the lowest rank holding it; every worker calls this."""
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("*.pt"):  # a reused directory must not mix runs
            old.unlink()
    dist.barrier()
    held = layout.holdings(plan, ranks, layers)
    for part, module in parts.items():
        shard_key = held[part][rank]
        if min(holder for holder, key in held[part].items() if key == shard_key) == rank:
            params = {n: p.data.cpu() for n, p in module.named_parameters()}
            moments = {n: {k: v.cpu() for k, v in by_key.items()} for n, by_key in state[part].items()}
            torch.save({"params": params, "state": moments}, directory / _checkpoint_name(part, *shard_key))
    dist.barrier()


def load_part(
    cfg: GPTConfig, directory: Path, part, t: int, r: int, device: torch.device
) -> tuple[torch.nn.Module, dict]:
    """Shard (t, r) of a part from a checkpoint, re-slicing if it was saved at another TP size."""

    def load(size: int, i: int) -> tuple[dict, dict]:
        saved = torch.load(directory / _checkpoint_name(part, size, i), map_location=device)
        return saved["params"], saved["state"]

    if (directory / _checkpoint_name(part, t, r)).exists():
        return assemble(cfg, part, t, r, {(t, r): load(t, r)}, device)
    sizes = [int(f.name.split("-")[-2]) for f in directory.glob(f"{part}-*-*.pt")]
    if not sizes:
        raise FileNotFoundError(f"checkpoint {directory} holds no shard of part {part!r}")
    saved_t = min(sizes)
    return assemble(cfg, part, t, r, {(saved_t, i): load(saved_t, i) for i in range(saved_t)}, device)


def _checkpoint_name(part, t: int, r: int) -> str:
    return f"{part}-{t}-{r}.pt"


def save_model(
    path: Path, rank: int, world: int, role: layout.Role | None, parts: dict[layout.Part, torch.nn.Module], layers: int
) -> None:
    """Gather every shard to rank 0 and write the full model there; every worker calls this
    (a worker with no role in the plan contributes nothing)."""
    mine = (
        {
            part: ((len(role.group), role.tp_rank), {n: p.data.cpu() for n, p in module.named_parameters()})
            for part, module in parts.items()
        }
        if role
        else {}
    )
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return
    shards: dict = defaultdict(dict)  # part -> (t, r) -> params
    for held in gathered:
        for part, (key, params) in held.items():
            shards[part].setdefault(key, params)
    state = {}
    for part in layout.part_order(layers):
        t = min(t for t, _ in shards[part])
        pieces = [shards[part][(t, r)] for r in range(t)]
        for name in pieces[0]:
            state[part_prefix(part) + name] = unshard([piece[name] for piece in pieces], part, name).clone()
    torch.save(state, path)
