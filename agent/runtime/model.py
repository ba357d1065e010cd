"""A GPT-style decoder for one device, in the spirit of nanoGPT.

The model is a token + position embedding, a list of blocks, and a head
(final LayerNorm and an untied LM head). Every part is initialised from
(seed, part) alone, so any process can build any block identically and
without the others. Nothing here knows about parallelism: tensor
parallelism is applied afterwards by `tensor_parallel.py`, which slices the
weights and swaps the `enter`/`exit` hooks of a block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 4
    hidden: int = 64
    ffn_hidden: int = 256
    heads: int = 4
    seq_len: int = 32
    vocab: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


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
            elif isinstance(sub, (nn.Linear, nn.Embedding)):
                sub.weight.copy_(torch.randn(sub.weight.shape, generator=generator) * 0.02)
    return module


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class Block(nn.Module):
    """Pre-norm attention and MLP. Linear layers carry no bias, so a
    row-parallel split needs no special case for it."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.q = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.norm2 = nn.LayerNorm(cfg.hidden)
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
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_part(cfg: GPTConfig, part: int | str, seed: int) -> nn.Module:
    module = {EMBED: Embedding, HEAD: Head}.get(part, Block)(cfg)
    return _init_(module, part_seed(seed, part))


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over samples of each sample's mean token cross-entropy."""
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return per_token.view(targets.shape).mean(dim=1).sum()


class GPT(nn.Module):
    """The whole model on one device: the reference for every parallel run."""

    def __init__(self, cfg: GPTConfig, seed: int):
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
