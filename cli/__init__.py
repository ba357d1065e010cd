"""The `drover` command line: thin click commands over library functions.

The group is assembled here from the command modules, each imported when its
command is named (COMMANDS): offline.py (plan, simulate, train), data.py (data
prepare, data tokenizer, export), remote.py (commands that talk to a control
plane), daemons.py (server, agent), up.py (a local cluster and one job),
report.py and compile_planner.py. Errors
are mapped to exit codes in one place, `main`: bad input (a spec file, a
plan, a usage mistake) prints one line on stderr and exits 2.
"""

from __future__ import annotations

import importlib
import os
import sys

# gRPC's C core logs a failed TLS handshake on stderr at INFO unless told otherwise, before the
# one line main prints for it; read when grpc loads, so set first (an operator's value wins).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import click  # noqa: E402
import grpc  # noqa: E402

from drover.planner.errors import PlanError, SpecError

from .options import environment_for_every_option


def _plan() -> click.Command:
    """`drover plan` plans offline, and `plan check` checks a plan; its other subcommands read
    a running job's plans."""
    from . import offline, remote

    offline.plan.add_command(offline.plan_check)
    offline.plan.add_command(remote.plan_show)
    offline.plan.add_command(remote.plan_history)
    return offline.plan


# Each command's module is imported when the command is named: `drover job list` does not load
# the planner's search, the server, the local cluster or the metrics exporter.
COMMANDS = {
    "plan": _plan,
    **{name: f"offline:{name}" for name in ("simulate", "train")},
    **{name: f"data:{name}" for name in ("data", "export")},
    "up": "up:up",
    **{name: f"daemons:{name}" for name in ("server", "agent", "certs")},
    **{name: f"remote:{name}" for name in ("job", "nodes", "telemetry", "replan", "detect", "node", "straggle")},
    "report": "report:report",
    "compile-planner": "compile_planner:compile_planner",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            where = COMMANDS[name]
            if callable(where):
                command = where()
            else:
                module, attribute = where.split(":")
                command = getattr(importlib.import_module(f".{module}", __name__), attribute)
            # every option reads DROVER_<COMMAND PATH>_<OPTION> (see environment_for_every_option)
            environment_for_every_option(command, f"DROVER_{name.replace('-', '_')}")
            self.add_command(command, name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="drover", prog_name="drover", message="%(prog)s %(version)s")
def cli() -> None:
    """Drover keeps hybrid-parallel training fast when GPUs straggle and networks differ."""


environment_for_every_option(cli)
# Errors a command reports as one line, exit 1, by the module that raises them: a module that
# was never imported raised none, so main need not import it to catch them.
RUN_ERRORS = (
    ("drover.agent.daemon", "AgentReplaced"),
    ("drover.cli.local_cluster", "LocalClusterError"),
    ("drover.storage.errors", "StoreError"),
    ("drover.control_plane.errors", "StartError"),
    ("drover.metrics", "MetricsError"),
)


def _run_error(exc: Exception) -> bool:
    loaded = tuple(getattr(sys.modules[m], name) for m, name in RUN_ERRORS if m in sys.modules)
    return isinstance(exc, loaded)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="drover", standalone_mode=False)
        if isinstance(code, int) and code:  # click.exceptions.Exit(code): a command's own status
            sys.exit(code)
    except (SpecError, PlanError) as exc:
        click.echo(f"drover: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:  # Ctrl-C: 128 + SIGINT, as a shell reports it, never a job's 1 (failed)
        click.echo("drover: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"drover: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except grpc.RpcError as exc:  # drover.client's DroverError is one
        if not getattr(exc, "sent", True):  # refused here (a job file): not the control plane's answer
            click.echo(f"drover: error: {exc.details()}", err=True)
            sys.exit(2)
        click.echo(f"drover: error: {exc.code().name}: {exc.details()}", err=True)
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            click.echo(
                "drover: no control plane answered at that address: start one (drover server, or drover up), "
                "or give its address with --control-plane HOST:PORT or DROVER_CONTROL_PLANE",
                err=True,
            )
        sys.exit(2 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except OSError as exc:
        if exc.filename is None:  # not about a file the user named: a bug, with its traceback
            raise
        # A file a command needs and cannot read or write: a node's certificate, tokens.json.
        click.echo(f"drover: error: {exc.filename}: {exc.strerror}", err=True)
        sys.exit(2)
    except Exception as exc:
        if not _run_error(exc):
            raise
        click.echo(f"drover: error: {exc}", err=True)
        sys.exit(1)
