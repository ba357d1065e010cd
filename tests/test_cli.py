"""`drover plan` through the installed console script and in-process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from drover.cli import main
from drover.planner.cluster import load_cluster
from drover.planner.cost import validate
from drover.planner.model import load_model
from drover.planner.plan import plan_from_dict

CLUSTER = ROOT / "examples" / "clusters" / "a100-64-stragglers.yaml"
MODEL = ROOT / "examples" / "models" / "gpt-7b.yaml"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    drover = shutil.which("drover", path=str(ROOT / ".venv" / "bin")) or shutil.which("drover")
    cmd = [drover] if drover else [sys.executable, "-m", "drover.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_plan_json_is_a_valid_plan_of_the_spec():
    out = run_cli("plan", "--cluster", str(CLUSTER), "--model", str(MODEL), "--json")
    assert out.returncode == 0, out.stderr
    plan = plan_from_dict(json.loads(out.stdout))
    cluster, model = load_cluster(CLUSTER), load_model(MODEL)
    validate(plan, cluster, model)
    assert plan.strategy == "drover"
    assert plan.predicted.samples_per_s > 0 and plan.predicted.ideal_samples_per_s >= plan.predicted.samples_per_s
    assert "node-4/7" not in plan.devices  # failed in the example


@pytest.mark.parametrize("strategy", ["uniform", "drop"])
def test_baselines_from_the_cli(strategy, capsys):
    main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL), "--strategy", strategy, "--json"])
    assert json.loads(capsys.readouterr().out)["strategy"] == strategy


def test_table_names_figures(capsys):
    main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL)])
    out = capsys.readouterr().out
    assert "predicted:" in out and "samples/s" in out and "ideal" in out
    assert "removed:" in out and "pipeline" in out


@pytest.mark.parametrize("args, fragment", [
    (["--cluster", "missing.yaml", "--model", str(MODEL)], "missing.yaml"),
    (["--cluster", str(CLUSTER), "--model", str(MODEL), "--strategy", "best"], "--strategy"),
    (["--cluster", str(CLUSTER)], "--model"),
])
def test_bad_input_exits_2_with_one_line(args, fragment):
    out = run_cli("plan", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr
    assert out.stdout == ""


def test_bad_field_in_file_exits_2_naming_it(tmp_path):
    bad = tmp_path / "model.yaml"
    bad.write_text(MODEL.read_text().replace("layers: 32", "layers: -3"))
    out = run_cli("plan", "--cluster", str(CLUSTER), "--model", str(bad))
    assert out.returncode == 2
    assert "'layers'" in out.stderr and "-3" in out.stderr and len(out.stderr.strip().splitlines()) == 1


EVENTS = ROOT / "examples" / "events" / "straggler-then-failure.yaml"


def test_simulate_json_reports_every_strategy():
    out = run_cli("simulate", "--cluster", str(CLUSTER), "--model", str(MODEL), "--events", str(EVENTS),
                  "--steps", "600", "--json")
    assert out.returncode == 0, out.stderr
    runs = {r["strategy"]: r for r in json.loads(out.stdout)}
    assert set(runs) == {"drover", "uniform", "drop"}
    for r in runs.values():
        assert r["samples_per_s"] == pytest.approx(600 * 512 / r["total_s"])
    assert runs["drover"]["samples_per_s"] > max(runs["uniform"]["samples_per_s"], runs["drop"]["samples_per_s"])
    assert runs["drover"]["replans"] >= 2 and runs["drover"]["migration_s"] < runs["drop"]["migration_s"]


def test_simulate_bad_events_exit_2(tmp_path):
    bad = tmp_path / "events.yaml"
    bad.write_text("events:\n  - {step: 3, device: node-99/0, rate: 2}\n")
    out = run_cli("simulate", "--cluster", str(CLUSTER), "--model", str(MODEL), "--events", str(bad))
    assert out.returncode == 2
    assert "node-99/0" in out.stderr and "events[0].device" in out.stderr


def test_every_command_is_documented():
    from drover.cli import remote, up  # noqa: F401  (registers the commands)
    from drover.cli import cli
    doc = (ROOT / "docs" / "cli.md").read_text()
    for name, command in cli.commands.items():
        subcommands = getattr(command, "commands", {})
        for sub in subcommands or [None]:
            spelled = f"drover {name}" + (f" {sub}" if sub else "")
            assert spelled in doc, f"{spelled} is missing from docs/cli.md"


def test_plan_for_a_llama_model_keeps_tp_within_kv_heads(capsys):
    llama = ROOT / "examples" / "models" / "llama-8b.yaml"
    main(["plan", "--cluster", str(CLUSTER), "--model", str(llama), "--json"])
    plan = plan_from_dict(json.loads(capsys.readouterr().out))
    model = load_model(llama)
    validate(plan, load_cluster(CLUSTER), model)
    assert all(model.kv_heads % len(s.devices) == 0 for p in plan.pipelines for s in p.stages)
