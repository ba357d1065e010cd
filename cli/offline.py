"""Commands that need no control plane: plan, simulate and train."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console

from drover.planner.cluster import load_cluster
from drover.planner.cost import validate, with_prediction
from drover.planner.plan import load_plan
from drover.planner.search import STRATEGIES, make_plan
from drover.planner.simulate import load_events
from drover.planner.simulate import simulate as simulate_run
from drover.planner.spec_io import Fields
from drover.planner.training import Training, relative_path

from .models import ModelReader, read_model
from .options import parse_slowdowns
from .render import render_plan, render_simulation


@click.group(invoke_without_command=True)
@click.option("--cluster", "cluster_file", metavar="FILE", help="Cluster file (YAML or JSON).")
@click.option("--model", "model_file", metavar="FILE", help="Model file (YAML or JSON).")
@click.option(
    "--strategy",
    type=click.Choice(list(STRATEGIES)),
    default="drover",
    show_default=True,
    help="drover: the three-phase planner; uniform, drop: the Megatron-style baselines.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the plan JSON of the spec.")
@click.pass_context
def plan(ctx, cluster_file: str, model_file: str, strategy: str, as_json: bool) -> None:
    """Plan GPU groups, pipeline stages, layers and micro-batches for a cluster.

    With --cluster and --model: plan offline. `plan show` and `plan history`
    read a running job's plans from the control plane."""
    if ctx.invoked_subcommand is not None:
        return
    if not cluster_file or not model_file:
        raise click.UsageError("--cluster and --model are required to plan offline")
    cluster, model = load_cluster(cluster_file), read_model(model_file)
    result = make_plan(cluster, model, strategy)
    click.echo(result.to_json() if as_json else render_plan(result, cluster, model))


@click.command("check")
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", required=True, metavar="FILE", help="Cluster file (YAML or JSON).")
@click.option("--model", "model_file", required=True, metavar="FILE", help="Model file (YAML or JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan JSON with the cost model's predicted figures.")
def plan_check(plan_file: str, cluster_file: str, model_file: str, as_json: bool) -> None:
    """Check a plan (the spec's plan JSON, yours or another tool's) against a cluster and a
    model: the first rule it breaks, or what the cost model predicts for it."""
    cluster, model = load_cluster(cluster_file), read_model(model_file)
    plan = load_plan(plan_file)
    validate(plan, cluster, model)  # PlanError: exit 2, naming the rule
    checked = with_prediction(plan, cluster, model)
    click.echo(checked.to_json() if as_json else render_plan(checked, cluster, model))


@click.command()
@click.option("--cluster", "cluster_file", required=True, metavar="FILE", help="Cluster file (YAML or JSON).")
@click.option("--model", "model_file", required=True, metavar="FILE", help="Model file (YAML or JSON).")
@click.option(
    "--events",
    "events_file",
    required=True,
    metavar="FILE",
    help="Events: devices that slow, recover or fail, nodes that join (YAML).",
)
@click.option("--steps", type=click.IntRange(min=1), default=1000, show_default=True, help="Training steps.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def simulate(cluster_file: str, model_file: str, events_file: str, steps: int, as_json: bool) -> None:
    """Replay a run under changing device rates for drover, uniform and drop-and-restart."""
    cluster, model = load_cluster(cluster_file), read_model(model_file)
    runs = simulate_run(cluster, model, load_events(events_file, cluster), steps)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in runs], indent=2))
    else:
        click.echo(render_simulation(runs))


def _parse_switch(ctx, param, values) -> list[tuple[int, str]]:
    out = []
    for value in values:
        step, sep, path = value.partition(":")
        if not sep or not step.isdigit() or int(step) < 1 or not path:
            raise click.BadParameter(f"{value!r}: expected STEP:FILE with STEP >= 1", param=param)
        out.append((int(step), path))
    steps = [s for s, _ in out]
    if steps != sorted(set(steps)):
        raise click.BadParameter(f"steps {steps}: each switch needs a later step than the one before", param=param)
    return out


def _parse_slow(ctx, param, values) -> dict[str, tuple[float, int]]:
    return {device: (rate, step) for device, rate, step in parse_slowdowns(values, param, "local/1=3@5", 0)}


@click.command()
@click.option(
    "--job", "job_file", metavar="FILE", help="Job file: model, steps, seed, optimizer, data, init, checkpoint..."
)
@click.option("--model", "model_file", metavar="FILE", help="Model file, for a plain job without --job.")
@click.option("--steps", type=click.IntRange(min=1), help="Training steps (with --model; overrides the job's).")
@click.option("--seed", type=click.IntRange(min=0), help="Seeds the model and the data (with --model: default 0).")
@click.option("--reference", is_flag=True, help="One process, no parallelism: what every plan must match.")
@click.option("--workers", type=click.IntRange(min=1), help="Local worker processes, devices local/0..N-1.")
@click.option(
    "--cluster",
    "cluster_file",
    metavar="FILE",
    help="Paced devices: one worker per device of this cluster file (the plan names its devices), each taking "
    "the time its GPU would (tflops x the model's mfu), slower by the file's rates and --slow.",
)
@click.option("--plan", "plan_file", metavar="FILE", help="The plan to start with (plan JSON of the spec).")
@click.option(
    "--switch",
    "switches",
    multiple=True,
    callback=_parse_switch,
    metavar="STEP:FILE",
    help="Switch live to another plan at a step; repeatable.",
)
@click.option(
    "--slow",
    multiple=True,
    callback=_parse_slow,
    metavar="DEVICE=RATE@STEP",
    help="Emulated straggler: DEVICE is RATE times slower from STEP (waits (RATE-1)x its compute, or is paced "
    "RATE times slower with --cluster); repeatable.",
)
@click.option("--resume", metavar="DIR", help="Continue from the newest checkpoint in DIR (under any plan).")
@click.option(
    "--data-root",
    default=".",
    show_default=True,
    metavar="DIR",
    help="The job's data, init, checkpoint and resume paths are relative to it.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    metavar="DIR",
    help="Writes trace.jsonl, migrations.jsonl, eval.jsonl, model.pt (and telemetry/).",
)
def train(
    job_file,
    model_file,
    steps,
    seed,
    reference,
    workers,
    cluster_file,
    plan_file,
    switches,
    slow,
    resume,
    data_root,
    out_dir,
) -> None:
    """Train a job on local workers following plans, or as the single-process reference."""
    from drover.control_plane.jobfile import load_job

    if bool(job_file) == bool(model_file):
        raise click.UsageError("give one of --job FILE or --model FILE")
    if job_file:
        job = load_job(job_file, ModelReader())
        spec, training = job.model, job.training
        training = replace(training, steps=steps or training.steps, seed=training.seed if seed is None else seed)
    else:
        if not steps:
            raise click.UsageError("--steps is required with --model")
        spec, training = read_model(model_file), Training(steps, seed or 0)
    if resume:
        training = replace(training, resume=relative_path(Fields({"resume": resume}, "--resume"), "resume"))
    if reference:
        if workers or cluster_file or plan_file or switches or slow or resume:
            raise click.UsageError("--reference takes only --job or --model, --steps, --seed, --data-root and --out")
        from drover.agent.runtime.launch import train_reference  # torch loads once the input is checked

        train_reference(spec, training, out_dir, data_root)
    else:
        paced = load_cluster(cluster_file) if cluster_file else None
        if paced is not None:
            if workers not in (None, len(paced.devices)):
                raise click.UsageError(f"--workers {workers}: {cluster_file} has {len(paced.devices)} devices")
            workers = len(paced.devices)
        if not workers or not plan_file:
            raise click.UsageError("--workers (or --cluster) and --plan are required without --reference")
        plans = [(0, load_plan(plan_file))] + [(step, load_plan(path)) for step, path in switches]
        from drover.agent.runtime.launch import train_workers

        # SIGTERM ends the run as Ctrl-C does, its workers stopped (they ran on under init).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        with TraceProgress(Path(out_dir), training.steps, spec.seq_len) as progress:
            train_workers(spec, workers, plans, out_dir, training, slow, data_root, progress.update, paced)
    click.echo(final_line(Path(out_dir)))


class TraceProgress:
    """A progress bar over the workers' trace.jsonl: step, loss, tokens/s."""

    def __init__(self, out: Path, steps: int, seq_len: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.path, self.offset, self.seq_len = out / "trace.jsonl", 0, seq_len
        self.bar = Progress(
            TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.description}"),
            TimeRemainingColumn(), transient=True, disable=not sys.stderr.isatty(), console=Console(stderr=True)
        )  # fmt: skip
        self.task = self.bar.add_task("", total=steps)

    def __enter__(self):  # train_workers clears an earlier run's trace, once the run is checked
        self.bar.start()
        return self

    def __exit__(self, *exc):
        self.bar.stop()

    def update(self) -> None:
        from drover.agent.runtime.handoff import new_lines

        rows, self.offset = new_lines(self.path, self.offset)
        if rows:
            last = rows[-1]
            tokens = last["samples_per_s"] * self.seq_len
            self.bar.update(
                self.task, completed=last["step"] + 1, description=f"loss {last['loss']:.4f}  {tokens:,.0f} tok/s"
            )


def final_line(out: Path) -> str:
    """The run's last step and loss, and its last validation loss, for the terminal."""
    rows = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines() if line.strip()]
    if not rows:
        return f"no steps run -> {out}"
    line = f"final loss {rows[-1]['loss']:.4f} at step {rows[-1]['step'] + 1}"
    evals = out / "eval.jsonl"
    if evals.exists() and evals.read_text().strip():
        last = json.loads(evals.read_text().strip().splitlines()[-1])
        line += f", validation loss {last['val_loss']:.4f} at step {last['step']}"
    return f"{line} -> {out}"
