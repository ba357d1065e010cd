"""The `drover` command line: thin click commands over library functions.

Errors are mapped to exit codes in one place, `main`: bad input (a spec file,
a plan, a usage mistake) prints one line on stderr and exits 2.
"""

from __future__ import annotations

import json
import sys

import click

from .planner.cluster import load_cluster
from .planner.errors import PlanError, SpecError
from .planner.model import load_model
from .planner.search import STRATEGIES, make_plan
from .planner.simulate import load_events, simulate as simulate_run
from .render import render_plan, render_simulation


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Drover keeps hybrid-parallel training fast when GPUs straggle and networks differ."""


@cli.command()
@click.option("--cluster", "cluster_file", required=True, metavar="FILE", help="Cluster file (YAML or JSON).")
@click.option("--model", "model_file", required=True, metavar="FILE", help="Model file (YAML or JSON).")
@click.option("--strategy", type=click.Choice(list(STRATEGIES)), default="drover", show_default=True,
              help="drover: the three-phase planner; uniform, drop: the Megatron-style baselines.")
@click.option("--json", "as_json", is_flag=True, help="Print only the plan JSON of the spec.")
def plan(cluster_file: str, model_file: str, strategy: str, as_json: bool) -> None:
    """Plan GPU groups, pipeline stages, layers and micro-batches for a cluster."""
    cluster, model = load_cluster(cluster_file), load_model(model_file)
    result = make_plan(cluster, model, strategy)
    click.echo(result.to_json() if as_json else render_plan(result, cluster, model))


@cli.command()
@click.option("--cluster", "cluster_file", required=True, metavar="FILE", help="Cluster file (YAML or JSON).")
@click.option("--model", "model_file", required=True, metavar="FILE", help="Model file (YAML or JSON).")
@click.option("--events", "events_file", required=True, metavar="FILE",
              help="Events: devices that slow, recover or fail, nodes that join (YAML).")
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


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="drover", standalone_mode=False)
    except (SpecError, PlanError) as exc:
        click.echo(f"drover: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("drover: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        click.echo(f"drover: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)

