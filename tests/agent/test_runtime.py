"""The training runtime with real worker processes over gloo: any plan and
any sequence of live switches gives the reference run's model and losses."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from drover.agent.runtime.launch import local_cluster, train_reference, train_workers
from drover.planner.cost import validate
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import load_model
from drover.planner.training import Checkpointing, Training

from support import (
    DP2_PP2,
    MIXED_TP,
    REJOIN,
    ROOT,
    SHRINK,
    THREE,
    TP2,
    TP2_TP4_TP1,
    UNEVEN,
    assert_matches_reference,
    local_plan,
    losses,
    trace,
)

TINY = ROOT / "examples" / "models" / "tiny.yaml"
STEPS, SEED = 5, 3


@pytest.fixture(scope="module")
def spec():
    return load_model(TINY)


@pytest.fixture(scope="module")
def reference(spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    train_reference(spec, Training(STEPS, SEED), out)
    return out


@pytest.mark.parametrize(
    "name, plans",
    [
        ("dp2-pp2", [(0, DP2_PP2)]),
        ("uneven-layers-and-micro-batches", [(0, UNEVEN)]),
        ("tp2-stages", [(0, TP2)]),
        ("switch-mid-run", [(0, DP2_PP2), (2, MIXED_TP)]),
        ("three-switches", [(0, DP2_PP2), (2, SHRINK), (3, REJOIN), (4, THREE)]),
    ],
)
def test_parallel_run_equals_reference(name, plans, spec, reference, tmp_path):
    train_workers(spec, 4, plans, tmp_path, Training(STEPS, SEED))
    assert_matches_reference(tmp_path, reference)
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [t["plan_version"] for t in trace] == [1 + sum(step <= s for step, _ in plans[1:]) for s in range(STEPS)]
    migrations = [json.loads(line) for line in (tmp_path / "migrations.jsonl").read_text().splitlines()]
    assert [m["step"] for m in migrations] == [step for step, _ in plans[1:]]
    for m in migrations:
        assert m["bytes_moved"] > 0 and m["blocks_moved"] >= 0 and m["seconds"] > 0


def test_activations_cross_between_tp_groups_of_any_sizes_in_pieces(spec, reference, tmp_path):
    """A TP group sends a stage boundary's tensor in min(t, t') pieces, one per sender,
    which the receivers gather; the model still equals the reference."""
    train_workers(spec, 7, [(0, TP2_TP4_TP1)], tmp_path, Training(STEPS, SEED))
    assert_matches_reference(tmp_path, reference)
    activation = spec.micro_batch * spec.seq_len * spec.hidden * 4
    sent = json.loads((tmp_path / "telemetry" / "local_0.jsonl").read_text().splitlines()[-1])["bytes_sent"]
    # local/0 is its group's member 1: piece 1 of each, to the next group's members 1 and 3
    assert sent == {"2": 8 * activation / 2, "3": 8 * activation / 2}


def test_cli_train_with_straggler_and_switch_matches_cli_reference(tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "b.json").write_text(json.dumps(MIXED_TP.to_dict()))
    common = ["--model", str(TINY), "--steps", "4", "--seed", "11"]
    drover = str(ROOT / ".venv" / "bin" / "drover") if (ROOT / ".venv" / "bin" / "drover").exists() else "drover"
    ref = subprocess.run(
        [drover, "train", "--reference", *common, "--out", str(tmp_path / "ref")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stderr
    run = subprocess.run(
        [
            drover,
            "train",
            *common,
            "--workers",
            "4",
            "--plan",
            str(ROOT / "examples" / "plans" / "tiny-dp2-pp2.json"),
            "--switch",
            f"2:{plans / 'b.json'}",
            "--slow",
            "local/2=3@1",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert_matches_reference(tmp_path / "run", tmp_path / "ref")
    for rank in range(4):
        rows = [json.loads(line) for line in (tmp_path / "run" / "telemetry" / f"local_{rank}.jsonl").open()]
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        for r in rows:
            assert r["compute_s_per_block"] > 0 and r["grad_sync_s"] >= 0 and r["p2p_wait_s"] >= 0
        for r in rows[:2]:  # under DP2_PP2 every device talks to its pipeline neighbour
            peer = str(rank ^ 1)
            assert r["bytes_sent"] == {peer: 4 * 2 * 32 * 64 * 4} and r["bytes_recv"] == r["bytes_sent"]


@pytest.mark.parametrize(
    "bad, rule",
    [
        (local_plan((8, [([0], (0, 4))]), (0, [([1], (0, 4))]), removed=[2, 3]), "micro-batches-below-one"),
        (local_plan((7, [([0], (0, 4))]), removed=[1, 2, 3]), "micro-batches-do-not-sum"),
        (local_plan((8, [([0], (0, 3))]), removed=[1, 2, 3]), "layer-gap"),
        (local_plan((8, [([0], (0, 4))]), removed=[1, 2, 3, 7]), "unknown-device"),
        (local_plan((8, [([0], (0, 4))]), removed=[1, 2]), "device-neither-used-nor-removed"),
        (local_plan((8, [([0, 1, 2], (0, 4))]), removed=[3]), "tp-does-not-divide-heads"),
    ],
)
def test_bad_plans_refused_before_workers_start(bad, rule, spec, tmp_path):
    with pytest.raises(PlanError) as info:
        validate(bad, local_cluster(4), spec)
    assert info.value.rule == rule
    with pytest.raises(PlanError):
        train_workers(spec, 4, [(0, DP2_PP2), (2, bad)], tmp_path, Training(3))
    assert not (tmp_path / "trace.jsonl").exists()


def test_reference_loss_falls(spec, tmp_path):
    train_reference(spec, Training(40), tmp_path)
    curve = losses(tmp_path)
    assert sum(curve[-5:]) / 5 < 0.8 * sum(curve[:5]) / 5


def test_checkpoint_and_restart_continues_exactly(spec, reference, tmp_path):
    """The baseline of bench/migration.py: save, stop, start new workers on another plan, load."""
    saving = Training(2, SEED, checkpoint=Checkpointing("ckpt"))
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "a", saving, data_root=tmp_path)
    resuming = Training(STEPS, SEED, resume="ckpt")
    train_workers(spec, 4, [(0, MIXED_TP)], tmp_path / "b", resuming, data_root=tmp_path)
    want = torch.load(reference / "model.pt")
    got = torch.load(tmp_path / "b" / "model.pt")
    for key in want:
        assert ((got[key] - want[key]).norm() / want[key].norm()).item() < 1e-4, key
    assert losses(tmp_path / "a") + losses(tmp_path / "b") == pytest.approx(losses(reference), rel=1e-5)


def curves(out) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars in OUT/tensorboard, as TensorBoard reads them (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_training_curves_are_written_for_tensorboard_and_a_rerun_replaces_them(spec, tmp_path):
    train_workers(spec, 4, [(0, DP2_PP2)], tmp_path, Training(3, SEED + 1))  # an earlier run in the same out dir
    train_workers(spec, 4, [(0, DP2_PP2), (2, MIXED_TP)], tmp_path, Training(STEPS, SEED))
    rows = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    got = curves(tmp_path)
    assert got["train/loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in rows]  # this run's only
    assert got["plan/version"] == [(r["step"], r["plan_version"]) for r in rows]
    assert [v for _, v in got["plan/version"]] == [1, 1, 2, 2, 2]
    assert [s for s, _ in got["train/samples_per_s"]] == list(range(STEPS))
    assert {"train/lr", "train/step_time_s"} <= set(got)


def test_tensorboard_false_writes_no_curves(spec, tmp_path):
    train_workers(
        spec, 2, [(0, local_plan((8, [([0], (0, 4))]), removed=[1]))], tmp_path, Training(2, SEED, tensorboard=False)
    )
    assert not (tmp_path / "tensorboard").exists()
    assert len((tmp_path / "trace.jsonl").read_text().splitlines()) == 2


def test_a_refused_run_leaves_an_earlier_runs_files_alone_and_a_new_one_clears_them(spec, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace.jsonl").write_text("an earlier run's\n")
    (out / "eval.jsonl").write_text("an earlier run's\n")
    with pytest.raises(PlanError, match="local/7"):  # its trace was deleted, and telemetry/ made
        train_workers(spec, 4, [(0, DP2_PP2)], out, Training(2, 0), slow={"local/7": (3.0, 1)})
    with pytest.raises(PlanError, match="a switch at step 2: the run's steps are 0 to 1"):  # was ignored
        train_workers(spec, 4, [(0, DP2_PP2), (2, TP2)], out, Training(2, 0))
    assert (out / "trace.jsonl").read_text() == "an earlier run's\n" and not (out / "telemetry").exists()
    train_workers(spec, 4, [(0, DP2_PP2)], out, Training(2, 0))
    assert [t["step"] for t in trace(out)] == [0, 1] and not (out / "eval.jsonl").exists()  # not read as this run's


def test_workers_are_stopped_when_the_run_is_told_to_stop():
    # drover train's workers ran on under init after a SIGTERM to it, which now exits as this tick does.
    import multiprocessing
    import time

    from drover.agent.runtime.launch import wait_all

    procs = [multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for proc in procs:
        proc.start()

    def sigterm():
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        wait_all(procs, sigterm)
    assert [p.is_alive() for p in procs] == [False, False]


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 runs where there is CUDA")
def test_bf16_on_cpu_is_refused_before_any_worker_starts(spec, tmp_path):
    bf16 = Training(2, 0, precision="bf16")
    for run in (
        lambda: train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "w", bf16),  # each worker raised it
        lambda: train_reference(spec, bf16, tmp_path / "r"),  # it trained in fp32 without a word
    ):
        with pytest.raises(SpecError, match="'precision' = 'bf16': fp32 on CPU devices"):
            run()
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


def test_a_checkpoint_folder_that_is_a_file_is_refused_before_any_worker_starts(spec, tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")  # the workers failed at their first save
    training = Training(2, 0, checkpoint=Checkpointing("ckpt", every_steps=1))
    with pytest.raises(SpecError, match="'checkpoint.dir' = 'ckpt': a folder"):
        train_workers(spec, 4, [(0, DP2_PP2)], tmp_path / "out", training, data_root=tmp_path)
    assert not (tmp_path / "out").exists()
