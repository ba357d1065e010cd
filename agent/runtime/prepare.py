"""Text to token shards (`drover data prepare`), and a small BPE tokenizer
for machines without a downloaded one (`drover data tokenizer`).

Each input file is read as text (a directory gives its .txt, .md, .rst, .py
and .jsonl files): `.jsonl` files give one document per line
(its `text` field), other files are one document each. Every k-th document
goes to the validation split (k = 1 / val_fraction), so the split is
deterministic and spread over the corpus. Documents are tokenized in batches
by a Hugging Face `tokenizers` file, joined with the end-of-text token, and
written as flat uint16 (or uint32, for vocabularies over 65,536) files of at
most `shard_tokens` tokens, with `meta.json` listing them (data.py reads
them). The output appears complete or not at all: it is written beside the
target and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from drover.planner.errors import SpecError

from .data import FORMAT

# What a directory contributes: text a corpus is made of, not compiled or binary files beside it.
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".jsonl")
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
BATCH_DOCUMENTS = 256


def expand(paths: list[Path]) -> list[Path]:
    """Files, with directories replaced by the text files under them (TEXT_SUFFIXES), sorted."""
    out = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES))
        elif path.is_file():
            out.append(path)
        else:
            raise SpecError(str(path), "input", str(path), "an existing file or directory")
    return out


def documents(files: list[Path], text_field: str = "text") -> Iterator[str]:
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(str(file), "(file)", f"byte {exc.start}", "UTF-8 text") from None
        if file.suffix != ".jsonl":
            yield text
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SpecError(f"{file}:{number}", "(line)", line[:40], "one JSON object per line") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise SpecError(f"{file}:{number}", text_field, str(record)[:40], "a string field in every record")
            yield record[text_field]


def _eos_id(tokenizer, eos_token: str | None) -> int | None:
    for token in [eos_token] if eos_token else EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    if eos_token:
        raise SpecError("--eos-token", "eos_token", eos_token, "a token of the tokenizer's vocabulary")
    return None


class _SplitWriter:
    def __init__(self, out: Path, split: str, dtype, shard_tokens: int):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
        self.entries: list[dict] = []
        self.file = None

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            if self.file is None or self.entries[-1]["tokens"] == self.shard_tokens:
                self._next()
            room = self.shard_tokens - self.entries[-1]["tokens"]
            chunk, ids = ids[:room], ids[room:]
            self.file.write(chunk.astype(self.dtype).tobytes())
            self.entries[-1]["tokens"] += len(chunk)

    def _next(self) -> None:
        self.close()
        name = f"{self.split}-{len(self.entries):05d}.bin"
        self.file = open(self.out / name, "wb")
        self.entries.append({"file": name, "tokens": 0})

    def close(self) -> None:
        if self.file:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None


def prepare(
    inputs: list[Path],
    tokenizer_file: Path,
    out: Path,
    val_fraction: float = 0.05,
    shard_tokens: int = 100_000_000,
    text_field: str = "text",
    eos_token: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Tokenize `inputs` into shards under `out`; returns meta.json's content.
    progress(done_bytes, total_bytes) is called as files are read."""
    from tokenizers import Tokenizer

    if out.exists() and any(out.iterdir()):
        raise SpecError(str(out), "--out", str(out), "a new or empty directory (shards are never mixed)")
    if not 0 <= val_fraction < 1:
        raise SpecError("--val-fraction", "val_fraction", val_fraction, "a number >= 0 and < 1")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # tokenizers raises plain Exceptions for missing and malformed files
        raise SpecError(str(tokenizer_file), "--tokenizer", str(tokenizer_file), f"a tokenizer.json ({exc})") from None
    files = expand(inputs)
    if not files:
        raise SpecError("inputs", "inputs", [str(p) for p in inputs], "at least one file")
    vocab = tokenizer.get_vocab_size()
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    eos = _eos_id(tokenizer, eos_token)
    every = round(1 / val_fraction) if val_fraction else 0
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    writers = {split: _SplitWriter(partial, split, dtype, shard_tokens) for split in ("train", "val")}
    total_bytes, done_bytes = sum(f.stat().st_size for f in files), 0
    try:
        batch: list[str] = []
        index = 0

        def flush() -> None:
            nonlocal index
            for encoding in tokenizer.encode_batch(batch):
                ids = encoding.ids + ([eos] if eos is not None else [])
                split = "val" if every and index % every == every - 1 else "train"
                writers[split].write(np.asarray(ids, dtype=np.int64))
                index += 1
            batch.clear()

        text = False
        for file in files:
            for document in documents([file], text_field):
                text = text or not document.isspace() and document != ""
                batch.append(document)
                if len(batch) == BATCH_DOCUMENTS:
                    flush()
            done_bytes += file.stat().st_size
            if progress:
                progress(done_bytes, total_bytes)
        flush()
        for writer in writers.values():
            writer.close()
        meta = {
            "format": FORMAT,
            "version": 1,
            "dtype": np.dtype(dtype).name,
            "vocab": vocab,
            "eos": eos,
            "tokenizer": str(tokenizer_file.name),
            "documents": index,
            "splits": {split: w.entries for split, w in writers.items() if w.entries},
        }
        if "train" not in meta["splits"] or not text:  # empty files made a shard of end-of-text tokens
            raise SpecError("inputs", "inputs", [str(p) for p in inputs], "some text for the train split")
        (partial / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(partial, out)
    except BaseException:
        for writer in writers.values():
            writer.close()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta


def train_tokenizer(inputs: list[Path], vocab: int, out: Path, text_field: str = "text") -> int:
    """A byte-level BPE tokenizer of `vocab` tokens (with <|endoftext|>) trained on the inputs;
    returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [0]  # characters of text seen, besides white space

    def counted():
        for document in documents(expand(inputs), text_field):
            texts[0] += len(document.strip())
            yield document

    tokenizer.train_from_iterator(counted(), trainer=trainer)
    if not texts[0]:  # it made a tokenizer of the bytes alone, below --vocab, without a word
        raise SpecError("inputs", "inputs", [str(p) for p in inputs], "files with some text to learn tokens from")
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    return tokenizer.get_vocab_size()
