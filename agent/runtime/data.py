"""Deterministic synthetic data with structure a model can learn.

The tokens of step k, sample j are a pure function of (seed, k, j), so every
pipeline makes its own micro-batches without coordination. Each sample is an
arithmetic sequence modulo the vocabulary with a per-sample start and stride
(from a small set): after two tokens the rest is predictable, so the loss
falls as the model learns to continue the sequence.
"""

from __future__ import annotations

import torch

STRIDES = (1, 2, 3, 5, 7)


def sample_tokens(seed: int, step: int, sample: int, seq_len: int, vocab: int) -> torch.Tensor:
    """seq_len + 1 tokens: inputs are [:-1], targets [1:]."""
    g = torch.Generator().manual_seed((seed * 2_654_435_761 + step * 40_503 + sample * 97 + 1) % (2**63))
    start = int(torch.randint(vocab, (1,), generator=g))
    stride = STRIDES[int(torch.randint(len(STRIDES), (1,), generator=g))]
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def batch(
    seed: int, step: int, first_sample: int, count: int, seq_len: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of samples [first_sample, first_sample + count) of a step."""
    tokens = torch.stack([sample_tokens(seed, step, first_sample + j, seq_len, vocab) for j in range(count)])
    return tokens[:, :-1], tokens[:, 1:]
