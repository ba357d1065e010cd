"""Commands that talk to a control plane: thin wrappers over the job
service. Readable tables by default, --json everywhere. `plan show` and
`plan history` are added to the offline `plan` group where the command line
is assembled (__init__.py)."""

from __future__ import annotations

import codecs
import json
import queue
import threading
import time
from pathlib import Path

import click

from drover.client import Client
from drover.planner.wire import job_state_name

from .client import connect, jobs_pb2, to_dict, to_json
from .models import ModelReader
from .options import control_plane_option, json_option
from .render import progress_line, table


def _print(message, as_json: bool, render) -> None:
    click.echo(to_json(message) if as_json else render(message))


DETAIL_WIDTH = 60  # a job's detail in the jobs table; job status adds it whole when longer


def _job_rows(jobs) -> str:
    def figure(j, name: str, fmt: str) -> str:
        if not j.HasField("progress") or (name == "val_loss" and not j.progress.HasField("val_loss")):
            return "-"
        return format(getattr(j.progress, name), fmt)

    return table(
        ["job", "name", "state", "model", "steps", "loss", "val loss", "tok/s", "plan", "committed", "detail"],
        [
            [
                j.id,
                j.spec.name or "-",
                job_state_name(j.state),
                j.model_name,
                f"{j.step + 1}/{j.steps}",  # steps done, as job watch counts them (step is 0-based, -1 before any)
                figure(j, "loss", ".4f"),
                figure(j, "val_loss", ".4f"),
                figure(j, "tokens_per_s", ",.0f"),
                j.plan_version,
                j.committed_plan_version,
                j.detail
                if len(j.detail) <= DETAIL_WIDTH
                else j.detail[: DETAIL_WIDTH - 1] + "…",  # whole in job status
            ]
            for j in jobs
        ],
    )


@click.group()
def job() -> None:
    """Submit, list, follow and cancel jobs."""


@job.command("submit")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    default="",
    help="Where the job's trace, migrations and model go: relative to each agent's --data-root (default jobs/JOB_ID).",
)
@click.option(
    "--resume",
    metavar="DIR",
    help="Continue from the newest checkpoint in DIR (relative to the agents' --data-root), under any plan.",
)
@click.option("--wait", is_flag=True, help="Then watch it to its end (as job watch, with its exit status).")
@control_plane_option
@json_option
def job_submit(job_file: str, out_dir: str, resume: str | None, wait: bool, address: str, as_json: bool) -> None:
    """Submit a job file (model, steps, data, optimizer, checkpoint...; docs/jobs.md)."""
    with connect(address) as client:
        submitted = client.submit_file(Path(job_file), out_dir, resume, ModelReader())
        if as_json and wait:  # JSON Lines throughout: the job on one line, then its events
            click.echo(json.dumps(to_dict(submitted)))
        else:
            named = f"{submitted.spec.name}: " if submitted.spec.name else ""
            _print(
                submitted,
                as_json,
                lambda j: f"submitted {j.id} ({named}{j.model_name}, {j.steps} steps) -> {j.out_dir}",
            )
        if wait:
            _watch(client, submitted.id, as_json)


@job.command("list")
@control_plane_option
@json_option
def job_list(address: str, as_json: bool) -> None:
    """List jobs."""
    listing = jobs_pb2.ListJobsResponse(jobs=connect(address).list())
    _print(listing, as_json, lambda r: _job_rows(r.jobs))


@job.command("status")
@click.argument("job_id")
@control_plane_option
@json_option
def job_status(job_id: str, address: str, as_json: bool) -> None:
    """Show one job: state, step, desired and committed plan versions, and its detail whole (a
    failed job's cause)."""

    def render(j) -> str:
        return _job_rows([j]) + (f"\ndetail: {j.detail}" if len(j.detail) > DETAIL_WIDTH else "")

    _print(connect(address).get(job_id), as_json, render)


@job.command("watch")
@click.argument("job_id")
@control_plane_option
@json_option
def job_watch(job_id: str, address: str, as_json: bool) -> None:
    """Print the job's events as they happen, under a live progress line (step, loss, lr,
    tokens/s, validation loss), until it ends. Exit status: 0 completed, 1 failed, 3 cancelled."""
    _watch(connect(address), job_id, as_json)


ENDED = {"completed": 0, "failed": 1, "cancelled": 3}  # a watched job's end -> exit status


def _watch(client: Client, job_id: str, as_json: bool) -> None:
    _follow(client, job_id, as_json)
    state = job_state_name(client.get(job_id).state)
    if ENDED.get(state, 1):
        raise click.exceptions.Exit(ENDED.get(state, 1))


def _follow(client: Client, job_id: str, as_json: bool) -> None:
    events = client.watch(job_id)
    if as_json:
        for event in events:  # JSON Lines (docs/cli.md): the details an object, not JSON in a string
            fields = {"time": event.time, "step": event.step, "job_id": event.job_id, "kind": event.kind}
            click.echo(json.dumps(fields | {"details": event.details}))
        return
    from rich.console import Console
    from rich.live import Live

    console = Console(soft_wrap=True)  # an event a line, piped too: a pipe's 80 columns cut them in pieces
    arrived: queue.Queue = queue.Queue()

    def pump():  # the stream blocks; the progress line is refreshed meanwhile
        try:
            for event in events:
                arrived.put(event)
        except Exception as exc:  # raised where main maps it to one line (an unknown job: NOT_FOUND)
            arrived.put(exc)
        finally:
            arrived.put(None)

    threading.Thread(target=pump, daemon=True).start()
    with Live("", console=console, transient=True, refresh_per_second=4) as live:
        while True:
            try:
                event = arrived.get(timeout=1.0)
            except queue.Empty:
                event = False
            if event is None:
                break
            if isinstance(event, Exception):
                raise event
            if event:
                details = {k: v for k, v in event.details.items() if k != "plan"}
                console.print(
                    f"{time.strftime('%H:%M:%S', time.localtime(event.time))} step {event.step:>5}  "
                    f"{event.kind:<20} {json.dumps(details)}",
                    markup=False,
                    highlight=False,
                )
            job = client.get(job_id)
            if job.HasField("progress"):
                live.update(progress_line(job.progress, job.steps))
    job = client.get(job_id)
    if job.HasField("progress"):
        click.echo(progress_line(job.progress, job.steps))


@job.command("logs")
@click.argument("job_id")
@click.option("--node", default="", help="Only this node's workers.")
@click.option("--worker", "device", default="", metavar="DEVICE", help="Only this device's worker, e.g. node-1/0.")
@click.option("--follow", "-f", is_flag=True, help="Then print new output as it comes, until the job ends.")
@click.option(
    "--tail",
    "tail_bytes",
    type=click.IntRange(min=1, max=16 * 1024 * 1024),
    default=1024 * 1024,
    show_default=True,
    help="Bytes from the end of each worker's log.",
)
@control_plane_option
def job_logs(job_id: str, node: str, device: str, follow: bool, tail_bytes: int, address: str) -> None:
    """Print the stdout and stderr of the job's workers, read from the agents that ran them, each
    line prefixed with its device. Needs an operator token."""
    partial: dict[str, str] = {}  # device -> a line not yet ended
    decoders: dict[str, codecs.IncrementalDecoder] = {}  # a character may span two chunks
    for lines in connect(address).logs(job_id, node, device, tail_bytes, follow):
        if lines.unavailable:
            click.echo(f"[{lines.node}] {lines.unavailable}", err=True)
            continue
        decoder = decoders.setdefault(lines.device, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        text = partial.pop(lines.device, "") + decoder.decode(lines.data)
        *whole, rest = text.split("\n")
        for line in whole:
            click.echo(f"[{lines.device}] {line}")
        if rest:
            partial[lines.device] = rest
    for device_id, rest in partial.items():
        click.echo(f"[{device_id}] {rest}")


@job.command("cancel")
@click.argument("job_id")
@control_plane_option
@json_option
def job_cancel(job_id: str, address: str, as_json: bool) -> None:
    """Cancel a running job: its workers stop."""
    _print(connect(address).cancel(job_id), as_json, lambda j: _job_rows([j]))


@job.command("delete")
@click.argument("job_id")
@control_plane_option
@json_option
def job_delete(job_id: str, address: str, as_json: bool) -> None:
    """Forget an ended job (admin): its record in the database (plans, events, history,
    telemetry) and its folders under the agents' --work-dir (inbox, worker logs). Its output
    folder stays. A running or pending job is refused: cancel it first."""
    deleted = connect(address).delete(job_id)
    _print(deleted, as_json, lambda d: f"deleted {d.job_id}; agents told: {', '.join(d.nodes_told) or 'none'}")


@click.command()
@click.option("--links", "show_links", is_flag=True, help="The measured links instead: each NIC's newest probes.")
@control_plane_option
@json_option
def nodes(show_links: bool, address: str, as_json: bool) -> None:
    """List nodes, their devices and NICs (or, with --links, their measured links)."""
    listed = jobs_pb2.ListNodesResponse(nodes=connect(address).nodes())
    if show_links:
        _print(
            listed,
            as_json,
            lambda r: table(
                ["node", "nic", "peer", "measured Gbps", "measured"],
                [
                    [n.name, k.nic, k.peer, f"{k.gbps:.4g}" if k.gbps else "failed", _ago(k.time)]
                    for n in r.nodes
                    for k in n.links
                ],
            ),
        )
        return
    _print(
        listed,
        as_json,
        lambda r: table(
            ["node", "connected", "drained", "devices", "nics"],
            [[n.name, n.connected, n.drained, len(n.devices), ", ".join(n.nics)] for n in r.nodes],
        ),
    )


def _ago(when: float) -> str:
    return f"{max(0.0, time.time() - when):.0f} s ago"


def _plan_rows(records) -> str:
    return table(
        ["version", "committed", "pipelines", "predicted samples/s", "reason"],
        [
            [p.version, p.committed, len(p.plan.pipelines), f"{p.plan.predicted.samples_per_s:.3g}", p.reason[:70]]
            for p in records
        ],
    )


@click.command("show")
@click.argument("job_id")
@click.option("--version", type=int, default=0, help="0: the newest.")
@control_plane_option
@json_option
def plan_show(job_id: str, version: int, address: str, as_json: bool) -> None:
    """Show one plan version of a job."""
    record = connect(address).plan(job_id, version)

    def render(r):
        rows = [  # blocks as drover plan shows them: the half-open range, and how many
            [i, p.micro_batches, k, " ".join(s.devices), f"{s.layers[0]}-{s.layers[1]}", s.layers[1] - s.layers[0]]
            for i, p in enumerate(r.plan.pipelines)
            for k, s in enumerate(p.stages)
        ]
        return (
            f"{r.job_id} plan v{r.version} ({'committed' if r.committed else 'pending'}): {r.reason}\n"
            + table(["pipeline", "micro", "stage", "devices", "blocks", "n"], rows)
            + f"\nremoved: {' '.join(r.plan.removed) or 'none'}"
        )

    _print(record, as_json, render)


@click.command("history")
@click.argument("job_id")
@control_plane_option
@json_option
def plan_history(job_id: str, address: str, as_json: bool) -> None:
    """Every plan version of a job, with its reason."""
    listing = jobs_pb2.ListPlansResponse(plans=connect(address).plans(job_id))
    _print(listing, as_json, lambda r: _plan_rows(r.plans))


@click.command()
@click.argument("job_id")
@click.option("--device", default="", help="Only this device.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@control_plane_option
@json_option
def telemetry(job_id: str, device: str, limit: int, address: str, as_json: bool) -> None:
    """Recent telemetry of a job's devices, newest first, with the rate derived."""
    _print(
        jobs_pb2.QueryTelemetryResponse(points=connect(address).telemetry(job_id, device, limit)),
        as_json,
        lambda r: table(
            ["device", "step", "s/block/micro-batch", "rate"],
            [[p.device, p.step, f"{p.compute_s_per_block:.4f}", p.rate] for p in r.points],
        ),
    )


@click.command()
@click.argument("job_id")
@click.option("--reason", default="", help="Why, for the plan history.")
@control_plane_option
@json_option
def replan(job_id: str, reason: str, address: str, as_json: bool) -> None:
    """Plan the job again now and roll the plan out."""
    _print(
        connect(address).replan(job_id, reason),
        as_json,
        lambda r: _plan_rows([r]),
    )


@click.group()
def detect() -> None:
    """Pause or resume straggler detection."""


@detect.command("pause")
@control_plane_option
def detect_pause(address: str) -> None:
    """Stop replanning on detected stragglers (telemetry is still kept)."""
    connect(address).set_detection(True)
    click.echo("detection paused")


@detect.command("resume")
@control_plane_option
def detect_resume(address: str) -> None:
    """Replan on detected stragglers again."""
    connect(address).set_detection(False)
    click.echo("detection resumed")


@click.group()
def node() -> None:
    """Drain a node (no new jobs on it) or undrain it."""


@node.command("drain")
@click.argument("name")
@control_plane_option
def node_drain(name: str, address: str) -> None:
    """New jobs leave NAME out."""
    n = connect(address).drain(name)
    click.echo(f"{n.name} drained")


@node.command("undrain")
@click.argument("name")
@control_plane_option
def node_undrain(name: str, address: str) -> None:
    """New jobs may use NAME again."""
    n = connect(address).undrain(name)
    click.echo(f"{n.name} undrained")


@click.command()
@click.argument("device")
@click.argument("rate", type=float)
@click.option("--from-step", type=click.IntRange(min=0), default=0, help="0: from the next step.")
@control_plane_option
def straggle(device: str, rate: float, from_step: int, address: str) -> None:
    """Emulation: make DEVICE RATE times slower (1 restores it), in the job running on it now
    (from --from-step) and in the jobs its agent starts later (from their first step)."""
    node = connect(address).straggle(device, rate, from_step)
    click.echo(f"{device} on {node} now {rate:g}x slow" if rate > 1 else f"{device} on {node} restored")
