"""`drover up`: a control plane and agents as local processes, one job,
followed to the end, then a summary. The README's first command."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import grpc

from . import client
from . import cli, parse_slowdowns
from .render import table
from drover.planner.ports import free_port


def _parse_straggle(ctx, param, values) -> list[tuple[str, float, int]]:
    return parse_slowdowns(values, param, "node-1/0=3@10")


@cli.command()
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--devices-per-node", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--job", "job_file", type=click.Path(exists=True, dir_okay=False), default="examples/jobs/tiny.yaml",
              show_default=True)
@click.option("--straggle", "straggles", multiple=True, callback=_parse_straggle, metavar="DEVICE=RATE@STEP",
              help="Emulation: DEVICE becomes RATE times slower from STEP; repeatable.")
@click.option("--out", "out_dir", default="out/up", show_default=True,
              help="trace.jsonl, migrations.jsonl, events.jsonl, model.pt and drover.db go here.")
def up(nodes: int, devices_per_node: int, job_file: str, straggles, out_dir: str) -> None:
    """Run a local cluster (control plane + agents as processes, SQLite embedded) and one job on it."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("trace.jsonl", "migrations.jsonl", "events.jsonl", "model.pt"):
        (out / stale).unlink(missing_ok=True)
    address = f"127.0.0.1:{free_port()}"
    drover = [sys.executable, "-m", "drover.cli"]
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    procs = [subprocess.Popen(drover + ["server", "--db", str(out / "drover.db"), "--listen", address],
                              stdout=open(logs / "server.log", "w"), stderr=subprocess.STDOUT)]
    try:
        for i in range(nodes):
            procs.append(subprocess.Popen(
                drover + ["agent", "--control-plane", address, "--node", f"node-{i}", "--cpu-devices",
                          str(devices_per_node), "--interval", "0.5", "--work-dir", str(out / "agents")],
                stdout=open(logs / f"agent-{i}.log", "w"), stderr=subprocess.STDOUT))
        stub = client.connect(address)
        _wait_for_nodes(stub, nodes, procs)
        path = Path(job_file)
        submitted = stub.SubmitJob(client.jobs_pb2.SubmitJobRequest(
            job_yaml=path.read_text(), base_dir=str(path.parent.resolve()), out_dir=str(out)))
        click.echo(f"{submitted.id}: {submitted.model_name}, {submitted.steps} steps on {nodes} nodes x "
                   f"{devices_per_node} devices; control plane {address}")
        for device, rate, step in straggles:
            stub.Straggle(client.jobs_pb2.StraggleRequest(device=device, rate=rate, from_step=step))
        job = _follow(stub, submitted.id, out)
        click.echo(summary(out, job, [s[2] for s in straggles]))
        if job.state != "completed":
            raise click.ClickException(f"job {job.id} {job.state}: {job.detail}")
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_for_nodes(stub, count: int, procs, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            raise click.ClickException("a control-plane or agent process exited at start; see the logs folder")
        try:
            listed = stub.ListNodes(client.jobs_pb2.ListNodesRequest(), timeout=2)
            if sum(n.connected for n in listed.nodes) >= count:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.3)
    raise click.ClickException(f"{count} agents did not connect within {timeout_s:.0f} s")


def _follow(stub, job_id: str, out: Path):
    """Write events.jsonl as events arrive and show progress; return the finished job."""
    with open(out / "events.jsonl", "w") as events:
        for event in stub.WatchEvents(client.jobs_pb2.WatchEventsRequest(job_id=job_id)):
            record = {"time": event.time, "step": event.step, "kind": event.kind, **json.loads(event.details_json)}
            events.write(json.dumps(record) + "\n")
            events.flush()
            shown = {k: v for k, v in record.items() if k not in ("time", "step", "kind", "plan")}
            click.echo(f"  step {event.step:>4}  {event.kind:<20} {json.dumps(shown)[:100]}")
    return stub.GetJob(client.jobs_pb2.GetJobRequest(job_id=job_id))


def summary(out: Path, job, straggle_steps: list[int]) -> str:
    trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()] \
        if (out / "trace.jsonl").exists() else []
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    migrations = [json.loads(line) for line in (out / "migrations.jsonl").read_text().splitlines()] \
        if (out / "migrations.jsonl").exists() else []
    slow_from = min(straggle_steps, default=None)
    # The first switch after the slowdown: from that step on the job ran the new plan.
    adapted_at = min((m["step"] for m in migrations if slow_from is None or m["step"] >= slow_from), default=None)

    def rate(lo, hi):
        picked = [t["samples_per_s"] for t in trace if lo <= t["step"] < hi and t["step"] > 0]
        return f"{statistics.median(picked):.1f}" if picked else "-"
    end = len(trace)
    rows = [["before the straggler", rate(0, slow_from if slow_from is not None else end)]]
    if slow_from is not None:
        rows.append(["while slow", rate(slow_from, adapted_at if adapted_at is not None else end)])
        rows.append(["after the new plan", rate(adapted_at + 1, end) if adapted_at is not None else "-"])
    plans = [e for e in events if e["kind"] == "plan_committed"]
    lines = [
        "",
        f"job {job.id}: {job.state} at step {job.step}" + (f" ({job.detail})" if job.detail else ""),
        table(["phase", "median samples/s"], rows),
        f"plans committed: {', '.join('v%d@step %d' % (e['version'], e['step']) for e in plans) or 'none'}",
        f"migrations: " + (", ".join(f"step {m['step']}: {m['blocks_moved']} blocks, {m['bytes_moved']} bytes, "
                                     f"{m['seconds']:.3f} s" for m in migrations) or "none"),
        f"output: {out} (trace.jsonl, migrations.jsonl, events.jsonl, model.pt)",
        f"database: {out / 'drover.db'}",
    ]
    return "\n".join(lines)
