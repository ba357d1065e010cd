"""Job files: read where the user runs the CLI, taken by the server only with
the model inline, bounded and alias-free."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from drover.client import job_spec
from drover.control_plane.jobfile import job_from_spec, job_from_stored, job_from_wire, load_job, read_job_file
from drover.control_plane.validation import InvalidArgument, check_out_dir
from drover.planner.errors import SpecError
from drover.v1 import jobspec_pb2

from support import ROOT

TINY = ROOT / "examples" / "jobs" / "tiny.yaml"
MODEL = {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128, "global_batch": 16, "micro_batch": 2}


def test_the_cli_inlines_the_model_file_and_the_server_takes_it():
    sent = job_spec(read_job_file(TINY))
    assert sent.model.layers == 4
    assert job_from_spec(sent) == load_job(TINY)
    assert job_from_wire(yaml.safe_dump(read_job_file(TINY))) == load_job(TINY)  # the deprecated YAML form


def test_every_job_file_key_round_trips_through_a_job_spec(tmp_path):
    text = (
        "model: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, seq_len: 16, vocab: 64,"
        " global_batch: 4, micro_batch: 2, mfu: 0.4, rope_theta: 500000.0, norm_eps: 1.0e-6}\n"
        "steps: 9\nseed: 0\n"
        "optimizer: {lr: 1.0e-3, betas: [0.8, 0.99], eps: 1e-7, weight_decay: 0, clip_norm: 1.0}\n"
        "schedule: {warmup_steps: 2, decay: cosine, min_lr: 0}\n"
        "data: shards\ninit: hf/llama\ncheckpoint: {dir: ckpt, every_steps: 3, keep: 1}\n"
        "eval: {every_steps: 3, samples: 8}\nprecision: bf16\nresume: ckpt\ntensorboard: false\n"
        "resources: {devices: 3}\nrecoveries: {max: 0, within_steps: 10}\n"
    )
    (tmp_path / "job.yaml").write_text(text)
    job = load_job(tmp_path / "job.yaml")
    spec = job_spec(read_job_file(tmp_path / "job.yaml"))
    assert spec.precision == jobspec_pb2.PRECISION_BF16 and spec.schedule.decay == jobspec_pb2.DECAY_COSINE
    assert spec.optimizer.HasField("weight_decay") and spec.recoveries.HasField("max")  # zeros set, not defaults
    assert job_from_spec(spec) == job
    assert job.training.optimizer.weight_decay == 0 and job.recoveries.max == 0 and not job.training.tensorboard


def test_a_stored_job_reads_back_whatever_its_numbers():
    llama = {**MODEL, "family": "llama", "kv_heads": 2, "norm_eps": 1e-6, "rope_theta": 5e5}
    job = job_from_wire(json.dumps({"model": llama, "steps": 2, "optimizer": {"eps": 1e-12}, "seed": (1 << 63) - 1}))
    stored = json.dumps(job.wire_dict())  # '1e-06': a string to YAML 1.1, a number to JSON
    assert job_from_stored(stored, "job-1") == job
    plain = job_from_wire(json.dumps({"model": MODEL, "steps": 2}))
    assert job_from_stored(yaml.safe_dump(plain.wire_dict()), "job-2") == plain  # YAML rows: still read


def test_job_file_values_yaml_gives_other_types_become_what_the_job_means():
    spec = job_spec({"name": 2024, "steps": 3, "optimizer": {"clip_norm": None}, "resources": {}, "checkpoint": {}})
    assert spec.name == "2024"  # YAML read a number; a name is its text
    assert not spec.optimizer.HasField("clip_norm")  # null: no clipping, as in the job file
    assert spec.HasField("resources") and spec.HasField("checkpoint")  # given empty: the server judges them
    fields = {"model": MODEL, "steps": 3, "resources": {}}
    assert job_from_spec(job_spec(fields)).resources.to_dict() == {}  # empty: every free device
    with pytest.raises(SpecError, match="'checkpoint.dir'"):
        job_from_spec(job_spec({"model": MODEL, "steps": 3, "checkpoint": {}}))
    with pytest.raises(SpecError, match="'optimizer.lr' = 1000000"):
        job_from_wire(json.dumps({"model": MODEL, "steps": 3, "optimizer": {"lr": 10**400}}))


def test_a_job_spec_names_a_key_it_cannot_hold():
    with pytest.raises(ValueError, match=r"optimizer\.momentum: not a field of Optimizer"):
        job_spec({"steps": 3, "optimizer": {"momentum": 0.9}})
    with pytest.raises(ValueError, match=r"resources\.devices: resources\.nodes is set; only one of nodes, devices"):
        job_spec({"steps": 3, "resources": {"nodes": 1, "devices": 2}})
    with pytest.raises(ValueError, match=r"precision = fp8: one of fp32, bf16"):
        job_spec({"steps": 3, "precision": "fp8"})


@pytest.mark.parametrize("model", ["../models/tiny.yaml", "/etc/shadow", "/dev/zero"])
def test_the_server_opens_no_path(model, monkeypatch):
    opened = []
    monkeypatch.setattr("pathlib.Path.read_text", lambda self, *a, **k: opened.append(self) or "")
    with pytest.raises(SpecError, match="opens no paths"):
        job_from_wire(f"model: {model}\nsteps: 3\n")
    assert opened == []


def test_a_job_with_a_model_family_nobody_builds_is_refused():
    with pytest.raises(SpecError) as info:
        job_from_wire(json.dumps({"model": {**MODEL, "family": "mamba"}, "steps": 2}))
    assert info.value.field == "family" and "gpt" in str(info.value) and "llama" in str(info.value)


def test_a_job_with_a_llama_model_is_taken():
    job = job_from_wire(json.dumps({"model": {**MODEL, "family": "llama", "kv_heads": 2}, "steps": 2}))
    assert job.model.family == "llama" and job.model.kv_heads == 2


def test_errors_quote_only_a_prefix_of_a_huge_value():
    with pytest.raises(SpecError) as info:
        job_from_wire(json.dumps({"model": {**MODEL, "name": ["x" * 50_000]}, "steps": 2}))
    assert len(str(info.value)) < 400 and "50004 characters" in str(info.value)


@pytest.mark.parametrize("out_dir", ["/etc", "../up", "a/../../b", "x" * 300, "a\\..\\b", "a\0b", "a\nb"])
def test_out_dir_from_the_network_stays_relative(out_dir):
    with pytest.raises(InvalidArgument, match="out_dir"):
        check_out_dir(out_dir)


@pytest.mark.parametrize("out_dir, kept", [("", ""), ("runs/a", "runs/a"), (".", "."), ("runs//a/", "runs/a")])
def test_good_out_dirs(out_dir, kept):
    assert check_out_dir(out_dir) == kept


def test_a_job_file_carries_the_optimizer_and_schedule_to_the_workers():
    from drover.agent.supervisor import worker_job
    from drover.planner.training import Optimizer, Schedule

    text = json.dumps(
        {
            "model": MODEL,
            "steps": 8,
            "optimizer": {"lr": 0.01, "betas": [0.8, 0.99], "clip_norm": 1.5},
            "schedule": {"warmup_steps": 2, "decay": "cosine", "min_lr": 0.001},
        }
    )
    job = job_from_wire(text)
    assert job.training.optimizer == Optimizer(lr=0.01, beta1=0.8, beta2=0.99, clip_norm=1.5)
    assert job.training.schedule == Schedule(2, "cosine", 0.001)
    assert job_from_wire(json.dumps(job.wire_dict())) == job  # what a restarted control plane reads back
    spec, training = worker_job(json.loads(job.workers_json()), 8, 0)  # StartJob.model_yaml
    assert (replace(spec, name=job.model.name), training) == (job.model, job.training)
    # A job without them, and the model alone (an older control plane's StartJob): the defaults
    plain = job_from_wire(json.dumps({"model": MODEL, "steps": 8}))
    assert (plain.training.optimizer, plain.training.schedule) == (Optimizer(), Schedule())
    spec, training = worker_job(MODEL, 8, 0)
    assert (replace(spec, name=plain.model.name), training) == (plain.model, plain.training)


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"optimizer": {"lr": -1}}, "optimizer.lr"),
        ({"optimizer": {"betas": [0.9, 2]}}, "optimizer.betas"),
        ({"schedule": {"decay": "step"}}, "schedule.decay"),
        ({"schedule": {"warmup_steps": "3"}}, "schedule.warmup_steps"),
        # Past int64 it was stored, and GetJob then left out the job's spec.
        ({"checkpoint": {"dir": "c", "every_steps": 10**23}}, "checkpoint.every_steps"),
        ({"schedule": {"warmup_steps": 2**41}}, "schedule.warmup_steps"),
    ],
)
def test_a_bad_optimizer_or_schedule_is_refused_naming_the_field(extra, field):
    with pytest.raises(SpecError) as info:
        job_from_wire(json.dumps({"model": MODEL, "steps": 8, **extra}))
    assert info.value.field == field and info.value.source == "job_yaml"


@pytest.mark.parametrize("name", ["two\nlines", "bell\a", "esc\x1b[2J"])
def test_a_job_name_is_printable(name):
    # A newline forged a row of drover job list and a line of the server's log.
    with pytest.raises(SpecError) as info:
        job_from_wire(json.dumps({"model": MODEL, "steps": 2, "name": name}))
    assert info.value.field == "name" and "printable" in str(info.value)
    assert job_from_wire(json.dumps({"model": MODEL, "steps": 2, "name": "run 7: lr=3e-4"})).name == "run 7: lr=3e-4"


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"data": "shards\n"}, "data"),
        ({"init": "w\x1b[2J.safetensors"}, "init"),
        ({"resume": "ckpt/\u0007"}, "resume"),
        ({"checkpoint": {"dir": "c\nd", "every_steps": 2}}, "checkpoint.dir"),
    ],
)
def test_a_jobs_paths_are_printable(extra, field):
    with pytest.raises(SpecError) as info:
        job_from_wire(json.dumps({"model": MODEL, "steps": 2, **extra}))
    assert info.value.field == field and "printable" in str(info.value)


def test_steps_zero_in_a_job_spec_message_is_named_as_zero():
    spec = job_spec({"model": MODEL, "steps": 1})
    spec.steps = 0  # which proto3 leaves out of the message
    with pytest.raises(SpecError) as info:
        job_from_spec(spec)
    assert info.value.field == "steps" and info.value.value == 0
