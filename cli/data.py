"""Commands over the user's data and weights: token shards, a tokenizer, and
exporting a trained model to Hugging Face."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def data() -> None:
    """Prepare token shards for training (data: DIR in a job file)."""


@data.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--tokenizer",
    "tokenizer_file",
    required=True,
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="A Hugging Face tokenizer.json.",
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), metavar="DIR", help="New directory.")
@click.option("--val-fraction", default=0.05, show_default=True, type=float, help="Share of documents for validation.")
@click.option("--shard-tokens", default=100_000_000, show_default=True, type=click.IntRange(min=1), help="Per file.")
@click.option("--text-field", default="text", show_default=True, help="The text of a .jsonl record.")
@click.option("--eos-token", help="Joins documents (default: <|endoftext|>, </s> or <eos>, if the tokenizer has one).")
def prepare(inputs, tokenizer_file, out_dir, val_fraction, shard_tokens, text_field, eos_token) -> None:
    """Tokenize text or JSONL files (or directories of them) into token shards."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from drover.agent.runtime.prepare import prepare as prepare_shards

    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        task = bar.add_task("tokenizing", total=None)
        meta = prepare_shards(
            list(inputs),
            tokenizer_file,
            out_dir,
            val_fraction,
            shard_tokens,
            text_field,
            eos_token,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    for split, entries in meta["splits"].items():
        tokens = sum(e["tokens"] for e in entries)
        click.echo(f"{split}: {tokens:,} tokens in {len(entries)} file(s)")
    click.echo(f"{meta['documents']:,} documents, vocab {meta['vocab']:,} ({meta['dtype']}) -> {out_dir}")
    if val_fraction and not meta["splits"].get("val"):  # found only when a job with eval failed
        click.echo(
            f"warning: no val split: every {round(1 / val_fraction)}th document is for validation, and there "
            f"are {meta['documents']:,} (a text file is one document; a .jsonl has one a line). A job with "
            "eval needs one.",
            err=True,
        )


@data.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--vocab", default=4096, show_default=True, type=click.IntRange(min=260, max=1 << 20), help="Tokens.")
@click.option("--out", "out_file", required=True, type=click.Path(path_type=Path), metavar="FILE")
@click.option("--text-field", default="text", show_default=True, help="The text of a .jsonl record.")
def tokenizer(inputs, vocab, out_file, text_field) -> None:
    """Train a byte-level BPE tokenizer.json on text files, for corpora without one."""
    from drover.agent.runtime.prepare import train_tokenizer

    size = train_tokenizer(list(inputs), vocab, out_file, text_field)
    click.echo(f"tokenizer of {size:,} tokens -> {out_file}")


@click.command()
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["hf"]), default="hf", show_default=True, help="Hugging Face.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), metavar="DIR")
def export(source: Path, fmt: str, out_dir: Path) -> None:
    """Export a trained model: SOURCE is a job's output directory (model.pt) or a
    checkpoint (or a directory of them: the newest)."""
    from drover.agent.runtime.checkpoint import gathered_model
    from drover.agent.runtime.hf import export as export_hf

    spec, state = gathered_model(source)
    export_hf(state, spec, out_dir)
    # Counted from the tensors written: the cost model's count (spec.parameters) leaves out the norms.
    count = sum(t.numel() for t in state.values())
    click.echo(f"{spec.name}: {count:,} parameters -> {out_dir} (AutoModelForCausalLM.from_pretrained)")
