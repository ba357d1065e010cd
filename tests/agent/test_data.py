"""Real text to token shards and into training: a BPE tokenizer trained on the
standard library's sources (every Python installation has them), shards
prepared by `drover data prepare`, windows that cover an epoch exactly once,
parallel training on the shards equal to the single-process run, a
validation loss that falls, and bad shards refused before anything is written."""

from __future__ import annotations

import json
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from drover.agent.runtime.data import Shards, permute
from drover.agent.runtime.launch import train_reference, train_workers
from drover.planner.errors import SpecError
from drover.planner.model import load_model
from drover.planner.training import Evaluation, Optimizer, Training

from support import DP2_PP2, MIXED_TP, ROOT, assert_matches_reference, losses, run_cli

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS = [STDLIB / "json", STDLIB / "email"]


@pytest.fixture(scope="module")
def spec():
    return replace(load_model(ROOT / "examples" / "models" / "text-llama.yaml"), hidden=64, ffn_hidden=128)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A data root holding tok.json and shards/, made through the CLI."""
    root = tmp_path_factory.mktemp("root")
    out = run_cli("data", "tokenizer", *map(str, CORPUS), "--vocab", "1024", "--out", str(root / "tok.json"))
    assert out.returncode == 0, out.stderr
    out = run_cli(
        "data", "prepare", *map(str, CORPUS), "--tokenizer", str(root / "tok.json"), "--out", str(root / "shards")
    )
    assert out.returncode == 0, out.stderr
    assert "train:" in out.stdout and "val:" in out.stdout and "warning" not in out.stderr
    return root


def test_a_corpus_of_one_document_is_warned_it_has_no_val_split(root, tmp_path):
    # A job with eval on it failed on the agent, with no word from prepare.
    one = tmp_path / "notes.txt"
    one.write_text("one long text file is one document\n" * 200)
    out = run_cli("data", "prepare", str(one), "--tokenizer", str(root / "tok.json"), "--out", str(tmp_path / "s"))
    assert out.returncode == 0 and "warning: no val split" in out.stderr and "are 1 " in out.stderr, out.stderr


def test_shards_hold_the_corpus_tokens(root):
    meta = json.loads((root / "shards" / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab"] == 1024
    tokenizer = Tokenizer.from_file(str(root / "tok.json"))
    ids = np.fromfile(root / "shards" / meta["splits"]["train"][0]["file"], dtype=np.uint16)
    assert len(ids) == meta["splits"]["train"][0]["tokens"] > 50_000
    first = sorted(p for p in CORPUS[0].rglob("*") if p.suffix == ".py")[0].read_text()
    end = int(np.argmax(ids == meta["eos"]))  # the first document ends at the first end-of-text token
    assert tokenizer.decode(ids[:end].tolist()) == first
    assert sum(e["tokens"] for e in meta["splits"]["val"]) > 0


@pytest.mark.parametrize("size", [1, 2, 3, 17, 64, 1000, 4097])
def test_an_epoch_reads_every_window_once(size):
    for key in (0, 12345):
        assert sorted(permute(i, size, key) for i in range(size)) == list(range(size))


def test_windows_are_a_pure_function_of_seed_step_sample(root, spec):
    shards = Shards(root / "shards", "train", spec.seq_len, spec.vocab, seed=3, global_batch=16)
    windows = [shards.window_of(step, j) for step in range(shards.windows // 16) for j in range(16)]
    assert len(set(windows)) == len(windows)  # within an epoch no window twice
    again = Shards(root / "shards", "train", spec.seq_len, spec.vocab, seed=3, global_batch=16)
    assert (again.batch(5, 4, 3)[0] == shards.batch(5, 4, 3)[0]).all()
    other_seed = Shards(root / "shards", "train", spec.seq_len, spec.vocab, seed=4, global_batch=16)
    assert not (other_seed.batch(5, 4, 3)[0] == shards.batch(5, 4, 3)[0]).all()


def test_parallel_training_on_shards_equals_the_reference_and_val_loss_falls(root, spec, tmp_path):
    evaluation = Evaluation(every_steps=8, samples=32)
    training = Training(24, 1, Optimizer(lr=1e-3, clip_norm=1.0), data="shards", eval=evaluation)
    train_reference(spec, training, tmp_path / "reference", data_root=root)
    train_workers(spec, 4, [(0, DP2_PP2), (12, MIXED_TP)], tmp_path / "run", training, data_root=root)
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [8, 16, 24] and evals[0]["samples"] == 32
    # The reference evaluates the same windows: its validation losses are the parallel run's.
    expected = [json.loads(line) for line in (tmp_path / "reference" / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e["samples"]) for e in expected] == [(e["step"], e["samples"]) for e in evals]
    assert np.allclose([e["val_loss"] for e in expected], [e["val_loss"] for e in evals], rtol=1e-5, atol=1e-6)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] < np.log(spec.vocab)
    assert losses(tmp_path / "run")[-1] < losses(tmp_path / "run")[0]


def test_bad_shards_are_refused_before_anything_is_written(root, spec, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    meta = json.loads((root / "shards" / "meta.json").read_text())
    (bad / "train-00000.bin").write_bytes((root / "shards" / "train-00000.bin").read_bytes())
    (bad / "meta.json").write_text(json.dumps(meta | {"dtype": "uint32"}))  # the wrong dtype for the file
    with pytest.raises(SpecError, match="tokens.*uint32"):
        Shards(bad, "train", spec.seq_len, spec.vocab, 0, 16)
    (bad / "meta.json").write_text(json.dumps(meta | {"vocab": 50_000}))  # a tokenizer bigger than the model
    with pytest.raises(SpecError, match="'vocab' = 50000.*model's vocab \\(1024\\)"):
        Shards(bad, "train", spec.seq_len, spec.vocab, 0, 16)

    job = tmp_path / "job.yaml"
    model = ROOT / "examples" / "models" / "text-llama.yaml"
    job.write_text(f"model: {model}\nsteps: 2\ndata: bad\n")
    out = run_cli("train", "--reference", "--job", str(job), "--data-root", str(tmp_path), "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and "'vocab' = 50000" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()
    job.write_text(f"model: {model}\nsteps: 2\ndata: ../outside\n")
    out = run_cli("train", "--reference", "--job", str(job), "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and "'data' = '../outside'" in out.stderr and "no '..'" in out.stderr


def test_a_token_past_the_shards_vocab_is_named_where_it_is_read(root, spec, tmp_path):
    # meta.json that understates the vocab: the token reached the embedding as an IndexError.
    bad = tmp_path / "understated"
    bad.mkdir()
    meta = json.loads((root / "shards" / "meta.json").read_text())
    tokens = np.fromfile(root / "shards" / "train-00000.bin", dtype=meta["dtype"])
    (bad / "train-00000.bin").write_bytes(tokens.tobytes())
    top = int(tokens.max())
    (bad / "meta.json").write_text(json.dumps(meta | {"vocab": top}))  # the largest token is one past it
    shards = Shards(bad, "train", spec.seq_len, spec.vocab, 0, 16)
    expected = f"train-00000.bin: field 'tokens\\[\\d+\\]' = {top}: below meta.json's vocab \\({top}\\)"
    with pytest.raises(SpecError, match=expected):
        for index in range(shards.windows):
            shards.window(index)
    (bad / "meta.json").write_text(json.dumps(meta | {"vocab": top + 1}))
    shards = Shards(bad, "train", spec.seq_len, spec.vocab, 0, 16)
    assert max(int(shards.window(i).max()) for i in range(shards.windows)) <= top  # no error at the true vocab


def test_evaluation_past_the_val_split_is_refused(root, spec):
    # It read the first windows again and reported them as more samples.
    from drover.agent.runtime.inputs import open_inputs

    windows = Shards(root / "shards", "val", spec.seq_len, spec.vocab, 0, spec.global_batch).windows
    most = windows // spec.global_batch * spec.global_batch
    assert most > 0
    for fits in (1, most):
        training = Training(2, 1, data="shards", eval=Evaluation(every_steps=1, samples=fits))
        assert open_inputs(spec, training, root).val.windows == windows
    training = Training(2, 1, data="shards", eval=Evaluation(every_steps=1, samples=most + 1))
    with pytest.raises(
        SpecError, match=f"'eval.samples' = {most + 1}: at most {most} \\(the val split holds {windows}"
    ):
        open_inputs(spec, training, root)
    small = replace(spec, global_batch=windows + 1)
    training = Training(2, 1, data="shards", eval=Evaluation(every_steps=1, samples=1))
    with pytest.raises(SpecError, match="larger --val-fraction"):
        open_inputs(small, training, root)


def test_a_corpus_without_text_is_refused(root, tmp_path):
    # An empty file made a tokenizer of the bytes alone, below --vocab, and a shard of one
    # end-of-text token, refused only at training time.
    from drover.agent.runtime.prepare import prepare, train_tokenizer

    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(SpecError, match="some text to learn tokens from"):
        train_tokenizer([empty], 300, tmp_path / "tok.json")
    with pytest.raises(SpecError, match="some text for the train split"):
        prepare([empty], root / "tok.json", tmp_path / "shards", 0.05)
    assert not (tmp_path / "tok.json").exists() and not (tmp_path / "shards").exists()
