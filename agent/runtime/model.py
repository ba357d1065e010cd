"""GPT- and Llama-style decoders for one device, in the spirit of nanoGPT,
and the user's own (family custom).

The model is an embedding, a list of blocks, and a head (final norm and an
untied LM head). `family` picks the parts: gpt (token + learned position
embedding, LayerNorm, multi-head attention, GELU MLP), llama (token
embedding only, RMSNorm, rotary positions, grouped-query attention with
kv_heads key/value heads, SwiGLU MLP), or custom: the parts the function
named by the model's `entry_point` builds (docs/models.md). Every part is
initialised from (seed, part) alone, so any process can build any block
identically and without the others. Nothing here knows about parallelism:
tensor parallelism is applied afterwards by `tensor_parallel.py`, which
slices the weights a block lists in `tp_splits` and swaps its `enter`/`exit`
hooks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec


@dataclass(frozen=True)
class DecoderConfig:
    layers: int = 4
    hidden: int = 64
    ffn_hidden: int = 256
    heads: int = 4
    seq_len: int = 32
    vocab: int = 128
    family: str = "gpt"  # gpt | llama
    kv_heads: int = 0  # key/value heads (llama); 0 means heads
    rope_theta: float = 10_000.0  # llama
    norm_eps: float = 1e-5
    entry_point: str = ""  # custom: "module:function" building each part

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * self.head_dim


EMBED, HEAD = "embed", "head"  # the parts that are not blocks


def part_seed(seed: int, part: int | str) -> int:
    """A generator seed for one part: block i, the embedding or the head."""
    index = {EMBED: -1, HEAD: -2}.get(part, part)
    return (seed * 1_000_003 + int(index) * 7_919 + 12_345) % (2**63)


def _init_(module: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.LayerNorm):
                sub.weight.fill_(1.0)
                sub.bias.zero_()
            elif isinstance(sub, RMSNorm):
                sub.weight.fill_(1.0)
            elif isinstance(sub, (nn.Linear, nn.Embedding)):
                sub.weight.copy_(torch.randn(sub.weight.shape, generator=generator) * 0.02)
    return module


class Embedding(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class Block(nn.Module):
    """Pre-norm attention and MLP. Linear layers carry no bias, so a
    row-parallel split needs no special case for it."""

    # Column-parallel (rows split: heads/t heads, ffn/t units) and row-parallel (columns split).
    tp_splits = {"q.weight": 0, "k.weight": 0, "v.weight": 0, "fc.weight": 0, "proj.weight": 1, "out.weight": 1}

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.q = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.fc = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)
        self.out = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)
        # Where a tensor-parallel group enters and leaves a split region.
        self.enter: nn.Module = nn.Identity()
        self.exit: nn.Module = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.enter(self.norm1(x))
        q, k, v = (lin(h).view(batch, seq, -1, self.cfg.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.exit(self.proj(y.transpose(1, 2).reshape(batch, seq, -1)))
        h = self.enter(self.norm2(x))
        return x + self.exit(self.out(F.gelu(self.fc(h))))


class Head(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


# -- llama ---------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / rms(x) * weight, no bias."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of x (batch, heads, seq, head_dim), rotate-half form.
    Computed on the fly: a buffer would not survive building on the meta device."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1).to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


class LlamaEmbedding(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm grouped-query attention (heads query heads, kv_heads key/value
    heads, each shared by heads/kv_heads consecutive query heads) with rotary
    positions, then a SwiGLU MLP. No biases; the same enter/exit hooks as Block."""

    tp_splits = {
        **{f"{name}.weight": 0 for name in ("q", "k", "v", "gate", "up")},  # heads/t, kv_heads/t, ffn/t
        **{f"{name}.weight": 1 for name in ("o", "down")},
    }

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.q = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.kv_dim, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.kv_dim, bias=False)
        self.o = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.gate = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)
        self.enter: nn.Module = nn.Identity()
        self.exit: nn.Module = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.enter(self.attn_norm(x))
        q, k, v = (lin(h).view(batch, seq, -1, self.cfg.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        q, k = rope(q, self.cfg.rope_theta), rope(k, self.cfg.rope_theta)
        # Local counts: under tensor parallelism a rank holds heads/t and kv_heads/t.
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.exit(self.o(y.transpose(1, 2).reshape(batch, seq, -1)))
        h = self.enter(self.mlp_norm(x))
        return x + self.exit(self.down(F.silu(self.gate(h)) * self.up(h)))


class LlamaHead(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


# -- parts of either family ------------------------------------------------------

FAMILIES: dict[str, tuple[type, type, type]] = {  # family -> (embedding, block, head)
    "gpt": (Embedding, Block, Head),
    "llama": (LlamaEmbedding, LlamaBlock, LlamaHead),
}


def config_of(spec: ModelSpec) -> DecoderConfig:
    if spec.family not in FAMILIES and spec.family != "custom":
        raise SpecError(spec.name, "family", spec.family, f"one of {', '.join(FAMILIES)}, custom")
    return DecoderConfig(
        spec.layers,
        spec.hidden,
        spec.ffn_hidden,
        spec.heads,
        spec.seq_len,
        spec.vocab,
        spec.family,
        spec.kv_heads,
        spec.rope_theta,
        spec.norm_eps,
        spec.entry_point,
    )


def build_part(cfg: DecoderConfig, part: int | str, seed: int, meta: bool = False) -> nn.Module:
    """Part `part` (EMBED, a block's index or HEAD) initialised from (seed, part) alone;
    `meta`: its shapes only, for a module to be filled later."""
    if cfg.family == "custom":
        return _build_custom(cfg, part, seed)
    embedding, block, head = FAMILIES[cfg.family]
    module = {EMBED: embedding, HEAD: head}.get(part, block)(cfg)
    return module if meta else _init_(module, part_seed(seed, part))


def entry_point(cfg: DecoderConfig):
    """The function a custom model's entry_point names (imported here, in the worker)."""
    module_name, _, function = cfg.entry_point.partition(":")
    try:
        builder = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise SpecError("model", "entry_point", cfg.entry_point, f"an importable function ({exc})") from None
    if not callable(builder):
        raise SpecError("model", "entry_point", cfg.entry_point, "a callable (module:function)")
    return builder


def _build_custom(cfg: DecoderConfig, part: int | str, seed: int) -> nn.Module:
    # The global generator, seeded from (seed, part) around the call, makes PyTorch's default
    # initialisation of the user's layers a function of (seed, part) too.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(part_seed(seed, part))
        module = entry_point(cfg)(cfg, part, seed)
    if not isinstance(module, nn.Module):
        allowed = f"a function returning a torch.nn.Module for part {part!r}, not {type(module).__name__}"
        raise SpecError("model", "entry_point", cfg.entry_point, allowed)
    return module


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over samples of each sample's mean token cross-entropy."""
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return per_token.view(targets.shape).mean(dim=1).sum()


class Decoder(nn.Module):
    """The whole model on one device, of either family: the reference for every parallel run."""

    def __init__(self, cfg: DecoderConfig, seed: int):
        super().__init__()
        self.embed = build_part(cfg, EMBED, seed)
        self.blocks = nn.ModuleList(build_part(cfg, i, seed) for i in range(cfg.layers))
        self.head = build_part(cfg, HEAD, seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def part_prefix(part: int | str) -> str:
    """Key prefix of a part in the full model's state_dict."""
    return f"blocks.{part}." if isinstance(part, int) else f"{part}."
