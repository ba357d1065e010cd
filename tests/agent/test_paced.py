"""Paced devices: each worker's compute takes the time its emulated GPU would
(FLOPs / (tflops x mfu / rate)), the real math padded by a sleep, so the
result is still exactly the single-process one."""

from __future__ import annotations

import json

import pytest

from drover.agent.runtime.launch import train_reference, train_workers
from drover.planner import Cluster, Gpu, Node, evaluate, make_plan
from drover.planner.errors import PlanError
from drover.planner.model import load_model
from drover.planner.training import Training

from support import ROOT, assert_matches_reference, run_cli, trace

# About 0.35 s of emulated compute per step for the tiny model on one device: far above
# what its real computation takes, so the pacing, not this machine, sets the step time.
PACED = Cluster("paced", (Node("box", 2, Gpu("paced", 0.004, 80.0), intra_gbps=0.3, ethernet_gbps=1.0),))


@pytest.fixture(scope="module")
def spec():
    return load_model(ROOT / "examples" / "models" / "tiny.yaml")


def test_paced_workers_take_their_gpus_time_and_equal_the_reference(spec, tmp_path):
    slow = PACED.with_rates({"box/1": 2.0})
    plan = make_plan(slow, spec, "uniform")  # one pipeline per device, half the micro-batches each
    training = Training(3, 1)
    train_reference(spec, training, tmp_path / "reference")
    train_workers(spec, 2, [(0, plan)], tmp_path / "run", training, {"box/1": (2.0, 0)}, paced=PACED)
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")
    predicted = evaluate(plan, slow, spec).step_time_s  # the slow device's compute, x2
    compute = 3 * spec.micro_batches / 2 * (spec.layers * spec.block_flops + spec.head_flops)
    assert predicted >= 2 * compute / (0.004e12 * spec.mfu)
    for row in trace(tmp_path / "run"):
        assert row["step_time_s"] >= 0.98 * predicted, row  # paced: never faster than the emulated GPU


def test_a_paced_run_needs_one_worker_per_device_and_known_devices(spec, tmp_path):
    plan = make_plan(PACED, spec, "uniform")
    with pytest.raises(PlanError, match="3 workers for the 2 devices of paced"):
        train_workers(spec, 3, [(0, plan)], tmp_path, Training(1), paced=PACED)
    with pytest.raises(PlanError, match="--slow names 'local/1'; devices are box/0..box/1"):
        train_workers(spec, 2, [(0, plan)], tmp_path, Training(1), {"local/1": (2.0, 0)}, paced=PACED)


def test_drover_train_runs_the_plan_drover_plan_made_for_a_paced_cluster(tmp_path):
    """The same cluster file for the planner and the emulation: plan it, then train it paced."""
    cluster = ROOT / "examples" / "clusters" / "paced-2x2.yaml"
    planned = run_cli("plan", "--cluster", str(cluster), "--model", str(ROOT / "examples/models/tiny.yaml"), "--json")
    assert planned.returncode == 0, planned.stderr
    (tmp_path / "plan.json").write_text(planned.stdout)
    predicted = json.loads(planned.stdout)["predicted"]["step_time_s"]
    stages = [s for p in json.loads(planned.stdout)["pipelines"] for s in p["stages"]]
    slow = [s["layers"][1] - s["layers"][0] for s in stages if "node-1/0" in s["devices"]]
    assert slow in ([], [1])  # the file's 3x slow device: removed, or given a single block
    job = ["--job", str(ROOT / "examples/jobs/tiny.yaml"), "--steps", "3", "--cluster", str(cluster)]
    run = run_cli("train", *job, "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert all(row["step_time_s"] >= 0.98 * predicted for row in trace(tmp_path))
    wrong = run_cli("train", *job, "--workers", "3", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path))
    assert wrong.returncode == 2 and "--workers 3: " in wrong.stderr and "has 4 devices" in wrong.stderr
