"""The model on disk: sharded checkpoints that resume under any plan, and the
final gathered model.

Checkpoints are `torch.distributed.checkpoint` (DCP) directories. Each part
is written by one of the groups holding it (the smallest TP size, then the
lowest rank), every member its own shard: a tensor split by tensor
parallelism is saved as a DTensor over that group, so the checkpoint records
where each slice belongs, and a resume under another plan reads exactly the
slices its new shards need, whatever the TP sizes. AdamW's moments are saved
beside their parameters. `drover.json` holds the step, the model and the job.

A checkpoint is complete or invisible: the workers write into
`.step-K.partial/`, and only after DCP's metadata is written does rank 0
write `drover.json` and rename the directory to `step-K` (an atomic rename
on one file system). A save killed midway leaves a `.partial` directory that
resume never reads and the next save removes. The newest `keep` complete
checkpoints stay. `drover.json` also lists every file's size, so a checkpoint
damaged afterwards (a file truncated or lost) is refused up front by name
rather than failing inside each worker's read.

The final model (model.pt) is the whole model in one state dict with the
single-process model's names, gathered to rank 0 from the shards of the
smallest TP size holding each part, so a parallel run compares key by key
with the reference.

DCP and DTensor are imported where a checkpoint is written or read: about 1.6 s of imports
that every agent's worker launcher paid before, for every job, checkpointing or not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import warnings
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec, model_from_dict
from drover.planner.plan import Plan

from . import layout
from .model import config_of, part_prefix
from .optim import STATE_KEYS
from .parts import empty_part, meta_part
from .tensor_parallel import split_dim, unshard, wait_unwatched

STEP_DIR = re.compile(r"step-(\d{8,})")
META = "drover.json"
ARCHITECTURE = ("family", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "entry_point")


def _dcp():
    """torch.distributed.checkpoint, imported where a checkpoint is written or read."""
    import torch.distributed.checkpoint

    return torch.distributed.checkpoint


def savers(plan: Plan, ranks: dict[str, int]) -> dict[layout.Part, tuple[int, ...]]:
    """part -> the TP group that writes it: the smallest TP size, then the lowest rank."""
    out: dict[layout.Part, tuple[int, ...]] = {}
    for role in layout.roles(plan, ranks).values():
        for part in role.parts:
            if part not in out or (len(role.group), min(role.group)) < (len(out[part]), min(out[part])):
                out[part] = role.group
    return out


def _entries(parts: dict, state: dict, role: layout.Role | None, tp_pg, device: torch.device, only=None) -> dict:
    """This worker's tensors under their checkpoint keys, split ones as DTensors over its TP
    group; `only` limits the parts. The tensors are the live ones: a load writes into them."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    out = {}
    if role is None:
        return out
    t = len(role.group)
    mesh = DeviceMesh.from_group(tp_pg, device.type) if t > 1 else None
    for part, module in parts.items():
        if only is not None and part not in only:
            continue
        for name, p in module.named_parameters():
            key = part_prefix(part) + name
            tensors = {key: p.data} | {f"optim.{key}.{k}": state[part][name][k] for k in STATE_KEYS}
            dim = split_dim(module, name)
            for k, tensor in tensors.items():
                if dim is not None and t > 1:
                    shape = list(tensor.shape)
                    shape[dim] *= t
                    full = torch.Size(shape)
                    stride = torch.empty(full, device="meta").stride()
                    tensor = DTensor.from_local(tensor, mesh, [Shard(dim)], run_check=False, shape=full, stride=stride)
                out[k] = tensor
    return out


def save_checkpoint(
    root: Path,
    step: int,
    keep: int,
    rank: int,
    plan: Plan,
    ranks: dict[str, int],
    parts,
    state,
    tp_pg,
    meta,
    device,
    wait=wait_unwatched,
) -> Path:
    """Checkpoint `step` (steps done) under root; every worker calls this. `wait(work)` waits
    for its barriers (a worker's WorldWatch.wait)."""
    final, partial = root / f"step-{step:08d}", root / f".step-{step:08d}.partial"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step-*.partial"):  # a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
    wait(dist.barrier(async_op=True))
    roles = layout.roles(plan, ranks)
    role = roles.get(rank)
    mine = {part for part, group in savers(plan, ranks).items() if rank in group}
    _dcp().save(_entries(parts, state, role, tp_pg, device, only=mine), checkpoint_id=str(partial))
    if rank == 0:
        meta_path = partial / META
        # DCP's save returns on rank 0 once every rank's files and the metadata are written.
        files = {p.name: p.stat().st_size for p in sorted(partial.iterdir()) if p.is_file()}
        with open(meta_path, "w") as f:
            json.dump(meta | {"step": step, "files": files}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, final)
        _fsync_dir(root)
        complete = sorted(complete_checkpoints(root))
        for old in complete[:-keep] if keep else []:
            shutil.rmtree(old, ignore_errors=True)
    wait(dist.barrier(async_op=True))
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first (partial ones are never listed)."""
    found = [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name) and (p / META).exists()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))


def find_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the newest complete one under a directory of them."""
    if (path / META).exists():
        return path
    found = complete_checkpoints(path)
    if not found:
        raise SpecError(str(path), "resume", str(path), "a checkpoint directory, or one holding step-K checkpoints")
    return found[-1]


def read_meta(checkpoint: Path) -> dict:
    """drover.json of a complete checkpoint, and its files checked against the sizes it lists
    (checkpoints written before the list was kept are taken as they are)."""
    path = checkpoint / META
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), "drover.json", "unreadable", f"the JSON a checkpoint save writes ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or not isinstance(meta.get("model"), dict):
        raise SpecError(str(path), "drover.json", "damaged", "a mapping with the step and the model, as a save writes")
    for name, size in (meta.get("files") or {}).items():
        if Path(name).name != name or name in ("", ".", ".."):  # never a path out of the checkpoint
            raise SpecError(str(path), "files", name, "file names inside the checkpoint, as a save writes")
        file = checkpoint / name
        found = file.stat().st_size if file.is_file() else None
        if found != size:
            raise SpecError(str(file), "size", "missing" if found is None else found, f"{size} bytes, as it was saved")
    return meta


def check_resumable(checkpoint: Path, spec: ModelSpec, steps: int) -> int:
    """The step a checkpoint resumes at; refuses one of another model or past the job's end."""
    meta = read_meta(checkpoint)
    saved = meta.get("model", {})
    saved.setdefault("entry_point", "")  # gpt and llama write none
    for key in ARCHITECTURE:
        if saved.get(key) != getattr(spec, key):
            raise SpecError(
                str(checkpoint / META), f"model.{key}", saved.get(key), f"{getattr(spec, key)!r}, as the job's model"
            )
    step = int(meta["step"])
    if step >= steps:  # at the last step, nothing is left to train (it crashed writing the model)
        raise SpecError(
            str(checkpoint / META),
            "step",
            step,
            f"a step below the job's steps ({steps}); this checkpoint ends a run, so nothing is left to train: "
            "raise steps to train on (drover export reads a finished run's checkpoint)",
        )
    return step


def load_checkpoint(
    checkpoint: Path, rank: int, plan: Plan, ranks: dict[str, int], parts, state, tp_pg, device
) -> None:
    """Fill this worker's parts and moments, in place, from a checkpoint of any layout;
    every worker calls this."""
    role = layout.roles(plan, ranks).get(rank)
    _dcp().load(_entries(parts, state, role, tp_pg, device), checkpoint_id=str(checkpoint))


def model_meta(spec: ModelSpec) -> dict:
    """The model as model_from_dict reads it back (a custom model with its counts)."""
    meta = dataclasses.asdict(spec)
    if spec.counted is None:
        del meta["entry_point"], meta["counted"]
    return meta


def save_model(out: Path, rank: int, world: int, role: layout.Role | None, parts, layers: int, spec: ModelSpec) -> None:
    """Gather every shard to rank 0 and write model.pt (and model.json, its model) there;
    every worker calls this (a worker with no role in the plan contributes nothing)."""
    mine = (
        {
            # state_dict: the parameters and the persistent buffers, as the reference's model.pt has
            part: ((len(role.group), role.tp_rank), {n: v.cpu() for n, v in module.state_dict().items()})
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
    full, cfg = {}, config_of(spec)
    for part in layout.part_order(layers):
        t = min(t for t, _ in shards[part])
        pieces = [shards[part][(t, r)] for r in range(t)]
        template = meta_part(cfg, part)
        for name in pieces[0]:
            full[part_prefix(part) + name] = unshard([p[name] for p in pieces], split_dim(template, name)).clone()
    torch.save(full, out / "model.pt")
    (out / "model.json").write_text(json.dumps(model_meta(spec)))


def gathered_model(path: Path) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """The whole model, in the single-process names, from a job's output (model.pt and
    model.json), a checkpoint, or a directory of checkpoints (the newest); no process group."""
    if (path / "model.pt").exists() and (path / "model.json").exists():
        meta = json.loads((path / "model.json").read_text())
        return model_from_dict(meta, str(path / "model.json")), torch.load(path / "model.pt", weights_only=True)
    checkpoint = find_checkpoint(path)
    spec = model_from_dict(read_meta(checkpoint)["model"], str(checkpoint / META))
    cfg, state = config_of(spec), {}
    for part in layout.part_order(spec.layers):
        module = empty_part(cfg, part, 1, 0, torch.device("cpu"))
        state |= {part_prefix(part) + n: p.data for n, p in module.named_parameters()}
    with warnings.catch_warnings():  # one process, on purpose: no process group to warn about
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        _dcp().load(state, checkpoint_id=str(checkpoint), no_dist=True)
    return spec, state
