"""Queries and updates over the history; each takes a Session and is pure
SQLAlchemy. Writers run them through Store.write so each is one transaction."""

from __future__ import annotations

import json
import statistics
import time

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session

from .models import Device, Event, HistoryPoint, Job, JobProgress, Link, Nic, Node, Plan, Setting, TelemetrySample


class NotFound(LookupError):
    """An id that names nothing stored; the servers map it to NOT_FOUND."""

    def __init__(self, kind: str, value: str, known: str = ""):
        self.kind, self.value = kind, value
        super().__init__(f"unknown {kind} {value!r}" + (f": {known}" if known else ""))


def upsert_node(
    session: Session, name: str, devices: list[dict], nics: list[dict], agent_version: str, probe_port: int = 0
) -> Node:
    """The node as its agent describes it now: devices and NICs it no longer reports are gone.
    Replaced in two bulk statements per table, not a lookup per row: a thousand agents
    reconnecting after a control-plane restart register in seconds."""
    node = session.get(Node, name) or Node(name=name)
    node.connected, node.last_seen, node.agent_version = True, time.time(), agent_version
    node.probe_port = probe_port
    session.add(node)
    session.flush()
    measured = _measured(session, name)  # what its links did before it reconnected: still so
    nics = [{**row, "measured_gbps": measured.get(row["name"], 0.0)} for row in nics]
    for model, rows in ((Device, devices), (Nic, nics)):
        session.execute(delete(model).where(model.node == name))
        if rows:
            session.execute(insert(model), [{"node": name, **row} for row in rows])
    return node


def record_links(session: Session, node: str, samples: list[dict]) -> dict[tuple[str, str], tuple[float, float]]:
    """Keep each probe's newest result and refresh the measured bandwidth of the NICs at both
    ends: the median over that NIC's links (a slow interface is slow to and from its node).
    Returns {(node, nic): (before, after)} for the NICs whose measure changed."""
    touched = set()
    own = {n.name for n in nics_of(session, node)}
    for s in samples:
        if s["nic"] not in own:
            continue  # not a NIC the node has: nothing to keep
        session.merge(Link(node=node, nic=s["nic"], peer=s["peer"], gbps=s["gbps"], time=s["time"]))
        touched |= {(node, s["nic"]), (s["peer"], s["nic"])}
    session.flush()
    changed = {}
    for owner in {owner for owner, _ in touched}:
        measured = _measured(session, owner)
        for nic_name in [n for o, n in touched if o == owner]:
            nic = session.get(Nic, (owner, nic_name))
            after = measured.get(nic_name, 0.0)
            if nic is not None and after != nic.measured_gbps:
                changed[(owner, nic_name)] = (nic.measured_gbps, after)
                nic.measured_gbps = after
    return changed


# A NIC's measure is the median of its links probed within this of its newest probe: one round of
# probes. Once a link slowed, the median of the fresh probe from one end (0.006 Gbps) and the stale
# one from the other (0.2) read 0.1, and the new plan waited for the other end's next probe.
PROBE_ROUND_S = 10.0


def _measured(session: Session, owner: str) -> dict[str, float]:
    """Each of the node's NICs' measured bandwidth: the median over the links probed from or to
    it on that NIC in its newest round of probes (failed probes left out). One query for all."""
    rows = session.execute(
        select(Link.nic, Link.gbps, Link.time).where((Link.node == owner) | (Link.peer == owner), Link.gbps > 0)
    ).all()
    by_nic: dict[str, list[tuple[float, float]]] = {}
    for nic, gbps, at in rows:
        by_nic.setdefault(nic, []).append((at, gbps))
    out = {}
    for nic, probes in by_nic.items():
        newest = max(at for at, _ in probes)
        out[nic] = statistics.median(gbps for at, gbps in probes if at >= newest - PROBE_ROUND_S)
    return out


def links_of(session: Session, node: str) -> list[Link]:
    return list(session.scalars(select(Link).where(Link.node == node).order_by(Link.nic, Link.peer)))


def set_connected(session: Session, name: str, connected: bool) -> None:
    node = session.get(Node, name)
    if node is not None:
        node.connected, node.last_seen = connected, time.time()


def set_last_seen(session: Session, seen: dict[str, float]) -> None:
    """When each node's stream last brought a message (a later time stored, as a disconnect's,
    stays): one executemany, for every node heard since the last flush."""
    if seen:
        table = Node.__table__  # Core: the ORM's executemany updates by primary key only
        newer = update(table).where(table.c.name == bindparam("n"), table.c.last_seen < bindparam("t"))
        session.execute(newer.values(last_seen=bindparam("t")), [{"n": n, "t": t} for n, t in seen.items()])


def _get(session: Session, model, key, kind: str, shown: str):
    row = session.get(model, key)
    if row is None:
        raise NotFound(kind, shown)
    return row


def get_node(session: Session, name: str) -> Node:
    return _get(session, Node, name, "node", name)


def setting(session: Session, name: str, default):
    """A control-plane-wide setting as stored, or `default` if never set."""
    row = session.get(Setting, name)
    return default if row is None else json.loads(row.value_json)


def set_setting(session: Session, name: str, value) -> None:
    session.merge(Setting(name=name, value_json=json.dumps(value)))


def nodes(session: Session, offset: int = 0, limit: int | None = None) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.name).offset(offset).limit(limit)))


def devices_of(session: Session, node: str) -> list[Device]:
    return list(session.scalars(select(Device).where(Device.node == node).order_by(Device.id)))


def nics_of(session: Session, node: str) -> list[Nic]:
    return list(session.scalars(select(Nic).where(Nic.node == node).order_by(Nic.name)))


def get_device(session: Session, device: str) -> Device:
    return _get(session, Device, device, "device", device)


def get_job(session: Session, job_id: str) -> Job:
    return _get(session, Job, job_id, "job", job_id)


def delete_job(session: Session, job_id: str) -> None:
    """Everything stored about a job: its row, plans, progress, events, history and telemetry."""
    get_job(session, job_id)  # NOT_FOUND if unknown
    for model in (TelemetrySample, HistoryPoint, Event, Plan, JobProgress):
        session.execute(delete(model).where(model.job_id == job_id))
    session.execute(delete(Job).where(Job.id == job_id))


def jobs(session: Session, offset: int = 0, limit: int | None = None) -> list[Job]:
    return list(session.scalars(select(Job).order_by(Job.created, Job.id).offset(offset).limit(limit)))


def add_plan(session: Session, job_id: str, plan_json: dict, reason: str, rates: dict | None = None) -> Plan:
    """Store the job's next plan version (the desired generation)."""
    job = get_job(session, job_id)
    version = (session.scalar(select(func.max(Plan.version)).where(Plan.job_id == job_id)) or 0) + 1
    predicted = (plan_json.get("predicted") or {}).get("samples_per_s", 0.0)
    row = Plan(
        job_id=job_id,
        version=version,
        reason=reason,
        plan_json=json.dumps(plan_json),
        predicted_samples_per_s=predicted,
        rates_json=json.dumps(rates or {}),
        committed=False,
        created=time.time(),
    )
    session.add(row)
    job.plan_version = version
    return row


def commit_plan(session: Session, job_id: str, version: int) -> bool:
    """Mark a version committed (every agent runs it); False if it already was."""
    row = _get(session, Plan, (job_id, version), "plan version", f"{job_id}@{version}")
    if row.committed:
        return False
    row.committed = True
    job = get_job(session, job_id)
    job.committed_plan_version = max(job.committed_plan_version, version)
    return True


def plans(session: Session, job_id: str, offset: int = 0, limit: int | None = None) -> list[Plan]:
    get_job(session, job_id)
    query = select(Plan).where(Plan.job_id == job_id).order_by(Plan.version).offset(offset).limit(limit)
    return list(session.scalars(query))


def get_plan(session: Session, job_id: str, version: int = 0) -> Plan:
    if version == 0:
        version = get_job(session, job_id).plan_version
    return _get(session, Plan, (job_id, version), "plan version", f"{job_id}@{version}")


def set_progress(session: Session, job_id: str, figures: dict | None) -> None:
    """A job's newest training figures (None: none yet)."""
    if figures is not None:
        session.merge(JobProgress(job_id=job_id, progress_json=json.dumps(figures)))


def add_event(session: Session, job_id: str, step: int, kind: str, details: dict) -> Event:
    row = Event(job_id=job_id, time=time.time(), step=step, kind=kind, details_json=json.dumps(details))
    session.add(row)
    return row


def events(session: Session, job_id: str, after_id: int = 0, offset: int = 0, limit: int | None = None) -> list[Event]:
    query = select(Event).where(Event.job_id == job_id, Event.id > after_id).order_by(Event.id)
    return list(session.scalars(query.offset(offset).limit(limit)))


def telemetry(session: Session, job_id: str, device: str = "", limit: int = 100) -> list[TelemetrySample]:
    query = select(TelemetrySample).where(TelemetrySample.job_id == job_id)
    if device:
        query = query.where(TelemetrySample.device == device)
    return list(session.scalars(query.order_by(TelemetrySample.id.desc()).limit(limit)))


def newest_history_step(session: Session, job_id: str) -> int:
    """The step of the job's newest history row (the last stored, not the highest: after a
    rollback the steps redone come again); -1 if none."""
    query = select(HistoryPoint.step).where(HistoryPoint.job_id == job_id).order_by(HistoryPoint.id.desc()).limit(1)
    newest = session.scalar(query)
    return -1 if newest is None else newest


def history(session: Session, job_id: str, offset: int = 0, limit: int = 1000) -> list[HistoryPoint]:
    """The job's history points in the order they came (steps redone after a rollback twice)."""
    query = select(HistoryPoint).where(HistoryPoint.job_id == job_id).order_by(HistoryPoint.id)
    return list(session.scalars(query.offset(offset).limit(limit)))
