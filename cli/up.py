"""`drover up`: a control plane and agents as local processes, one job,
followed to the end, then a summary. The README's first command."""

from __future__ import annotations

import json
import signal
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import click
import grpc

from drover.control_plane.jobfile import load_job
from drover.planner.cluster import load_cluster
from drover.planner.network import load_network
from drover.planner.wire import job_state_name
from drover.storage.db import check_free
from drover.storage.errors import StoreInUse

from .local_cluster import LocalCluster
from .models import ModelReader
from .netem import NetworkEmulation, NetworkError
from .options import parse_slowdowns
from .render import progress_line, table
from .report import write_report


def _parse_straggle(ctx, param, values) -> list[tuple[str, float, int]]:
    return parse_slowdowns(values, param, "node-1/0=3@10")


def _parse_slow_link(ctx, param, values) -> list[tuple[str, str, float, int]]:
    out = []
    for value in values:
        link, _, rest = value.partition("=")
        network, _, node = link.partition(":")
        gbps, at, step = rest.partition("@")
        try:
            rate = float(gbps)
        except ValueError:
            rate = 0.0
        if not (network and node and at and step.isdecimal() and rate > 0):
            raise click.BadParameter(f"{value!r}: expected NET:NODE=GBPS@STEP, e.g. ib:ib-0=0.005@10", param=param)
        out.append((network, node, rate, int(step)))
    return out


def _parse_kill(ctx, param, values) -> list[tuple[str, int]]:
    out = []
    for value in values:
        node, at, step = value.partition("@")
        if not at or not node or "/" in node or not step.isdecimal():
            raise click.BadParameter(f"{value!r}: expected NODE@STEP, e.g. node-1@10", param=param)
        out.append((node, int(step)))
    return out


@click.command()
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--devices-per-node", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Emulate this cluster file instead of --nodes x --devices-per-node: its nodes, paced devices timed "
    "as its GPUs (slower by its rates), its NICs and links; the planner sees the same.",
)
@click.option(
    "--network",
    "network_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Like --cluster, and also run each node in a network namespace of its own, joined to the file's "
    "networks by veth links shaped with tc (needs root).",
)
@click.option(
    "--job",
    "job_file",
    type=click.Path(exists=True, dir_okay=False),
    default="examples/jobs/tiny.yaml",
    show_default=True,
)
@click.option(
    "--straggle",
    "straggles",
    multiple=True,
    callback=_parse_straggle,
    metavar="DEVICE=RATE@STEP",
    help="Emulation: DEVICE becomes RATE times slower from STEP; repeatable.",
)
@click.option(
    "--kill",
    "kills",
    multiple=True,
    callback=_parse_kill,
    metavar="NODE@STEP",
    help="Fault emulation: SIGKILL NODE's agent and its workers once the job reaches STEP; repeatable.",
)
@click.option(
    "--join",
    "joins",
    multiple=True,
    callback=_parse_kill,
    metavar="NODE@STEP",
    help="Fault emulation: start NODE's agent once the job reaches STEP (a new node, or one --kill took); repeatable.",
)
@click.option(
    "--slow-link",
    "slow_links",
    multiple=True,
    callback=_parse_slow_link,
    metavar="NET:NODE=GBPS@STEP",
    help="Emulation (with --network): shape NODE's link into network NET to GBPS once the job reaches STEP; "
    "repeatable.",
)
@click.option(
    "--out",
    "out_dir",
    default="out/up",
    show_default=True,
    help="trace.jsonl, migrations.jsonl, events.jsonl, model.pt and drover.db go here (inside --data-root).",
)
@click.option(
    "--data-root",
    metavar="DIR",
    help="The agents' data root: the job's data, init, checkpoint and resume paths are relative to it "
    "(default: here, or --out when it lies elsewhere).",
)
@click.option("--resume", metavar="DIR", help="Continue from the newest checkpoint in DIR (inside --data-root).")
@click.option(
    "--db",
    "database",
    metavar="URL",
    help="The control plane's database: a SQLAlchemy URL (postgresql+psycopg://USER@HOST/DB) or a SQLite "
    "file; default OUT/drover.db.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535 - 1024),
    default=0,
    envvar="DROVER_METRICS_PORT",
    help="Serve Prometheus metrics: the server's at https://127.0.0.1:PORT, each agent's at http:// and the "
    "next ports in node order (not for --network's namespaced agents). 0: off.",
)
def up(
    nodes: int,
    devices_per_node: int,
    cluster_file: str | None,
    network_file: str | None,
    job_file: str,
    straggles,
    kills,
    joins,
    slow_links,
    out_dir: str,
    data_root: str,
    resume,
    metrics_port: int,
    database: str | None,
) -> None:
    """Run a local cluster (control plane + agents as processes, SQLite embedded) and one job on it."""
    out = Path(out_dir).resolve()
    root = Path(data_root).resolve() if data_root else Path.cwd() if out.is_relative_to(Path.cwd()) else out
    if not out.is_relative_to(root):
        raise click.BadParameter(f"{out} is not inside the data root {root}", param_hint="--out")
    if cluster_file and network_file:
        raise click.UsageError("give --cluster FILE or --network FILE (which is a cluster file too), not both")
    networks = None
    if network_file:
        cluster_file = network_file
        networks = load_network(network_file)[1]
    names = [f"node-{i}" for i in range(nodes)]
    shape = f"{nodes} nodes x {devices_per_node} devices"
    if cluster_file:
        emulated = load_cluster(cluster_file)
        names = [n.name for n in emulated.nodes]
        shape = f"emulated cluster {emulated.name} ({len(names)} nodes, {len(emulated.devices)} paced devices"
        shape += f"; networks {', '.join(w.name for w in networks)})" if networks else ")"
    for name, _ in kills:
        if name not in names:
            raise click.BadParameter(f"{name}: the cluster's nodes are {', '.join(names)}", param_hint="--kill")
    for name, _ in joins:
        if name in names and name not in {n for n, _ in kills}:
            raise click.BadParameter(f"{name} runs already; join a new node or one --kill took", param_hint="--join")
    devices = (
        {d.id for d in emulated.devices}
        if cluster_file
        else {f"{n}/{j}" for n in names for j in range(devices_per_node)}
    )
    for device, _, _ in straggles:
        if device not in devices:  # found here, not once the cluster runs and the job is submitted
            shown = ", ".join(sorted(devices)[:8]) + (", ..." if len(devices) > 8 else "")
            raise click.BadParameter(f"{device}: not a device of the cluster ({shown})", param_hint="--straggle")
    if slow_links and not networks:
        raise click.BadParameter("links are slowed in an emulated network: give --network", param_hint="--slow-link")
    for network_name, node, _, _ in slow_links:
        joined = [w.nodes for w in networks or () if w.name == network_name]
        if not joined or node not in joined[0]:
            listed = ", ".join(f"{w.name} ({', '.join(w.nodes)})" for w in networks or ())
            problem = f"{network_name}:{node}: not a node of that network; {listed}"
            raise click.BadParameter(problem, param_hint="--slow-link")
    if cluster_file and any(name not in names for name, _ in joins):
        raise click.BadParameter("an emulated cluster's nodes are those of its file", param_hint="--join")
    reader = ModelReader()
    load_job(job_file, reader)  # a bad file fails before any process starts; a custom model's code is found
    # The earlier run's output goes once every check has passed (a refused run deleted it), and
    # once OUT's database is known free: a run still going there (its drover up killed) keeps
    # its files, and this one stops at the database in use.
    if database is None:
        try:
            check_free(str(out / "drover.db"))
        except StoreInUse as exc:
            raise click.UsageError(f"{exc}: another drover up runs there; give this one another --out") from None
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("trace.jsonl", "migrations.jsonl", "events.jsonl", "eval.jsonl", "model.pt"):
        (out / stale).unlink(missing_ok=True)
    stack = ExitStack()
    # SIGTERM ends the run as Ctrl-C does: processes stopped, namespaces and links removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with stack:
        network = None
        if networks:
            try:
                network = stack.enter_context(NetworkEmulation(emulated, networks))
            except NetworkError as exc:
                raise click.UsageError(f"--network: {exc}") from None
        cluster = stack.enter_context(
            LocalCluster(
                out,
                nodes,
                devices_per_node,
                data_root=root,
                spare_nodes=tuple(name for name, _ in joins),
                model_modules=tuple(reader.modules),
                python_path=tuple(reader.folders),
                emulate=Path(cluster_file) if cluster_file else None,
                network=network,
                metrics_port=metrics_port,
                database=database,
            )
        )
        # A run killed outright (SIGKILL) cancelled nothing: its job is still running or pending in
        # OUT's database, waiting for nodes, and holds OUT against this run's job. This run's
        # server holds the database alone, so no other run will ever continue it.
        for stale in cluster.client.list():
            if job_state_name(stale.state) in ("running", "pending"):
                cluster.client.cancel(stale.id)
                click.echo(
                    f"cancelled {stale.id}, left {job_state_name(stale.state)} by an earlier run that was killed"
                )
        # An earlier run's job wrote OUT, whose files went above: forgotten, or the control plane
        # refuses a job whose output would replace an ended job's on record. Only from OUT's own
        # database: a --db may hold other runs' jobs (then a run in an ended job's folder is refused).
        relative = str(out.relative_to(root))
        for earlier in cluster.client.list() if database is None else ():
            if earlier.out_dir == relative and job_state_name(earlier.state) not in ("running", "pending"):
                cluster.client.delete(earlier.id)
        submitted = cluster.submit(Path(job_file), relative, resume, reader)
        # Ended with the run, however it ends (Ctrl-C, an error): a job left running in OUT's
        # database would hold OUT against the next run's job.
        stack.callback(_cancel_unless_ended, cluster.client, submitted.id)
        where = f"{submitted.steps} steps on {shape}; control plane {cluster.address}"
        named = f"{submitted.spec.name}: " if submitted.spec.name else ""
        click.echo(f"{submitted.id}: {named}{submitted.model_name}, {where}")
        if cluster.metrics:
            listed = ", ".join(
                f"{name} {'https' if name == 'server' else 'http'}://{address}/metrics"
                for name, address in cluster.metrics.items()
            )
            click.echo(f"metrics (the server's over TLS, CA {cluster.certs / 'ca.pem'}): {listed}")
        for device, rate, step in straggles:
            cluster.client.straggle(device, rate, step)
        faults = [(step, "kill", name) for name, step in kills] + [(step, "join", name) for name, step in joins]
        faults += [(step, "slow-link", (net, node, gbps, network)) for net, node, gbps, step in slow_links]
        if faults:
            threading.Thread(target=_faults_at_steps, args=(cluster, submitted.id, faults), daemon=True).start()
        _follow(cluster.client, submitted.id, out)
        job = cluster.job(submitted.id)
        slow_from_start = [0] if cluster_file and any(r > 1 for r in emulated.rates.values()) else []
        slowed = [s[2] for s in straggles] + slow_from_start + [step for *_, step in slow_links]
        click.echo(summary(out, job, slowed, cluster.database))
        if job.HasField("progress"):  # what reached the control plane with the telemetry
            click.echo(f"last progress: {progress_line(job.progress, job.steps)}")
        click.echo(f"report: {write_report(cluster.client, job.id, out / 'report.html')}")
    if job_state_name(job.state) != "completed":
        raise click.ClickException(f"job {job.id} {job_state_name(job.state)}: {job.detail}")


def _cancel_unless_ended(client, job_id: str) -> None:
    try:
        if job_state_name(client.get(job_id).state) in ("running", "pending"):
            client.cancel(job_id)
    except Exception as exc:  # the control plane may be gone already: nothing more to do
        click.echo(f"could not cancel {job_id}: {exc}", err=True)


def _faults_at_steps(cluster: LocalCluster, job_id: str, faults: list[tuple]) -> None:
    """Kill or start each node once the job's step reaches its STEP (polling the control plane)."""
    pending = sorted(faults, key=lambda fault: fault[0])
    killed: set[str] = set()
    while pending:
        try:
            job = cluster.job(job_id)
        except grpc.RpcError:
            time.sleep(0.2)
            continue
        if job_state_name(job.state) != "running":
            return
        while pending and job.step >= pending[0][0]:
            _, action, name = pending.pop(0)
            if action == "slow-link":
                net, node, gbps, network = name
                click.echo(f"  step {job.step:>4}  slowing {node}'s link into {net} to {gbps:g} Gbps")
                network.set_rate(net, node, gbps)
            elif action == "kill":
                click.echo(f"  step {job.step:>4}  killing {name} (its agent and workers)")
                cluster.kill_node(name)
            else:
                if name in killed:  # back only once found lost: coming back sooner is not a loss
                    _until_lost(cluster, job_id, name)
                click.echo(f"  step {job.step:>4}  starting {name}")
                cluster.start_node(name)
            killed |= {name} if action == "kill" else set()
        time.sleep(0.05)


def _until_lost(cluster: LocalCluster, job_id: str, node: str, timeout_s: float = 60.0) -> None:
    """Wait for the job's node_lost event of `node` (or the job's end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = cluster.client.events(job_id)
        if any(e.kind == "node_lost" and e.details.get("node") == node for e in events):
            return
        if any(e.kind in ("job_completed", "job_failed", "job_cancelled") for e in events):
            return
        time.sleep(0.2)


def _follow(client, job_id: str, out: Path) -> None:
    """Write events.jsonl as events arrive and show progress, until the job ends."""
    with open(out / "events.jsonl", "w") as events:
        for event in client.watch(job_id):
            record = {"time": event.time, "step": event.step, "kind": event.kind, **event.details}
            events.write(json.dumps(record) + "\n")
            events.flush()
            shown = {k: v for k, v in record.items() if k not in ("time", "step", "kind", "plan")}
            click.echo(f"  step {event.step:>4}  {event.kind:<20} {json.dumps(shown)[:100]}")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary(out: Path, job, straggle_steps: list[int], database: str = "") -> str:
    """Samples/s before the straggler, while slow and after the new plan (or why there was
    none), the plans committed, the migrations, and where the output is."""
    trace, events = _read_jsonl(out / "trace.jsonl"), _read_jsonl(out / "events.jsonl")
    migrations = _read_jsonl(out / "migrations.jsonl")
    slow_from = min(straggle_steps, default=None)
    # The first switch after the slowdown: from that step on the job ran the new plan.
    adapted_at = min((m["step"] for m in migrations if slow_from is None or m["step"] >= slow_from), default=None)

    def rate(lo, hi):
        picked = [t["samples_per_s"] for t in trace if lo <= t["step"] < hi and t["step"] > 0]
        return f"{statistics.median(picked):.1f}" if picked else "-"

    end = len(trace)
    if slow_from is None:  # nothing slowed: no before and after
        rows = [["whole run", rate(0, end)]]
    else:
        rows = [
            ["before the straggler", rate(0, slow_from)],
            ["while slow", rate(slow_from, adapted_at if adapted_at is not None else end)],
            ["after the new plan", rate(adapted_at + 1, end) if adapted_at is not None else "-"],
        ]
    plans = [e for e in events if e["kind"] == "plan_committed"]
    lines = [
        "",
        f"job {job.id}: {job_state_name(job.state)} at step {job.step}" + (f" ({job.detail})" if job.detail else ""),
        table(["phase", "median samples/s"], rows),
    ]
    if slow_from is not None and adapted_at is None:
        lines.append(f"no new plan: {no_new_plan_reason(events, slow_from, job.step)}")
    lines += [
        "plans committed: " + (", ".join(f"v{e['plan_version']}@step {e['step']}" for e in plans) or "none"),
        "migrations: "
        + (
            ", ".join(
                f"step {m['step']}: {m['blocks_moved']} blocks, {m['bytes_moved']} bytes, {m['seconds']:.3f} s"
                for m in migrations
                if not m.get("recovered_from")
            )
            or "none"
        ),
        "recoveries: "
        + (
            ", ".join(
                f"step {e['step']}: from {e['from']} in {e['seconds']:.1f} s, {e['steps_redone']} steps redone, "
                f"{e['bytes_moved']} bytes"
                for e in events
                if e["kind"] == "recovered"
            )
            or "none"
        ),
        f"output: {out} (trace.jsonl, migrations.jsonl, events.jsonl, model.pt)",
        f"database: {_shown(database) if database else out / 'drover.db'}",
    ]
    return "\n".join(lines)


def _shown(database: str) -> str:
    """A database URL without its password."""
    if "://" not in database:
        return database
    from sqlalchemy.engine import make_url

    return make_url(database).render_as_string(hide_password=True)


def no_new_plan_reason(events: list[dict], slow_from: int, end_step: int) -> str:
    """Why a job whose device was slowed at `slow_from` switched to no new plan after it, read
    from its events: the plan pushed was not committed in time, the control plane decided the
    switch was not worth it, or nothing was detected."""
    after = [e for e in events if e["step"] >= slow_from]
    pushed = [e for e in after if e["kind"] == "plan_pushed" and e["plan_version"] >= 2]
    if pushed:
        return (
            f"plan v{pushed[-1]['plan_version']}, pushed at step {pushed[-1]['step']}, was not running "
            f"before the job ended at step {end_step}"
        )
    skipped = [e for e in after if e["kind"] == "replan_skipped"]
    if skipped:
        return replan_skipped_reason(skipped[-1])
    detected = [e for e in after if e["kind"] == "straggler_detected"]
    if detected:
        flagged = ", ".join(f"{e['device']} at {e['rate']:.2f}x (step {e['step']})" for e in detected)
        return f"the detector flagged {flagged}, but no replan was decided before the job ended at step {end_step}"
    return f"the detector flagged no device (straggler injected at step {slow_from}, job ended at step {end_step})"


def replan_skipped_reason(event: dict) -> str:
    """A replan_skipped event's reason; events of older control planes carry only the figures."""
    if event.get("reason"):
        return event["reason"]
    return (
        f"predicted gain {event['gain_s']:.3g} s over the remaining steps <= migration "
        f"{event['migration_s']:.3g} s (rates moved: {event['rates']}; step {event['step']})"
    )
