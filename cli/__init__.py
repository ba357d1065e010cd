"""The `drover` command line: thin click commands over library functions.

The group is assembled here from the command modules: offline.py (plan,
simulate, train), data.py (data prepare, data tokenizer, export), remote.py (commands that talk to a control plane),
daemons.py (server, agent) and up.py (a local cluster and one job). Errors
are mapped to exit codes in one place, `main`: bad input (a spec file, a
plan, a usage mistake) prints one line on stderr and exits 2.
"""

from __future__ import annotations

import sys

import click
import grpc

from drover.control_plane.errors import StartError
from drover.metrics import MetricsError
from drover.planner.errors import PlanError, SpecError
from drover.storage.errors import StoreError

from . import daemons, data, offline, remote, report, up
from .local_cluster import LocalClusterError
from .options import environment_for_every_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="drover", prog_name="drover", message="%(prog)s %(version)s")
def cli() -> None:
    """Drover keeps hybrid-parallel training fast when GPUs straggle and networks differ."""


for command in (
    offline.plan,
    offline.simulate,
    offline.train,
    data.data,
    data.export,
    up.up,
    daemons.server,
    daemons.agent,
    daemons.certs,
    remote.job,
    remote.nodes,
    remote.telemetry,
    remote.replan,
    remote.detect,
    remote.node,
    remote.straggle,
    report.report,
):
    cli.add_command(command)
# `drover plan` plans offline; its subcommands read a running job's plans.
offline.plan.add_command(remote.plan_show)
offline.plan.add_command(remote.plan_history)
environment_for_every_option(cli)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="drover", standalone_mode=False)
        if isinstance(code, int) and code:  # click.exceptions.Exit(code): a command's own status
            sys.exit(code)
    except (SpecError, PlanError) as exc:
        click.echo(f"drover: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("drover: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        click.echo(f"drover: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except grpc.RpcError as exc:  # drover.client's DroverError is one
        click.echo(f"drover: error: {exc.code().name}: {exc.details()}", err=True)
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            click.echo(
                "drover: no control plane answered at that address: start one (drover server, or drover up), "
                "or give its address with --control-plane HOST:PORT or DROVER_CONTROL_PLANE",
                err=True,
            )
        sys.exit(2 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except (LocalClusterError, StoreError, StartError, MetricsError) as exc:
        click.echo(f"drover: error: {exc}", err=True)
        sys.exit(1)
