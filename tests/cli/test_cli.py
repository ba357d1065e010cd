"""The command line through the installed console script and in-process, and
`drover up`'s summary from hand-made output files."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import click
import pytest

from drover.cli import main
from drover.cli.up import summary
from drover.planner.cluster import load_cluster
from drover.planner.cost import validate
from drover.planner.model import load_model
from drover.planner.plan import plan_from_dict
from drover.v1 import jobs_pb2, state_pb2

from support import ROOT, run_cli

CLUSTER = ROOT / "examples" / "clusters" / "a100-64-stragglers.yaml"
MODEL = ROOT / "examples" / "models" / "gpt-7b.yaml"


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


def test_plan_check_gives_a_golden_plans_figures_and_names_the_rule_an_invalid_one_breaks(spec_examples, capsys):
    golden = spec_examples / "small-hetero"
    files = ["--cluster", str(golden / "cluster.yaml"), "--model", str(golden / "model.yaml")]
    main(["plan", "check", str(golden / "plan.json"), *files, "--json"])
    expected = json.loads((golden / "expected.json").read_text())
    assert json.loads(capsys.readouterr().out)["predicted"]["step_time_s"] == pytest.approx(expected["step_time_s"])
    for invalid in sorted((golden / "invalid").glob("*.json")):
        with pytest.raises(SystemExit) as exit_code:
            main(["plan", "check", str(invalid), *files])
        err = capsys.readouterr().err
        assert exit_code.value.code == 2 and f"invalid plan ({invalid.stem})" in err, err
        assert err.count("\n") == 1  # one line


def test_table_names_figures(capsys):
    main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL)])
    out = capsys.readouterr().out
    assert "predicted:" in out and "samples/s" in out and "ideal" in out
    assert "removed:" in out and "pipeline" in out


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--cluster", "missing.yaml", "--model", str(MODEL)], "missing.yaml"),
        (["--cluster", str(CLUSTER), "--model", str(MODEL), "--strategy", "best"], "--strategy"),
        (["--cluster", str(CLUSTER)], "--model"),
    ],
)
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
    out = run_cli(
        "simulate",
        "--cluster",
        str(CLUSTER),
        "--model",
        str(MODEL),
        "--events",
        str(EVENTS),
        "--steps",
        "600",
        "--json",
    )
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
    from drover.cli import cli

    doc = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.list_commands(None):
        subcommands = getattr(cli.get_command(None, name), "commands", {})
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


def write_up_output(out, events: list[dict], migrations: list[dict] = (), steps: int = 30) -> None:
    """What `drover up` leaves in its output folder: a trace, the job's events, the migrations."""
    out.mkdir(exist_ok=True)
    (out / "trace.jsonl").write_text(
        "".join(json.dumps({"step": s, "samples_per_s": 20.0 if s < 10 else 8.0}) + "\n" for s in range(steps))
    )
    (out / "events.jsonl").write_text("".join(json.dumps({"time": 0.0, **e}) + "\n" for e in events))
    (out / "migrations.jsonl").write_text("".join(json.dumps(m) + "\n" for m in migrations))


JOB_DONE = jobs_pb2.Job(id="job-1", state=state_pb2.JOB_STATE_COMPLETED, step=29)
STARTED = [{"step": 0, "kind": "job_started"}, {"step": 0, "kind": "plan_committed", "plan_version": 1}]
DETECTED = {"step": 13, "kind": "straggler_detected", "device": "node-1/0", "rate": 2.9}


@pytest.mark.parametrize(
    "events, reason",
    [
        (
            STARTED + [{"step": 4, "kind": "straggler_detected", "device": "node-0/1", "rate": 1.3}],
            "no new plan: the detector flagged no device (straggler injected at step 10, job ended at step 29)",
        ),
        (
            STARTED
            + [
                DETECTED,
                {
                    "step": 13,
                    "kind": "replan_skipped",
                    "reason": "predicted gain 0.4 s < migration 2 s",
                    "rates": {"node-1/0": 2.9},
                    "gain_s": 0.4,
                    "migration_s": 2.0,
                },
            ],
            "no new plan: predicted gain 0.4 s < migration 2 s",
        ),
        (
            STARTED
            + [
                DETECTED,
                {"step": 13, "kind": "replan_skipped", "rates": {"node-1/0": 2.9}, "gain_s": 0.4, "migration_s": 2.0},
            ],  # a control plane from before the reason field
            "no new plan: predicted gain 0.4 s over the remaining steps <= migration 2 s",
        ),
        (
            STARTED + [DETECTED, {"step": 27, "kind": "plan_pushed", "plan_version": 2, "reason": "rates moved"}],
            "no new plan: plan v2, pushed at step 27, was not running before the job ended at step 29",
        ),
        (
            STARTED + [DETECTED],
            "no new plan: the detector flagged node-1/0 at 2.90x (step 13), but no replan was decided",
        ),
    ],
)
def test_up_summary_says_why_no_plan_followed_the_straggler(tmp_path, events, reason):
    write_up_output(tmp_path, events)
    text = summary(tmp_path, JOB_DONE, [10])
    assert reason in text
    assert [line for line in text.splitlines() if line.startswith("after the new plan")][0].endswith("-")


def test_up_summary_after_a_new_plan_gives_no_reason(tmp_path):
    events = STARTED + [
        DETECTED,
        {"step": 13, "kind": "plan_pushed", "plan_version": 2, "reason": "rates moved"},
        {"step": 15, "kind": "plan_committed", "plan_version": 2},
    ]
    write_up_output(tmp_path, events, [{"step": 15, "blocks_moved": 2, "bytes_moved": 1024, "seconds": 0.01}])
    text = summary(tmp_path, JOB_DONE, [10])
    assert "no new plan" not in text and "plans committed: v1@step 0, v2@step 15" in text
    rates = {
        line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1]
        for line in text.splitlines()
        if line.startswith(("before", "while", "after"))
    }
    assert rates == {"before the straggler": "20.0", "while slow": "8.0", "after the new plan": "8.0"}


def test_up_summary_without_a_straggler_gives_no_reason(tmp_path):
    write_up_output(tmp_path, STARTED)
    text = summary(tmp_path, JOB_DONE, [])
    assert "no new plan" not in text and "while slow" not in text
    assert "before the straggler" not in text and "whole run" in text  # nothing was slowed


@pytest.mark.parametrize(
    "args, env, fragment",
    [
        (["--min-gain", "2"], {}, "min_gain = 2.0"),
        ([], {"DROVER_WINDOW": "1"}, "window = 1"),
        (["--recovered-below", "1.5"], {}, "recovered_below = 1.5"),
    ],
)
def test_server_refuses_bad_detection_settings_from_flags_and_environment(args, env, fragment, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = run_cli("server", "--insecure", "--db", ":memory:", *args)
    assert out.returncode == 2 and fragment in out.stderr, out.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["server", "--db", ":memory:"], "--tls-dir DIR"),
        (["server", "--insecure", "--listen", "0.0.0.0:50051"], "loopback only"),
        (["agent", "--node", "n"], "--tls-dir DIR"),
        (["agent", "--insecure", "--control-plane", "10.1.2.3:50052"], "loopback control plane only"),
        (["job", "list"], "--ca and --token-file"),
        (["job", "list", "--insecure", "--control-plane", "10.1.2.3:50051"], "loopback control plane only"),
    ],
)
def test_the_secure_path_is_the_default_and_insecure_stays_on_loopback(args, fragment, monkeypatch):
    for name in ("DROVER_CA", "DROVER_TOKEN_FILE", "DROVER_INSECURE", "DROVER_TLS_DIR"):
        monkeypatch.delenv(name, raising=False)
    out = run_cli(*args)  # refused before any connection is made
    assert out.returncode == 2 and fragment in out.stderr, out.stderr


def test_certs_init_makes_a_cluster_and_never_overwrites_a_ca(tmp_path):
    folder = tmp_path / "certs"
    made = run_cli("certs", "init", "--dir", str(folder), "--node", "node-0", "--server-name", "server")
    assert made.returncode == 0, made.stderr
    names = {p.name for p in folder.iterdir()}
    assert {"ca.pem", "ca.key", "server.pem", "server.key", "node-node-0.pem", "tokens.json", "admin.token"} <= names
    assert oct((folder / "ca.key").stat().st_mode & 0o777) == "0o600"
    again = run_cli("certs", "init", "--dir", str(folder))
    assert again.returncode == 2 and "never overwrites" in again.stderr
    assert run_cli("certs", "add-token", "ci", "--role", "reader", "--dir", str(folder)).returncode == 0
    assert (folder / "ci.token").exists() and "ci" in (folder / "tokens.json").read_text()


def test_server_refuses_a_corrupt_database_in_one_line(tmp_path):
    db = tmp_path / "drover.db"
    db.write_bytes(b"not a database at all " * 100)
    out = run_cli("server", "--insecure", "--db", str(db), "--listen", "127.0.0.1:0", "--agent-listen", "127.0.0.1:0")
    assert out.returncode == 1 and "restore it from a backup" in out.stderr and "Traceback" not in out.stderr


def test_train_takes_the_optimizer_and_schedule_from_a_job_file(tmp_path):
    opt = tmp_path / "job.yaml"
    tiny = str(ROOT / "examples" / "models" / "tiny.yaml")
    opt.write_text(
        f"model: {tiny}\nsteps: 4\noptimizer: {{lr: 0.002, clip_norm: 0.5}}\n"
        "schedule: {warmup_steps: 2, decay: cosine}\n"
    )
    args = ["train", "--reference", "--job", str(opt), "--out", str(tmp_path)]
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([0.001, 0.002, 0.002, 0.002 * 0.5 * (1 + math.cos(math.pi / 2))])
    assert all("grad_norm" in r for r in rows)
    opt.write_text(f"model: {tiny}\nsteps: 4\nschedule: {{decay: linear}}\n")
    out = run_cli(*args)
    assert out.returncode == 2
    assert "'schedule.decay'" in out.stderr and "linear" in out.stderr and "cosine" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    main(["--version"])
    assert capsys.readouterr().out == f"drover {version('drover')}\n"


def test_a_control_plane_that_does_not_answer_gets_a_hint_naming_the_address(capsys):
    from drover.planner.ports import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SystemExit) as done:
        main(["job", "list", "--control-plane", address, "--insecure"])
    err = capsys.readouterr().err
    assert done.value.code == 1 and "UNAVAILABLE" in err and address in err and "--control-plane" in err


def test_every_option_reads_an_environment_variable_shown_in_help(capsys, monkeypatch):
    from click.testing import CliRunner

    from drover.cli import cli

    def commands(command, path):
        yield path, command
        for name in command.list_commands(None) if isinstance(command, click.Group) else []:
            yield from commands(command.get_command(None, name), [*path, name])

    for path, command in commands(cli, []):
        options = [p for p in command.params if p.param_type_name == "option" and p.name not in ("help", "version")]
        help_text = " ".join(CliRunner().invoke(cli, [*path, "--help"]).output.split())
        for param in options:
            assert param.envvar and str(param.envvar).startswith("DROVER_"), (path, param.name)
            assert f"env var: {param.envvar}" in help_text, (path, param.envvar)
    monkeypatch.setenv("DROVER_PLAN_STRATEGY", "uniform")
    main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL), "--json"])
    assert json.loads(capsys.readouterr().out)["strategy"] == "uniform"


def test_json_output_has_numbers_not_strings():
    from drover.cli.client import to_dict

    job = jobs_pb2.Job(id="job-1", steps=30, step=7, plan_version=2, committed_plan_version=1)
    listed = to_dict(jobs_pb2.ListJobsResponse(jobs=[job]))
    assert listed["jobs"][0]["steps"] == 30 and listed["jobs"][0]["step"] == 7
    assert isinstance(listed["jobs"][0]["plan_version"], int)
    plan = jobs_pb2.PlanRecord(job_id="job-1", version=3)
    plan.plan.pipelines.add(micro_batches=8).stages.add(devices=["n/0"], layers=[0, 4])
    got = to_dict(plan)
    assert got["version"] == 3 and got["plan"]["pipelines"][0]["micro_batches"] == 8
    assert got["plan"]["pipelines"][0]["stages"][0]["layers"] == [0, 4]


@pytest.mark.parametrize(
    "options, fragment",
    [
        (["--straggle", "node-9/0=3@10"], "node-9/0: not a device of the cluster (node-0/0, node-0/1, node-1/0"),
        (
            ["--cluster", str(ROOT / "examples" / "clusters" / "paced-2x2.yaml"), "--straggle", "node-2/0=3@2"],
            "node-2/0: not a device",
        ),
    ],
)
def test_up_refuses_a_straggle_device_before_anything_starts(tmp_path, options, fragment, capsys):
    # Found only once the cluster ran and the job was submitted, which then stayed 'running' in
    # OUT's database and held OUT against the next run.
    # And an earlier run's output stays: it was deleted before the checks.
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "model.pt").write_text("the last run's model")
    with pytest.raises(SystemExit) as exit_code:
        main(["up", "--job", str(ROOT / "examples" / "jobs" / "tiny.yaml"), "--out", str(tmp_path / "o"), *options])
    assert exit_code.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "o" / "drover.db").exists()
    assert (tmp_path / "o" / "model.pt").read_text() == "the last run's model"


def test_up_leaves_the_output_of_a_run_still_going_in_its_folder(tmp_path, capsys):
    # A drover up killed outright left its server running there; the next one deleted that run's
    # trace and events before it found the database in use.
    import fcntl

    out = tmp_path / "o"
    out.mkdir()
    (out / "trace.jsonl").write_text("{}\n")
    with open(out / "drover.db.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running server holds it
        with pytest.raises(SystemExit) as exit_code:
            main(["up", "--job", str(ROOT / "examples" / "jobs" / "tiny.yaml"), "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_code.value.code == 2 and "in use by another drover server" in err and "another --out" in err
    assert (out / "trace.jsonl").read_text() == "{}\n"


def test_a_token_name_stays_in_its_folder_and_a_missing_file_is_one_line(tmp_path, capsys):
    certs = tmp_path / "certs"
    main(["certs", "init", "--dir", str(certs), "--node", "node-0"])
    before = (certs / "tokens.json").read_text()
    with pytest.raises(SystemExit) as exit_code:  # it wrote an admin token to ../leak.token
        main(["certs", "add-token", "../leak", "--role", "admin", "--dir", str(certs)])
    assert exit_code.value.code == 2 and "token name '../leak'" in capsys.readouterr().err
    assert not (tmp_path / "leak.token").exists() and (certs / "tokens.json").read_text() == before
    with pytest.raises(SystemExit) as exit_code:  # was a FileNotFoundError traceback
        main(["agent", "--node", "node-7", "--tls-dir", str(certs), "--control-plane", "127.0.0.1:1"])
    err = capsys.readouterr().err
    hint = f"no such file (drover certs add-node node-7 makes it, with --dir {certs})"  # how to make one
    assert exit_code.value.code == 2 and err == f"drover: error: {certs}/node-node-7.key: {hint}\n"


@pytest.mark.parametrize(
    "args", [["job", "list", "--control-plane", "127.0.0.1:99999"], ["server", "--listen", "127.0.0.1:99999"]]
)
def test_a_port_past_65535_is_refused_not_wrapped(args, capsys):
    # 99999 was dialled and served as 34463.
    with pytest.raises(SystemExit) as exit_code:
        main(args)
    assert exit_code.value.code == 2 and "'127.0.0.1:99999': expected HOST:PORT" in capsys.readouterr().err


def test_ctrl_c_is_exit_130_not_a_failed_jobs_1(monkeypatch, capsys):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr("drover.cli.offline.load_cluster", interrupted)
    with pytest.raises(SystemExit) as exit_code:
        main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL)])
    assert exit_code.value.code == 130 and "aborted" in capsys.readouterr().err


def test_a_job_with_no_step_yet_shows_none_not_minus_one():
    from drover.cli.remote import _job_rows

    shown = _job_rows([jobs_pb2.Job(id="job-1", model_name="tiny", step=-1, steps=30)]).splitlines()[-1].split()
    assert shown[:5] == ["job-1", "-", "unspecified", "tiny", "0/30"]
    # Steps done, as job watch shows them: a completed 30-step job read 29 of 30 here.
    named = jobs_pb2.Job(id="job-2", model_name="tiny", step=29, steps=30)
    named.spec.name = "long run"
    assert _job_rows([named]).splitlines()[-1].split()[:6] == ["job-2", "long", "run", "unspecified", "tiny", "30/30"]


def test_json_logs_carry_what_else_writes_to_stderr_as_json_lines(tmp_path):
    """--log-format json: gRPC's C-core lines, warnings and an uncaught exception are JSON lines
    too, for a log shipper that parses every line."""
    script = tmp_path / "daemon.py"
    script.write_text(
        "import logging, os, warnings\n"
        "from drover.cli.daemons import _log_to_stderr\n"
        "_log_to_stderr('json')\n"
        "logging.getLogger('drover.server').info('serving')\n"
        "os.write(2, b'E1207 06:12:00.123456 12345 ssl_transport.cc:12] handshake failed\\n')\n"
        "warnings.warn('careful')\n"
        "import threading\n"
        "t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()\n"
        "raise RuntimeError('start-up failed')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each one JSON
    by_message = {line["message"]: line for line in lines}
    assert by_message["serving"]["logger"] == "drover.server"
    core = by_message["E1207 06:12:00.123456 12345 ssl_transport.cc:12] handshake failed"]
    assert (core["logger"], core["level"]) == ("stderr", "error")
    assert any("UserWarning: careful" in m for m in by_message)
    in_thread = by_message["uncaught ZeroDivisionError: division by zero"]  # one line, its traceback whole
    assert "Traceback" in in_thread["exception"]
    crash = by_message["uncaught RuntimeError: start-up failed"]
    assert crash["level"] == "critical" and "Traceback" in crash["exception"]


def test_a_job_file_refused_here_is_not_shown_as_the_servers_answer(tmp_path):
    # It read "INVALID_ARGUMENT: ...", as if a control plane had answered (none was asked).
    done = run_cli("job", "submit", str(tmp_path / "nope.yaml"), "--insecure", "--control-plane", "127.0.0.1:1")
    assert done.returncode == 2 and "INVALID_ARGUMENT" not in done.stderr
    assert "nope.yaml" in done.stderr and "a readable job file" in done.stderr and len(done.stderr.splitlines()) == 1
