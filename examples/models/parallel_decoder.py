"""A decoder of our own, trained by Drover through its model protocol (docs/models.md).

PaLM-style parallel blocks: attention and the MLP both read the same
normalised input and their outputs are added, x + attn(norm(x)) + mlp(norm(x)),
with a squared-ReLU MLP. Nothing here imports Drover. Drover calls
`build(config, part, seed)` for each part it needs: "embed", a block's index,
or "head". It seeds PyTorch's generator from (seed, part) around the call, so
the default initialisation below is already a function of (seed, part).

Tensor parallelism: a block lists in `tp_splits` which weights split along
which dimension (0: output rows, column-parallel; 1: input columns,
row-parallel), and routes its split region through `self.enter` and
`self.exit`, which Drover replaces with the group's collectives (identity on
one device). Here one enter and one exit cover both branches: the two
row-parallel outputs are summed before the single all-reduce. The block
counts its local heads from the tensor shapes, so a rank holding heads/t
heads runs the same code.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Embedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.seq_len, config.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


class ParallelBlock(nn.Module):
    tp_splits = {
        "q.weight": 0,
        "k.weight": 0,
        "v.weight": 0,
        "up.weight": 0,
        "attn_out.weight": 1,
        "down.weight": 1,
    }

    def __init__(self, config):
        super().__init__()
        hidden, self.head_dim = config.hidden, config.hidden // config.heads
        self.norm = nn.LayerNorm(hidden, eps=config.norm_eps)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.attn_out = nn.Linear(hidden, hidden, bias=False)  # row-parallel: no bias (it would be added t times)
        self.up = nn.Linear(hidden, config.ffn_hidden, bias=False)
        self.down = nn.Linear(config.ffn_hidden, hidden, bias=False)
        self.enter: nn.Module = nn.Identity()
        self.exit: nn.Module = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.enter(self.norm(x))
        q, k, v = (lin(h).view(batch, seq, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, -1)
        return x + self.exit(self.attn_out(y) + self.down(F.relu(self.up(h)).square()))


class Head(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.out = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build(config, part, seed: int) -> nn.Module:
    """The module of one part: "embed", "head", or block `part` (an int). `seed` is there
    for an initialisation of one's own; PyTorch's default one is seeded already."""
    if part == "embed":
        return Embedding(config)
    if part == "head":
        return Head(config)
    return ParallelBlock(config)
