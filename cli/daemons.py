"""The long-running processes: `drover server` (the control plane) and
`drover agent` (a node agent), both at lowered CPU priority until stopped."""

from __future__ import annotations

import asyncio
import atexit
import datetime
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import click

from drover.control_plane.detector import SETTINGS, DetectorSettings
from drover.control_plane.identity import ROLES, add_node, add_token, make_credentials
from drover.metrics import MetricsError, split_address
from drover.planner.wire import is_loopback

from .options import check_address, insecure_option

DAEMON_NICENESS = 10  # the server and agents yield the CPU to training where they share it


def lower_priority(by: int) -> None:
    """Niceness +`by`, and on Linux SCHED_BATCH: a daemon thread that wakes then waits for the
    running worker's time slice to end instead of preempting it, yet keeps its fair share, so
    it cannot starve. Linux keeps both per thread and new threads inherit their creator's:
    every thread there is now (an import may have started some) is changed, later ones follow."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        os.nice(by)
        return
    for tid in (int(t.name) for t in tasks.iterdir()):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + by, 19))
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except ProcessLookupError:
            pass  # that thread has ended


# Set by drover up (LocalCluster) to its own pid: a daemon whose parent is gone stops as on SIGTERM.
# A drover up killed outright (SIGKILL) left its server, agents and their workers training with
# parent 1, and the server holding OUT's database against the next run.
STOP_WITH_PARENT = "DROVER_STOP_WITH_PARENT"


async def _stop_when_orphaned(parent: int, stop, every_s: float = 1.0) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(every_s)
    logging.getLogger("drover").warning("the process that started this one (pid %d) is gone: stopping", parent)
    stop()


def run_until_stopped(main) -> None:
    """Run a daemon's coroutine at lowered CPU priority until SIGTERM or SIGINT, then let it
    clean up. Telemetry can wait a few milliseconds; a training step that waits for a daemon
    holds up the whole pipeline. Both signals are handled explicitly: SIGTERM is what docker
    and `drover up` send, and a shell that starts us in the background leaves SIGINT ignored,
    so Python's KeyboardInterrupt would never come. A second signal does not cut the clean-up
    short (SIGKILL still does)."""
    lower_priority(DAEMON_NICENESS)

    async def guarded():
        task, loop = asyncio.current_task(), asyncio.get_running_loop()

        def stop():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, lambda: None)
            task.cancel()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop)
        parent = os.environ.get(STOP_WITH_PARENT)
        if parent:
            watcher = loop.create_task(_stop_when_orphaned(int(parent), stop))  # noqa: F841 (the loop holds tasks weakly)
        try:
            await main
        except asyncio.CancelledError:
            pass

    asyncio.run(guarded())


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and what the call gave as `extra`
    (event, node, job_id, step, details...), for a log shipper to index."""

    PLAIN = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line = {
            "time": when.isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line |= {k: v for k, v in vars(record).items() if k not in self.PLAIN}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def log_options(command):
    """--log-format and --log-level, for the daemons."""
    command = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
        envvar="DROVER_LOG_LEVEL",
    )(command)
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="DROVER_LOG_FORMAT",
        help="json: one object a line, with the event's fields (agent_connected, job_started, plan_pushed...).",
    )(command)


def _log_to_stderr(log_format: str = "text", log_level: str = "info") -> None:
    if log_format == "json":
        handler = logging.StreamHandler(_stderr_as_json_lines())
        handler.setFormatter(JsonLines())
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)


# gRPC's C core writes "E1207 06:12:00.123456 12345 file.cc:12] message" (its level first).
_CORE_LEVELS = {"E": logging.ERROR, "W": logging.WARNING, "I": logging.INFO, "D": logging.DEBUG}


def _thread_uncaught(uncaught):
    def hook(args) -> None:  # a thread's uncaught exception, as the main thread's (SystemExit ends it quietly)
        if not issubclass(args.exc_type, SystemExit):
            uncaught(args.exc_type, args.exc_value, args.exc_traceback)

    return hook


def _stderr_as_json_lines():
    """With --log-format json, whatever else writes to the process's stderr (gRPC's C core, an
    uncaught exception's traceback, Python's warnings) comes out as JSON lines too: fd 2 becomes
    a pipe whose lines a thread logs as logger "stderr". Returns the real stderr, for the log's
    own handler. An uncaught exception is logged whole, as one line with its traceback."""
    real = os.fdopen(os.dup(2), "w", buffering=1)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    stderr_log = logging.getLogger("stderr")

    def relay() -> None:
        with os.fdopen(read, errors="replace") as lines:
            for line in lines:
                line = line.rstrip("\n")
                if line:
                    stderr_log.log(
                        _CORE_LEVELS.get(line[:1], logging.ERROR) if line[1:2].isdigit() else logging.ERROR, line
                    )

    relaying = threading.Thread(target=relay, name="stderr-as-json", daemon=True)
    relaying.start()

    def uncaught(kind, exc, tb) -> None:
        logging.getLogger("drover").critical("uncaught %s: %s", kind.__name__, exc, exc_info=(kind, exc, tb))

    def drain() -> None:  # at exit: what is still in the pipe is logged before the process goes
        os.dup2(real.fileno(), 2)
        # Not until its end: a child started since (the agent's worker launcher) holds the pipe.
        relaying.join(0.2)

    sys.excepthook = uncaught
    threading.excepthook = _thread_uncaught(uncaught)
    atexit.register(drain)
    return real


def detector_options(command):
    """One option per detection setting, e.g. --healthy-below or $DROVER_HEALTHY_BELOW;
    the defaults are DetectorSettings' (Malleus's values)."""
    for setting in reversed(SETTINGS):
        command = click.option(
            f"--{setting.name.replace('_', '-')}",
            setting.name,
            type=type(setting.default),
            default=setting.default,
            show_default=True,
            envvar=f"DROVER_{setting.name.upper()}",
            help=setting.metadata["help"],
        )(command)
    return command


@click.command()
@click.option(
    "--db", default="drover.db", show_default=True, envvar="DROVER_DB", help="SQLite file, or any SQLAlchemy URL."
)
@click.option(
    "--listen",
    default="127.0.0.1:50051",
    show_default=True,
    envvar="DROVER_LISTEN",
    callback=check_address,
    help="Address for clients (the job service: TLS and a bearer token).",
)
@click.option(
    "--agent-listen",
    default="127.0.0.1:50052",
    show_default=True,
    envvar="DROVER_AGENT_LISTEN",
    callback=check_address,
    help="Address for agents (the agent stream: mutual TLS, each certificate naming its node).",
)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False, exists=True),
    envvar="DROVER_TLS_DIR",
    help="ca.pem, server.pem, server.key and tokens.json (drover certs init makes them).",
)
@insecure_option
@click.option(
    "--metrics",
    "metrics_address",
    metavar="HOST:PORT",
    envvar="DROVER_METRICS",
    help="Serve Prometheus metrics at http(s)://HOST:PORT/metrics (HTTPS with the server's certificate "
    "under --tls-dir). Off by default.",
)
@click.option("--emulation", is_flag=True, envvar="DROVER_EMULATION", help="Allow `drover straggle` (admin only).")
@click.option("--new-db", is_flag=True, help="Start empty where a database this server used has gone missing.")
@log_options
@detector_options
def server(
    db: str,
    listen: str,
    agent_listen: str,
    tls_dir: str | None,
    insecure: bool,
    metrics_address: str | None,
    emulation: bool,
    new_db: bool,
    log_format: str,
    log_level: str,
    **settings,
) -> None:
    """Run the control plane. Every option also reads DROVER_<NAME> (e.g. DROVER_MIN_GAIN)."""
    from drover.control_plane.server import check_loopback, serve

    if (tls_dir is None) == (not insecure):
        raise click.UsageError("give --tls-dir DIR (drover certs init makes one) or --insecure (loopback only)")
    try:
        if insecure:
            check_loopback(listen, agent_listen, *([metrics_address] if metrics_address else []))
        detector = DetectorSettings(**settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    _log_to_stderr(log_format, log_level)
    # The database it creates (and SQLite's journal) for its own user only: it holds what the API
    # shows readers only with a token. A file that exists keeps its mode.
    os.umask(0o077)
    run_until_stopped(
        serve(
            db,
            listen,
            agent_address=agent_listen,
            tls_dir=tls_dir,
            emulation=emulation,
            new_db=new_db,
            detector=detector,
            metrics_address=metrics_address,
        )
    )


@click.command()
@click.option(
    "--control-plane",
    "address",
    default="127.0.0.1:50052",
    show_default=True,
    envvar="DROVER_AGENT_CONTROL_PLANE",
    callback=check_address,
    help="host:port of the control plane's agent port.",
)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False, exists=True),
    envvar="DROVER_TLS_DIR",
    help="ca.pem and node-NODE.pem/.key of this node (drover certs init makes them).",
)
@insecure_option
@click.option("--node", default=socket.gethostname(), show_default=True, help="This node's name.")
@click.option(
    "--cpu-devices",
    type=click.IntRange(min=0),
    default=0,
    help="Run this many CPU devices instead of discovering GPUs.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=0.5,
    show_default=True,
    help="Seconds between telemetry messages.",
)
@click.option("--work-dir", default=".drover-agent", show_default=True, help="Where job inboxes live.")
@click.option(
    "--data-root",
    default="drover-data",
    show_default=True,
    envvar="DROVER_DATA_ROOT",
    help="Jobs' outputs go here, each in the folder its job names (never outside).",
)
@click.option(
    "--emulate",
    "emulate_file",
    metavar="FILE",
    help="Be node --node of the emulated cluster in this cluster file: paced CPU devices timed as its GPUs "
    "(tflops x the model's mfu, slower by its rates), its NICs and links, instead of this machine's.",
)
@click.option(
    "--model-modules",
    default="",
    envvar="DROVER_MODEL_MODULES",
    help="Comma-separated Python modules whose functions custom models (family custom) may name as "
    "entry_point; their submodules too. None by default: a job names code its workers import.",
)
@click.option(
    "--metrics",
    "metrics_address",
    metavar="HOST:PORT",
    envvar="DROVER_AGENT_METRICS",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP: bind it where only your "
    "Prometheus reaches). Off by default.",
)
@click.option(
    "--probe-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="TCP port for other agents' link probes (0: any free one); fix it to open it in a firewall.",
)
@click.option(
    "--advertise-addr",
    "advertise_address",
    default="",
    metavar="IP",
    help="The address this node's workers are reached at by other nodes, when it is not the one the agent "
    "connects to the control plane from (NAT, a separate management network).",
)
@log_options
def agent(
    address: str,
    tls_dir: str | None,
    insecure: bool,
    node: str,
    cpu_devices: int,
    interval: float,
    work_dir: str,
    data_root: str,
    emulate_file: str | None,
    model_modules: str,
    metrics_address: str | None,
    log_format: str,
    log_level: str,
    advertise_address: str,
    probe_port: int,
) -> None:
    """Run a node agent: discover devices and NICs, stream telemetry, run workers."""
    from drover.agent.daemon import Agent

    if (tls_dir is None) == (not insecure):
        raise click.UsageError("give --tls-dir DIR (with this node's certificate) or --insecure (loopback only)")
    if insecure and not is_loopback(address):
        raise click.UsageError(f"--insecure reaches a loopback control plane only, not {address}")
    _log_to_stderr(log_format, log_level)
    emulate = None
    if emulate_file:
        from drover.planner.cluster import load_cluster

        if cpu_devices:
            raise click.UsageError("--emulate gives the devices; leave out --cpu-devices")
        emulate = load_cluster(emulate_file)
        if node not in emulate.node_index:
            names = ", ".join(n.name for n in emulate.nodes)
            raise click.BadParameter(f"{node!r} is not a node of {emulate_file} ({names})", param_hint="--node")
    modules = tuple(m.strip() for m in model_modules.split(",") if m.strip())
    if metrics_address:
        try:
            split_address(metrics_address, "--metrics")  # refused before anything starts
        except MetricsError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics") from None
    work = f"{work_dir}/{node}"
    if advertise_address:
        try:
            ipaddress.ip_address(advertise_address)
        except ValueError:
            raise click.BadParameter(f"{advertise_address!r}: an IP address", param_hint="--advertise-addr") from None
    agent = Agent(
        *(address, node, cpu_devices, interval, work, data_root, tls_dir, modules, emulate, metrics_address),
        advertise_address,
        probe_port,
    )
    run_until_stopped(agent.run_forever())


@click.group()
def certs() -> None:
    """Create a small cluster's CA, certificates and client tokens."""


@certs.command("init")
@click.option("--dir", "folder", default="certs", show_default=True, help="Where the files go (new or empty).")
@click.option("--node", "nodes", multiple=True, help="A node to make an agent certificate for; repeatable.")
@click.option(
    "--server-name",
    "server_names",
    multiple=True,
    help="A name or address clients and agents dial the control plane by; repeatable "
    "(localhost, 127.0.0.1 and ::1 are always included).",
)
def certs_init(folder: str, nodes: tuple[str, ...], server_names: tuple[str, ...]) -> None:
    """A CA, the control plane's certificate, one per --node, and admin, operator and reader tokens."""
    path = Path(folder)
    if path.exists() and any(path.iterdir()):
        raise click.UsageError(f"{folder} is not empty: certs init never overwrites a CA")
    make_credentials(path, list(nodes), ["localhost", "127.0.0.1", "::1", *server_names])
    click.echo(
        f"{folder}: ca.pem, server.pem, "
        + "".join(f"node-{n}.pem, " for n in nodes)
        + "admin.token, operator.token, reader.token (keep ca.key and the tokens private)"
    )


@certs.command("add-node")
@click.argument("node")
@click.option("--dir", "folder", default="certs", show_default=True)
def certs_add_node(node: str, folder: str) -> None:
    """A certificate for a node joining the cluster (or a new one for a node: rotation)."""
    try:
        add_node(Path(folder), node)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NODE") from None
    click.echo(f"{folder}/node-{node}.pem")


@certs.command("add-token")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--dir", "folder", default="certs", show_default=True)
def certs_add_token(name: str, role: str, folder: str) -> None:
    """A bearer token for a client; an existing token of that name stops working (rotation).
    The server reads tokens.json at start: restart it to apply."""
    try:
        add_token(Path(folder), name, role)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    click.echo(f"{folder}/{name}.token ({role})")
