"""A custom model's counts: what its entry point builds, measured on the meta device.

The planner imports no user code, so a model file of family custom reaches it
with `counted` (parameters per part, and the sizes of the dimensions its
block splits along under tensor parallelism) filled in here, where the user's
code may run: by the CLI when it reads the model file, and again by each
worker before training, which refuses a model whose parts differ from what
was planned. docs/models.md is the user's side of this protocol.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from drover.planner.errors import SpecError
from drover.planner.model import Counted, ModelSpec, model_from_dict

from .model import EMBED, HEAD, DecoderConfig, build_part, config_of

_PLACEHOLDER = {"block_params": 1, "embedding_params": 1, "head_params": 1}
PART_NAME = re.compile(r"[A-Za-z_][\w.]*")


def with_counts(model_data: dict, source: str) -> dict:
    """The model file's fields with `counted` written from its built parts; other families as given."""
    if model_data.get("family") != "custom":
        return model_data
    data = {k: v for k, v in model_data.items() if k != "counted"}
    spec = model_from_dict(data | {"counted": _PLACEHOLDER}, source)  # every other field checked first
    return data | {"counted": _as_dict(count(spec, source))}


def check_counts(spec: ModelSpec) -> None:
    """Refuse a custom model whose entry point here builds other parts than were planned
    (another version of the user's code on this node)."""
    if spec.counted is None:
        return
    here = count(spec, spec.name)
    if here != spec.counted:
        raise SpecError(
            spec.name, "counted", _as_dict(spec.counted), f"what {spec.entry_point} builds here: {_as_dict(here)}"
        )


def count(spec: ModelSpec, source: str) -> Counted:
    cfg = config_of(spec)

    def fail(problem: str, allowed: str) -> SpecError:
        return SpecError(source, "entry_point", spec.entry_point, f"{allowed}, but {problem}")

    try:
        with torch.device("meta"):
            embed, head = build_part(cfg, EMBED, 0), build_part(cfg, HEAD, 0)
            blocks = [build_part(cfg, i, 0) for i in range(spec.layers)]
    except SpecError as exc:  # the entry point does not import: say which file named it
        raise SpecError(source, exc.field, exc.value, exc.allowed) from None
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported as theirs
        raise fail(_failure("building the parts on the meta device", exc), "a function building every part") from None
    for part, module in ((EMBED, embed), (HEAD, head)):
        if getattr(module, "tp_splits", None):
            raise fail(f"{part} declares tp_splits", "tp_splits on blocks only: embeddings and heads are replicated")
    shapes = _shapes(blocks[0])
    for i, block in enumerate(blocks[1:], 1):
        if _shapes(block) != shapes:
            raise fail(f"block {i} differs from block 0", "blocks with the same parameter names and shapes")
    splits = getattr(blocks[0], "tp_splits", {}) or {}
    sizes = []
    for name, dim in splits.items():
        if name not in shapes:
            raise fail(f"tp_splits names {name!r}", f"names of the block's parameters ({', '.join(shapes)})")
        if not isinstance(dim, int) or not 0 <= dim < len(shapes[name]):
            raise fail(f"tp_splits[{name!r}] = {dim!r}", f"a dimension of {name} (0 to {len(shapes[name]) - 1})")
        sizes.append(shapes[name][dim])
    _check_shapes(cfg, embed, blocks[0], head, fail)
    return Counted(_params(blocks[0]), _params(embed), _params(head), tuple(sizes))


def _check_shapes(cfg: DecoderConfig, embed, block, head, fail) -> None:
    """One micro-batch through the parts on the meta device: the shapes the runtime relies on."""
    tokens = torch.zeros(2, cfg.seq_len, dtype=torch.long, device="meta")
    expected = {EMBED: (2, cfg.seq_len, cfg.hidden), "block": (2, cfg.seq_len, cfg.hidden)}
    expected[HEAD] = (2, cfg.seq_len, cfg.vocab)
    x = tokens
    for part, module in ((EMBED, embed), ("block", block), (HEAD, head)):
        try:
            x = module(x)
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported as theirs
            raise fail(_failure(f"{part} forward on the meta device", exc), "parts that run") from None
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != expected[part]:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise fail(f"{part} returns {got}", f"a tensor of shape {expected[part]} (batch, seq_len, ...)")


def _failure(what: str, exc: Exception) -> str:
    return f"{what}: {type(exc).__name__}: {str(exc)[:200]}"


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _as_dict(counted: Counted) -> dict:
    return {
        "block_params": counted.block_params,
        "embedding_params": counted.embedding_params,
        "head_params": counted.head_params,
        "tp_split_sizes": list(counted.tp_split_sizes),
    }
