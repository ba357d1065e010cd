"""Commands that need no control plane: plan, simulate and train."""

from __future__ import annotations

import json

import click

from drover.planner.cluster import load_cluster
from drover.planner.model import load_model
from drover.planner.plan import load_plan
from drover.planner.search import STRATEGIES, make_plan
from drover.planner.simulate import load_events
from drover.planner.simulate import simulate as simulate_run
from drover.planner.spec_io import load_mapping
from drover.planner.training import Optimizer, Schedule, training_from_dict

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
    cluster, model = load_cluster(cluster_file), load_model(model_file)
    result = make_plan(cluster, model, strategy)
    click.echo(result.to_json() if as_json else render_plan(result, cluster, model))


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
    cluster, model = load_cluster(cluster_file), load_model(model_file)
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
@click.option("--model", "model_file", required=True, metavar="FILE", help="Model file (YAML or JSON).")
@click.option("--reference", is_flag=True, help="One process, no parallelism: what every plan must match.")
@click.option("--workers", type=click.IntRange(min=1), help="Local worker processes, devices local/0..N-1.")
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
    help="Emulated straggler: DEVICE waits (RATE-1)x its compute time from STEP; repeatable.",
)
@click.option(
    "--optimizer",
    "optimizer_file",
    metavar="FILE",
    help="YAML/JSON with `optimizer` and/or `schedule`, as in a job file (default: AdamW, constant lr).",
)
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Training steps.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the model and the data.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    metavar="DIR",
    help="Writes trace.jsonl, migrations.jsonl, model.pt (and telemetry/).",
)
def train(model_file, reference, workers, plan_file, switches, slow, optimizer_file, steps, seed, out_dir) -> None:
    """Train the model, on local workers following plans or as the single-process reference."""
    from drover.agent.runtime.launch import train_reference, train_workers  # torch loads only for this command

    spec = load_model(model_file)
    optim, schedule = Optimizer(), Schedule()
    if optimizer_file:
        optim, schedule = training_from_dict(load_mapping(optimizer_file, "optimizer"), optimizer_file)
    if reference:
        if workers or plan_file or switches or slow:
            raise click.UsageError("--reference takes only --model, --optimizer, --steps, --seed and --out")
        train_reference(spec, steps, seed, out_dir, optim, schedule)
        return
    if not workers or not plan_file:
        raise click.UsageError("--workers and --plan are required without --reference")
    plans = [(0, load_plan(plan_file))] + [(step, load_plan(path)) for step, path in switches]
    train_workers(spec, workers, plans, steps, seed, out_dir, slow, optim, schedule=schedule)
