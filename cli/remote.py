"""CLI commands that talk to a control plane: thin wrappers over the job
service. Readable tables by default, --json everywhere."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

import click

from . import client
from . import cli, plan
from .render import table


def _print(message, as_json: bool, render) -> None:
    click.echo(client.to_json(message) if as_json else render(message))


def _job_rows(jobs) -> str:
    return table(["job", "state", "model", "step", "steps", "plan", "committed", "detail"],
                 [[j.id, j.state, j.model_name, j.step, j.steps, j.plan_version, j.committed_plan_version,
                   j.detail[:60]] for j in jobs])


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


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
        try:
            await main
        except asyncio.CancelledError:
            pass
    asyncio.run(guarded())


def _system_command(fn):
    """A command that talks to the control plane at --control-plane (or $DROVER_CONTROL_PLANE)."""
    return click.option("--control-plane", "address", default=client.DEFAULT_ADDRESS, show_default=True,
                        envvar="DROVER_CONTROL_PLANE", help="host:port of the control plane.")(fn)


@cli.command()
@click.option("--db", default="drover.db", show_default=True, help="SQLite file, or any SQLAlchemy URL.")
@click.option("--listen", default="127.0.0.1:50051", show_default=True, help="Address to serve gRPC on.")
def server(db: str, listen: str) -> None:
    """Run the control plane."""
    from drover.control_plane.api import serve
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_until_stopped(serve(db, listen))


@cli.command()
@click.option("--control-plane", "address", default=client.DEFAULT_ADDRESS, show_default=True)
@click.option("--node", default=socket.gethostname(), show_default=True, help="This node's name.")
@click.option("--cpu-devices", type=click.IntRange(min=0), default=0,
              help="Run this many CPU devices instead of discovering GPUs.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="Seconds between telemetry messages.")
@click.option("--work-dir", default=".drover-agent", show_default=True, help="Where job inboxes live.")
def agent(address: str, node: str, cpu_devices: int, interval: float, work_dir: str) -> None:
    """Run a node agent: discover devices and NICs, stream telemetry, run workers."""
    from drover.agent.daemon import Agent
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_until_stopped(Agent(address, node, cpu_devices, interval, f"{work_dir}/{node}").run_forever())


@cli.group()
def job() -> None:
    """Submit, list, follow and cancel jobs."""


@job.command("submit")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", default="", help="Where the job's trace, migrations and model go.")
@_system_command
@json_option
def job_submit(job_file: str, out_dir: str, address: str, as_json: bool) -> None:
    """Submit a job file (model, steps, seed)."""
    path = Path(job_file)
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"{job_file}: {exc.strerror}", param_hint="JOB_FILE")
    submitted = client.connect(address).SubmitJob(client.jobs_pb2.SubmitJobRequest(
        job_yaml=text, base_dir=str(path.parent.resolve()), out_dir=str(Path(out_dir).resolve()) if out_dir else ""))
    _print(submitted, as_json, lambda j: f"submitted {j.id} ({j.model_name}, {j.steps} steps) -> {j.out_dir}")


@job.command("list")
@_system_command
@json_option
def job_list(address: str, as_json: bool) -> None:
    """List jobs."""
    _print(client.connect(address).ListJobs(client.jobs_pb2.ListJobsRequest()), as_json, lambda r: _job_rows(r.jobs))


@job.command("status")
@click.argument("job_id")
@_system_command
@json_option
def job_status(job_id: str, address: str, as_json: bool) -> None:
    """Show one job: state, step, desired and committed plan versions."""
    _print(client.connect(address).GetJob(client.jobs_pb2.GetJobRequest(job_id=job_id)), as_json, lambda j: _job_rows([j]))


@job.command("watch")
@click.argument("job_id")
@_system_command
@json_option
def job_watch(job_id: str, address: str, as_json: bool) -> None:
    """Print the job's events as they happen, until it ends."""
    for event in client.connect(address).WatchEvents(client.jobs_pb2.WatchEventsRequest(job_id=job_id)):
        if as_json:
            click.echo(json.dumps(client.to_dict(event)))
        else:
            details = json.loads(event.details_json)
            details.pop("plan", None)
            click.echo(f"{time.strftime('%H:%M:%S', time.localtime(event.time))} step {event.step:>5}  "
                       f"{event.kind:<20} {json.dumps(details)}")


@job.command("cancel")
@click.argument("job_id")
@_system_command
@json_option
def job_cancel(job_id: str, address: str, as_json: bool) -> None:
    """Cancel a running job: its workers stop."""
    _print(client.connect(address).CancelJob(client.jobs_pb2.CancelJobRequest(job_id=job_id)), as_json, lambda j: _job_rows([j]))


@cli.command()
@_system_command
@json_option
def nodes(address: str, as_json: bool) -> None:
    """List nodes, their devices and NICs."""
    _print(client.connect(address).ListNodes(client.jobs_pb2.ListNodesRequest()), as_json,
           lambda r: table(["node", "connected", "drained", "devices", "nics"],
                           [[n.name, n.connected, n.drained, len(n.devices), ", ".join(n.nics)] for n in r.nodes]))


def _plan_rows(records) -> str:
    return table(["version", "committed", "pipelines", "predicted samples/s", "reason"],
                 [[p.version, p.committed, len(p.plan.pipelines), f"{p.plan.predicted.samples_per_s:.3g}",
                   p.reason[:70]] for p in records])


@plan.command("show")
@click.argument("job_id")
@click.option("--version", type=int, default=0, help="0: the newest.")
@_system_command
@json_option
def plan_show(job_id: str, version: int, address: str, as_json: bool) -> None:
    """Show one plan version of a job."""
    record = client.connect(address).GetPlan(client.jobs_pb2.GetPlanRequest(job_id=job_id, version=version))

    def render(r):
        rows = [[i, p.micro_batches, k, " ".join(s.devices), f"{s.layers[0]}-{s.layers[1]}"]
                for i, p in enumerate(r.plan.pipelines) for k, s in enumerate(p.stages)]
        return (f"{r.job_id} plan v{r.version} ({'committed' if r.committed else 'pending'}): {r.reason}\n"
                + table(["pipeline", "micro", "stage", "devices", "blocks"], rows)
                + f"\nremoved: {' '.join(r.plan.removed) or 'none'}")
    _print(record, as_json, render)


@plan.command("history")
@click.argument("job_id")
@_system_command
@json_option
def plan_history(job_id: str, address: str, as_json: bool) -> None:
    """Every plan version of a job, with its reason."""
    _print(client.connect(address).ListPlans(client.jobs_pb2.ListPlansRequest(job_id=job_id)), as_json,
           lambda r: _plan_rows(r.plans))


@cli.command()
@click.argument("job_id")
@click.option("--device", default="", help="Only this device.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@_system_command
@json_option
def telemetry(job_id: str, device: str, limit: int, address: str, as_json: bool) -> None:
    """Recent telemetry of a job's devices, newest first, with the rate derived."""
    _print(client.connect(address).QueryTelemetry(client.jobs_pb2.QueryTelemetryRequest(
        job_id=job_id, device=device, limit=limit)), as_json,
        lambda r: table(["device", "step", "s/block/micro-batch", "rate"],
                        [[p.device, p.step, f"{p.compute_s_per_block:.4f}", p.rate] for p in r.points]))


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="", help="Why, for the plan history.")
@_system_command
@json_option
def replan(job_id: str, reason: str, address: str, as_json: bool) -> None:
    """Plan the job again now and roll the plan out."""
    _print(client.connect(address).Replan(client.jobs_pb2.ReplanRequest(job_id=job_id, reason=reason)), as_json,
           lambda r: _plan_rows([r]))


@cli.group()
def detect() -> None:
    """Pause or resume straggler detection."""


@detect.command("pause")
@_system_command
def detect_pause(address: str) -> None:
    """Stop replanning on detected stragglers (telemetry is still kept)."""
    client.connect(address).SetDetection(client.jobs_pb2.SetDetectionRequest(paused=True))
    click.echo("detection paused")


@detect.command("resume")
@_system_command
def detect_resume(address: str) -> None:
    """Replan on detected stragglers again."""
    client.connect(address).SetDetection(client.jobs_pb2.SetDetectionRequest(paused=False))
    click.echo("detection resumed")


@cli.group()
def node() -> None:
    """Drain a node (no new jobs on it) or undrain it."""


@node.command("drain")
@click.argument("name")
@_system_command
def node_drain(name: str, address: str) -> None:
    """New jobs leave NAME out."""
    n = client.connect(address).DrainNode(client.jobs_pb2.NodeRequest(node=name))
    click.echo(f"{n.name} drained")


@node.command("undrain")
@click.argument("name")
@_system_command
def node_undrain(name: str, address: str) -> None:
    """New jobs may use NAME again."""
    n = client.connect(address).UndrainNode(client.jobs_pb2.NodeRequest(node=name))
    click.echo(f"{n.name} undrained")


@cli.command()
@click.argument("device")
@click.argument("rate", type=float)
@click.option("--from-step", type=click.IntRange(min=0), default=0, help="0: from the next step.")
@_system_command
def straggle(device: str, rate: float, from_step: int, address: str) -> None:
    """Emulation: make DEVICE RATE times slower (1 restores it)."""
    r = client.connect(address).Straggle(client.jobs_pb2.StraggleRequest(device=device, rate=rate,
                                                                         from_step=from_step))
    click.echo(f"{device} on {r.node} now {rate:g}x slow")
