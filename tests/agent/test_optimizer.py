"""The optimizer and schedule from a job: the schedule as a pure function,
the parser's errors, and clipping by the global gradient norm kept exact
(real gloo workers through live switches with TP-2 stages equal the reference)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml

from drover.agent.runtime.launch import train_reference, train_workers
from drover.planner.errors import SpecError
from drover.planner.model import load_model
from drover.planner.spec_io import Fields
from drover.planner.training import TRAINING_KEYS, Optimizer, Schedule, Training, lr_at, training_from_job

from support import DP2_PP2, MIXED_TP, ROOT, THREE, assert_matches_reference, trace

STEPS, SEED = 6, 3
OPT = Optimizer(lr=3e-3, beta1=0.85, beta2=0.9, eps=1e-8, weight_decay=0.02, clip_norm=0.9)
SCHED = Schedule(warmup_steps=2, decay="cosine", min_lr=1e-4)


# -- the schedule --------------------------------------------------------------


def test_constant_without_warmup_is_lr_everywhere():
    assert [lr_at(Optimizer(lr=0.5), Schedule(), s, 10) for s in range(10)] == [0.5] * 10


def test_warmup_is_linear_then_constant():
    lrs = [lr_at(Optimizer(lr=1.0), Schedule(warmup_steps=4), s, 10) for s in range(6)]
    assert lrs == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_falls_from_lr_to_min_lr_after_warmup():
    opt, sched = Optimizer(lr=1.0), Schedule(warmup_steps=2, decay="cosine", min_lr=0.1)
    lrs = [lr_at(opt, sched, s, 12) for s in range(12)]
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:]))  # strictly falling
    assert lrs[7] == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the 10 decay steps
    assert lrs[-1] > 0.1 and lrs[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9)))
    assert lr_at(opt, sched, 50, 12) == pytest.approx(0.1)  # past the end: min_lr


def test_cosine_with_all_steps_warmup():
    opt, sched = Optimizer(lr=1.0), Schedule(warmup_steps=4, decay="cosine")
    assert [lr_at(opt, sched, s, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


# -- the parser -------------------------------------------------------------------


def training_from_dict(data: dict, source: str) -> tuple[Optimizer, Schedule]:
    """The optimizer and schedule of a job file's training keys, as the agents read them."""
    f = Fields({"steps": 1} | data, source)
    f.reject_unknown(TRAINING_KEYS)
    training = training_from_job(f)
    return training.optimizer, training.schedule


def test_parser_reads_every_field_and_defaults():
    assert training_from_dict({}, "f") == (Optimizer(), Schedule())
    # YAML reads 1e-8 (no dot) as a string; it is taken as the number
    assert training_from_dict(yaml.safe_load("optimizer: {eps: 1e-8, lr: 2E-3}"), "f") == (
        Optimizer(lr=2e-3, eps=1e-8),
        Schedule(),
    )
    got = training_from_dict(
        {
            "optimizer": {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0, "clip_norm": 1},
            "schedule": {"warmup_steps": 3, "decay": "cosine", "min_lr": 0.001},
        },
        "f",
    )
    assert got == (Optimizer(0.01, 0.8, 0.99, 1e-6, 0.0, 1.0), Schedule(3, "cosine", 0.001))


@pytest.mark.parametrize(
    "data, field, allowed",
    [
        ({"optimizer": {"lr": 0}}, "optimizer.lr", "> 0"),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr", "finite number"),
        ({"optimizer": {"betas": [0.9]}}, "optimizer.betas", "two numbers"),
        ({"optimizer": {"betas": [0.9, 1.0]}}, "optimizer.betas", "< 1"),
        ({"optimizer": {"betas": "0.9 0.95"}}, "optimizer.betas", "two numbers"),
        ({"optimizer": {"eps": -1}}, "optimizer.eps", "> 0"),
        ({"optimizer": {"weight_decay": -0.1}}, "optimizer.weight_decay", ">= 0"),
        ({"optimizer": {"clip_norm": 0}}, "optimizer.clip_norm", "> 0"),
        ({"optimizer": {"momentum": 0.9}}, "optimizer.momentum", "a known field"),
        ({"optimizer": [1]}, "optimizer", "a mapping"),
        ({"schedule": {"decay": "linear"}}, "schedule.decay", "constant, cosine"),
        ({"schedule": {"warmup_steps": -1}}, "schedule.warmup_steps", ">= 0"),
        ({"schedule": {"warmup_steps": 1.5}}, "schedule.warmup_steps", "integer"),
        ({"schedule": {"decay": "cosine", "min_lr": 1.0}}, "schedule.min_lr", "<= 0.003"),
        ({"schedule": {"min_lr": 1e-4}}, "schedule.min_lr", "only with decay: cosine"),
        ({"schedule": {"warmup": 3}}, "schedule.warmup", "a known field"),
        ({"optimiser": {}}, "optimiser", "a known field"),
    ],
)
def test_parser_errors_name_field_value_and_what_is_allowed(data, field, allowed):
    with pytest.raises(SpecError) as info:
        training_from_dict(data, "opt.yaml")
    assert info.value.field == field and info.value.source == "opt.yaml"
    assert allowed in info.value.allowed
    assert field in str(info.value)


# -- exactness with clipping, warm-up and cosine -----------------------------------


def assert_equal_runs(out, reference) -> None:
    assert_matches_reference(out, reference)
    ref, run = trace(reference), trace(out)
    assert [t["grad_norm"] for t in run] == pytest.approx([t["grad_norm"] for t in ref], rel=1e-5)
    assert [t["lr"] for t in run] == [t["lr"] for t in ref] == [lr_at(OPT, SCHED, s, STEPS) for s in range(STEPS)]


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_clipped_scheduled_run_through_switches_equals_reference(model, tmp_path):
    spec = load_model(ROOT / "examples" / "models" / f"{model}.yaml")
    train_reference(spec, Training(STEPS, SEED, OPT, SCHED), tmp_path / "ref")
    norms = [t["grad_norm"] for t in trace(tmp_path / "ref")]
    assert any(n > OPT.clip_norm for n in norms), norms  # clipping happens...
    # ... and matters: without it the run differs
    train_reference(spec, Training(STEPS, SEED, replace(OPT, clip_norm=None), SCHED), tmp_path / "unclipped")
    assert trace(tmp_path / "unclipped")[-1]["loss"] != pytest.approx(trace(tmp_path / "ref")[-1]["loss"], rel=1e-6)
    # DP2_PP2, then MIXED_TP (a TP-2 stage, pipelines of different TP sizes),
    # then THREE (TP-2 in one of three pipelines)
    plans = [(0, DP2_PP2), (2, MIXED_TP), (4, THREE)]
    train_workers(spec, 4, plans, tmp_path / "run", Training(STEPS, SEED, OPT, SCHED))
    assert_equal_runs(tmp_path / "run", tmp_path / "ref")
    assert [t["plan_version"] for t in trace(tmp_path / "run")] == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("schedule", [{}, {"decay": "cosine", "min_lr": 1e-5, "warmup_steps": 3}])
def test_settings_survive_the_trip_to_the_workers(schedule):
    """What the control plane sends is what the workers' parser reads back (the default schedule
    once failed every job on its way to the agents)."""
    sent = training_from_dict({"optimizer": {"lr": 3e-3, "clip_norm": 1.0}, "schedule": schedule}, "job")
    wire = {"optimizer": sent[0].to_dict(), "schedule": sent[1].to_dict()}
    assert training_from_dict(wire, "wire") == sent
