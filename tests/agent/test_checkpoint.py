"""Checkpoints and resume: a job killed mid-run (SIGKILL, whatever it was doing)
resumes from its newest complete checkpoint under another plan and another
number of workers, and ends equal to a run that was never interrupted; a
checkpoint that was being written is never picked up; a checkpoint of another
model is refused; a checkpoint exports to Hugging Face."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from drover.agent.runtime.checkpoint import check_resumable, complete_checkpoints, find_checkpoint, gathered_model
from drover.agent.runtime.launch import train_reference, train_workers
from drover.planner import Cluster, Gpu, Node
from drover.planner.errors import SpecError
from drover.planner.model import load_model
from drover.planner.plan import plan_from_dict
from drover.planner.training import Checkpointing, Optimizer, Schedule, Training

from support import DP2_PP2, ROOT, local_plan, losses, run_cli, trace

TINY_LLAMA = ROOT / "examples" / "models" / "tiny-llama.yaml"
STEPS, SEED = 8, 5
TRAINING = Training(STEPS, SEED, Optimizer(clip_norm=0.5), Schedule(2, "cosine", 1e-4))
TP2_TWO_WORKERS = local_plan((8, [([0, 1], (0, 4))]))  # one pipeline, one TP-2 stage, on 2 workers
# Two nodes of two devices, paced by GPUs fast enough that the real computation sets the time.
TWO_NODES = Cluster("two-nodes", tuple(Node(name, 2, Gpu("fast", 1000.0, 80.0), 100.0, 100.0) for name in "ab"))


def plan_on(*pipelines):
    """Pipelines of (device, blocks) stages, four micro-batches each."""
    return plan_from_dict(
        {
            "strategy": "test",
            "global_batch": 16,
            "micro_batch": 2,
            "pipelines": [
                {"micro_batches": 4, "stages": [{"devices": [d], "layers": list(span)} for d, span in stages]}
                for stages in pipelines
            ],
        }
    )


# Each pipeline on a node of its own: every part has a copy on a and on b.
PER_NODE = plan_on([("a/0", (0, 2)), ("a/1", (2, 4))], [("b/0", (0, 2)), ("b/1", (2, 4))])
# Each pipeline across both: blocks 0-1 (and the embedding) on a only, 2-3 (and the head) on b only.
ACROSS = plan_on([("a/0", (0, 2)), ("b/0", (2, 4))], [("a/1", (0, 2)), ("b/1", (2, 4))])


@pytest.fixture(scope="module")
def spec():
    return load_model(TINY_LLAMA)


@pytest.fixture(scope="module")
def reference(spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    train_reference(spec, TRAINING, out)
    return out


def test_a_killed_job_resumes_under_another_plan_and_worker_count_exactly(spec, reference, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        json.dumps(
            {"model": str(TINY_LLAMA), **TRAINING.to_dict(), "checkpoint": {"dir": "ckpt", "every_steps": 2, "keep": 2}}
        )
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(DP2_PP2.to_dict()))
    common = ["--job", str(job), "--data-root", str(tmp_path)]
    # Slowed so that it is still running when the first checkpoint lands; then killed outright.
    cmd = [sys.executable, "-m", "drover.cli", "train", *common, "--workers", "4", "--plan", str(plan)]
    first = subprocess.Popen(
        cmd + ["--slow", "local/0=4@0", "--out", str(tmp_path / "first")], start_new_session=True, cwd=ROOT
    )
    deadline = time.monotonic() + 120
    while not complete_checkpoints(tmp_path / "ckpt") and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    saved = find_checkpoint(tmp_path / "ckpt")
    done = check_resumable(saved, spec, STEPS)
    assert 2 <= done < STEPS, "the run should have been killed before its end"

    resumed = replace(TRAINING, resume="ckpt")
    train_workers(spec, 2, [(0, TP2_TWO_WORKERS)], tmp_path / "second", resumed, data_root=tmp_path)
    assert [t["step"] for t in trace(tmp_path / "second")] == list(range(done, STEPS))
    want, got = torch.load(reference / "model.pt"), torch.load(tmp_path / "second" / "model.pt")
    for key in want:
        assert ((got[key] - want[key]).norm() / want[key].norm()).item() < 1e-4, key
    stitched = losses(tmp_path / "first")[:done] + losses(tmp_path / "second")
    assert stitched == pytest.approx(losses(reference), rel=1e-5)


def test_a_switch_that_leaves_parts_on_one_node_is_checkpointed_at_once(spec, tmp_path):
    training = replace(TRAINING, checkpoint=Checkpointing("ckpt", every_steps=4, keep=10))
    plans = [(0, PER_NODE), (2, ACROSS), (4, PER_NODE), (5, ACROSS), (6, ACROSS)]
    train_workers(spec, 4, plans, tmp_path / "run", training, data_root=tmp_path, paced=TWO_NODES)
    saved = [int(path.name.split("-")[1]) for path in complete_checkpoints(tmp_path / "ckpt")]
    # At each switch to ACROSS from PER_NODE, before its first step (2 and 5); ACROSS again, or
    # PER_NODE, asks for none; and the periodic ones (4, 8).
    assert saved == [2, 4, 5, STEPS]
    assert [t["step"] for t in trace(tmp_path / "run")] == list(range(STEPS))


def test_a_half_written_checkpoint_is_never_resumed(spec, tmp_path):
    training = replace(TRAINING, steps=4, checkpoint=Checkpointing("ckpt", every_steps=2, keep=5))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run", training, data_root=tmp_path)
    assert [p.name for p in complete_checkpoints(tmp_path / "ckpt")] == ["step-00000002", "step-00000004"]
    # What a save killed midway leaves: its partial directory, with or without DCP's files in it.
    newest = tmp_path / "ckpt" / "step-00000004"
    partial = tmp_path / "ckpt" / ".step-00000006.partial"
    partial.mkdir()
    for f in newest.iterdir():
        if f.name != "drover.json":
            (partial / f.name).write_bytes(f.read_bytes()[:10])
    assert find_checkpoint(tmp_path / "ckpt") == newest
    # The next save clears it; keep bounds how many stay.
    again = replace(training, steps=STEPS, resume="ckpt", checkpoint=Checkpointing("ckpt", every_steps=2, keep=2))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run2", again, data_root=tmp_path)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000006", "step-00000008"]


def test_a_checkpoint_of_another_model_is_refused(spec, tmp_path):
    training = replace(TRAINING, steps=2, checkpoint=Checkpointing("ckpt"))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run", training, data_root=tmp_path)
    saved = find_checkpoint(tmp_path / "ckpt")
    with pytest.raises(SpecError, match="'model.layers' = 4: 3, as the job's model"):
        check_resumable(saved, replace(spec, layers=3), STEPS)
    for steps in (1, 2):  # at step 2 of 2 nothing is left to train: writing the model crashed
        with pytest.raises(SpecError, match=f"'step' = 2: a step below the job's steps \\({steps}\\)"):
            check_resumable(saved, spec, steps)
    with pytest.raises(SpecError, match="resume"):
        find_checkpoint(tmp_path / "run")


def test_a_checkpoint_damaged_after_its_save_is_refused_by_name(spec, tmp_path):
    # A truncated or lost shard file failed inside every worker's read (EOFError); drover.json
    # lists the files' sizes, so it is refused up front, naming the file.
    training = replace(TRAINING, steps=2, checkpoint=Checkpointing("ckpt"))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run", training, data_root=tmp_path)
    saved = find_checkpoint(tmp_path / "ckpt")
    assert check_resumable(saved, spec, STEPS) == 2
    shard = sorted(saved.glob("*.distcp"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecError, match=f"{shard.name}: field 'size' = {len(data) // 2}: {len(data)} bytes, as it"):
        check_resumable(saved, spec, STEPS)
    out = run_cli("export", str(tmp_path / "ckpt"), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert out.returncode == 2 and shard.name in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    shard.unlink()
    with pytest.raises(SpecError, match=f"{shard.name}: field 'size' = 'missing'"):
        check_resumable(saved, spec, STEPS)
    (saved / "drover.json").write_text('{"step": 2, "model": ')
    with pytest.raises(SpecError, match="drover.json.*unreadable"):
        check_resumable(saved, spec, STEPS)


def test_a_checkpoint_exports_the_model_it_holds(spec, tmp_path):
    training = replace(TRAINING, steps=2, checkpoint=Checkpointing("ckpt"))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run", training, data_root=tmp_path)
    from_checkpoint = gathered_model(tmp_path / "ckpt")
    from_run = gathered_model(tmp_path / "run")
    assert from_checkpoint[0] == from_run[0] == spec
    assert from_checkpoint[1].keys() == from_run[1].keys()
    for key, tensor in from_run[1].items():
        assert torch.equal(from_checkpoint[1][key], tensor), key


def test_export_writes_a_hugging_face_directory_from_the_cli(spec, tmp_path):
    training = replace(TRAINING, steps=2, checkpoint=Checkpointing("ckpt"))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "run", training, data_root=tmp_path)
    out = run_cli("export", str(tmp_path / "ckpt"), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size > 4 * spec.parameters
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as written:
        count = sum(written.get_tensor(name).numel() for name in written.keys())
    assert f"{count:,} parameters" in out.stdout  # the tensors written, the norms too
    gpt = run_cli("export", str(Path(ROOT / "examples")), "--out", str(tmp_path / "x"))
    assert gpt.returncode == 2 and "resume" in gpt.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("case", ["checkpoint of another model", "shard dtype", "hf architecture", "field range"])
def test_bad_inputs_are_one_clear_error_and_nothing_is_written(case, tmp_path):
    """Through `drover train` as a user runs it: exit 2, one line naming the field, no output."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(DP2_PP2.to_dict()))
    job = {"model": str(TINY_LLAMA), "steps": 4}
    expected = ""
    if case == "checkpoint of another model":
        gpt = Training(1, checkpoint=Checkpointing("ckpt"))
        train_workers(load_model(ROOT / "examples" / "models" / "tiny.yaml"), 4, [(0, DP2_PP2)], tmp_path / "g", gpt,
                      data_root=tmp_path)  # fmt: skip
        job["resume"], expected = "ckpt", "'model.family' = 'gpt': 'llama', as the job's model"
    elif case == "shard dtype":
        (tmp_path / "shards").mkdir()
        (tmp_path / "shards" / "train-00000.bin").write_bytes(b"\0" * 999)
        meta = {"format": "drover-tokens", "dtype": "uint16", "vocab": 100, "splits": {"train": [
            {"file": "train-00000.bin", "tokens": 500}]}}  # fmt: skip
        (tmp_path / "shards" / "meta.json").write_text(json.dumps(meta))
        job["data"], expected = "shards", "'tokens' = 500: what the file holds as uint16 (999 bytes)"
    elif case == "hf architecture":
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
        job["init"], expected = "hf", "'architectures' = ['MistralForCausalLM']: a Llama architecture"
    else:
        job["checkpoint"], expected = {"dir": "c", "keep": 0}, "'checkpoint.keep' = 0: an integer >= 1"
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    out = run_cli("train", "--job", str(tmp_path / "job.yaml"), "--data-root", str(tmp_path), "--workers", "4",
                  "--plan", str(plan), "--out", str(tmp_path / "out"))  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "out").exists()
