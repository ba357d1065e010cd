"""Where a step's tokens come from: synthetic sequences or token shards.

Sample j of step k reads a window that is a pure function of (seed, k, j),
so every pipeline makes its own micro-batches without coordination and any
plan sees the same data.

Synthetic: each sample is an arithmetic sequence modulo the vocabulary with
a per-sample start and stride (from a small set); after two tokens the rest
is predictable, so the loss falls as the model learns to continue it.

Token shards (`drover data prepare`): flat little-endian token ids, uint16
or uint32, in files listed by a `meta.json`, nanoGPT's layout. A window is
seq_len + 1 tokens at a stride of seq_len inside one file. Training sample g
= step * global_batch + j reads window perm_e(g mod W) of epoch e = g div W,
where W is the number of windows and perm_e a pseudo-random permutation of
them (a Feistel network keyed by seed and epoch): an epoch covers every
window exactly once, and nothing is held in memory per window. Validation
reads the val split's windows in order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from drover.planner.errors import SpecError
from drover.planner.spec_io import load_mapping

STRIDES = (1, 2, 3, 5, 7)
FORMAT = "drover-tokens"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SPLITS = ("train", "val")


def sample_tokens(seed: int, step: int, sample: int, seq_len: int, vocab: int) -> torch.Tensor:
    """seq_len + 1 synthetic tokens: inputs are [:-1], targets [1:]."""
    g = torch.Generator().manual_seed((seed * 2_654_435_761 + step * 40_503 + sample * 97 + 1) % (2**63))
    start = int(torch.randint(vocab, (1,), generator=g))
    stride = STRIDES[int(torch.randint(len(STRIDES), (1,), generator=g))]
    return (start + stride * torch.arange(seq_len + 1)) % vocab


@dataclass(frozen=True)
class Synthetic:
    seed: int
    seq_len: int
    vocab: int

    def batch(self, step: int, first_sample: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of samples [first_sample, first_sample + count) of a step."""
        tokens = torch.stack(
            [sample_tokens(self.seed, step, first_sample + j, self.seq_len, self.vocab) for j in range(count)]
        )
        return tokens[:, :-1], tokens[:, 1:]


def _mix(x: int) -> int:
    """splitmix64's finaliser: a fast, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def permute(index: int, size: int, key: int) -> int:
    """A bijection of [0, size) chosen by key: a 4-round Feistel network over the smallest
    even number of bits that covers size, walking the cycle until it lands inside."""
    half = max(1, (max(size - 1, 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = index
    while True:
        left, right = x >> half, x & mask
        for round_ in range(4):
            left, right = right, left ^ (_mix(key * 31 + round_ * 0x632BE5AB + right) & mask)
        x = (left << half) | right
        if x < size:
            return x


class Shards:
    """One split of a token-shard directory, memory-mapped."""

    def __init__(self, directory: str | Path, split: str, seq_len: int, vocab: int, seed: int, global_batch: int):
        self.directory, self.split = Path(directory), split
        self.seq_len, self.seed, self.global_batch = seq_len, seed, global_batch
        meta = read_meta(self.directory)
        source = str(self.directory / "meta.json")
        if meta["vocab"] > vocab:
            raise SpecError(source, "vocab", meta["vocab"], f"at most the model's vocab ({vocab})")
        dtype = DTYPES[meta["dtype"]]
        self.vocab = meta["vocab"]
        self.files, self.paths, counts = [], [], []
        for entry in meta["splits"].get(split, []):
            path = self.directory / entry["file"]
            size = path.stat().st_size if path.exists() else -1
            if size != entry["tokens"] * np.dtype(dtype).itemsize:
                raise SpecError(
                    str(path), "tokens", entry["tokens"], f"what the file holds as {meta['dtype']} ({size} bytes)"
                )
            windows = max(0, (entry["tokens"] - 1) // seq_len)
            if windows:
                self.files.append(np.memmap(path, dtype=dtype, mode="r"))
                self.paths.append(path)
                counts.append(windows)
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)
        self.windows = self.starts[-1]
        if not self.windows:
            raise SpecError(source, f"splits.{split}", meta["splits"].get(split), f"at least {seq_len + 1} tokens")

    def window(self, index: int) -> torch.Tensor:
        f = bisect.bisect_right(self.starts, index) - 1
        offset = (index - self.starts[f]) * self.seq_len
        tokens = self.files[f][offset : offset + self.seq_len + 1]
        # Checked as read, for the cost of a max over one window: a corpus scanned up front costs a
        # read of all of it, and a token past the vocab failed as an IndexError deep in the model.
        top = int(tokens.max())
        if top >= self.vocab:
            at = offset + int(np.argmax(tokens >= self.vocab))
            raise SpecError(
                str(self.paths[f]), f"tokens[{at}]", top, f"below meta.json's vocab ({self.vocab}); rebuild the shards"
            )
        return torch.from_numpy(tokens.astype(np.int64))

    def window_of(self, step: int, sample: int) -> int:
        g = step * self.global_batch + sample
        if self.split != "train":
            return g % self.windows
        epoch, position = divmod(g, self.windows)
        return permute(position, self.windows, _mix(self.seed * 1_000_003 + epoch))

    def batch(self, step: int, first_sample: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.stack([self.window(self.window_of(step, first_sample + j)) for j in range(count)])
        return tokens[:, :-1], tokens[:, 1:]


def read_meta(directory: Path) -> dict:
    """meta.json of a shard directory, checked: a clear error names the field."""
    path = directory / "meta.json"
    source = str(path)
    meta = load_mapping(path, "token-shard meta.json")
    if meta.get("format") != FORMAT:
        raise SpecError(source, "format", meta.get("format"), repr(FORMAT))
    if meta.get("dtype") not in DTYPES:
        raise SpecError(source, "dtype", meta.get("dtype"), f"one of {', '.join(DTYPES)}")
    vocab = meta.get("vocab")
    if not isinstance(vocab, int) or vocab < 1 or vocab > np.iinfo(DTYPES[meta["dtype"]]).max + 1:
        raise SpecError(source, "vocab", vocab, f"a positive integer that {meta['dtype']} can hold")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not set(splits) <= set(SPLITS) or "train" not in splits:
        raise SpecError(source, "splits", splits, "a mapping of train (and val) to lists of {file, tokens}")
    for split, entries in splits.items():
        for entry in entries if isinstance(entries, list) else [entries]:
            ok = isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("tokens"), int)
            if not ok or Path(entry["file"]).name != entry["file"] or entry["tokens"] < 0:
                raise SpecError(source, f"splits.{split}", entry, "{file: a name inside the directory, tokens: >= 0}")
    return meta
