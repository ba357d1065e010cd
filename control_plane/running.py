"""A running job as the control plane keeps it in memory, the limits and timings its
parts share, and small helpers (event log lines, progress dicts)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

from drover.planner import Plan
from drover.planner.cluster import MAX_DEVICES

from .coordinator import JobState
from .detector import Detector
from .jobfile import JobSpec
from .validation import (
    FailedPrecondition,
)

log = logging.getLogger("drover.control_plane")
TERMINAL = ("completed", "failed", "cancelled")
AGENT_GRACE_S = 15.0  # an agent gone longer than this while its job runs fails the job
# An agent of a running job says something at least every 2 s (its heartbeat): one silent
# this long while its peers' workers report losing a peer is lost, even with its stream open.
PEER_SILENCE_S = 10.0
# Telemetry reaches the database once a second, or sooner once this many samples wait: a
# small cluster costs one commit a second, a large one stays within a fraction of a second.
FLUSH_EVERY_S = 1.0
FLUSH_ROWS = 1_000
DEVICE_SILENCE_S = 60.0  # a device of a running job silent this long while others report is lost
# A job spans at most this many devices: planning grows with them, and must stay bounded.
MAX_JOB_DEVICES = MAX_DEVICES  # the most a cluster file may describe, too
# Once a plan is found, planning stops trying layouts after this long and takes the best so far
# (1,024 GPUs plan in about 2 s; the largest job allowed, 16,384 devices with 1,024 layers and
# 65,536 micro-batches, takes 23.5 s unbudgeted on 2 cores, 13.3 s with the baselines scored).
PLANNING_BUDGET_S = 10.0
PROBE_EVERY_S = 3.0  # a node's links are probed at most this often for a job
PROBE_S = 0.2  # a probe sends about this long's worth of bytes at the NIC's nominal speed
MAX_LINKS = 256  # link samples kept from one telemetry message
REPLACED = object()  # put in a node's outbox when a newer stream of the node takes over


@dataclass
class RunningJob:
    """What the control plane keeps in memory about a job that runs."""

    id: str
    spec: JobSpec
    ranks: dict[str, int]
    nodes: list[str]
    plan: Plan
    version: int
    committed: int
    planned_rates: dict[str, float]
    detector: Detector
    step: int = -1
    node_versions: dict[str, int] = field(default_factory=dict)
    node_states: dict[str, str] = field(default_factory=dict)
    announced: set = field(default_factory=set)  # (device, rate) and (device, "link") already announced
    migrations_reported: set = field(default_factory=set)  # (node, plan version, recovered from)
    switched_at: dict[int, int] = field(default_factory=dict)  # plan version -> first step run under it
    heard: dict[str, float] = field(default_factory=dict)  # device -> when it last reported (monotonic)
    progress: dict | None = None  # rank 0's newest step: loss, lr, tokens/s, validation loss
    generation: int = 0  # the workers' world: 0 at the start, one more after each recovery
    lost_at: float = 0.0  # when the newest loss was acted on (monotonic), for the recovered event
    recovered_at: list[int] = field(default_factory=list)  # the step of each recovery
    out_dir: str = ""  # relative to each agent's data root
    former_nodes: set = field(default_factory=set)  # nodes recoveries left out: what they still say is ignored
    join_skipped: set = field(default_factory=set)  # nodes not worth growing onto, until they reconnect
    joining: dict = field(default_factory=dict)  # node -> version of the grown plan it waits to start in
    committed_at: int = -1  # first step run under the newest committed plan (its switch step)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # something was observed: reconcile
    forced: list = field(default_factory=list)  # (reason, future of the version) of replans asked for
    reconciler: asyncio.Task | None = None
    ending: bool = False  # the reconcile task finishes its round and stops
    world_change: asyncio.Lock = field(default_factory=asyncio.Lock)  # one recovery or growth at a time
    planned_links: dict = field(default_factory=dict)  # "node:nic" -> Gbps the current plan assumed
    links: dict = field(default_factory=dict)  # "node:nic" -> Gbps measured by link probes
    probed_at: dict = field(default_factory=dict)  # node -> when its links were last probed (monotonic)
    samples: dict = field(default_factory=dict)  # device -> (compute s/block, p2p wait s, sync s), newest
    migrations: int = 0  # plan switches finished since this server started (metrics)
    migration_bytes: int = 0
    history_step: int = -1  # the newest step kept in the job's history
    sizes: dict = field(default_factory=dict)  # plan version -> device -> TP size (tp_sizes)

    def __post_init__(self):
        self.set_plan(self.plan, self.version)

    def set_plan(self, plan: Plan, version: int) -> None:
        """The job's newest plan, and its devices' TP sizes kept for the telemetry still to come
        under it (tp_sizes) after newer versions."""
        self.plan, self.version = plan, version
        self.sizes[version] = {d: len(s.devices) for p in plan.pipelines for s in p.stages for d in s.devices}
        for old in sorted(self.sizes)[:-4]:
            del self.sizes[old]

    def tp_sizes(self, version: int) -> dict[str, int]:
        """device -> its stage's TP size under plan `version` (the newest, for one older than
        the last four): its share of a block's work is 1/t."""
        return self.sizes.get(version) or self.sizes[max(self.sizes)]

    def rank0_node(self) -> str:
        return min(self.ranks, key=self.ranks.get).split("/")[0]

    def device_rates(self) -> dict[str, float]:
        """Every device's straggling rate now: the detector's, or for one the plan leaves idle
        (nothing to judge) the rate the plan assumed."""
        rates = self.detector.rates()
        return {d: rates.get(d, self.planned_rates.get(d, 1.0)) for d in self.ranks}

    def state(self, detection_paused: bool) -> JobState:
        return JobState(
            version=self.version,
            committed=self.committed,
            node_versions={n: self.node_versions.get(n, 0) for n in self.nodes},
            step=self.step,
            steps=self.spec.steps,
            committed_at=self.committed_at,
            planned_rates=dict(self.planned_rates),
            announced=frozenset(self.announced),
            detection_paused=detection_paused,
            planned_links=dict(self.planned_links),
        )


def log_event(job_id: str, kind: str, step: int, details: dict) -> None:
    """A stored event as a log line too (with --log-format json, its fields)."""
    shown = {k: v for k, v in details.items() if k != "plan"}  # a plan is stored, not logged
    log.info(
        "job %s: %s at step %d %s",
        *(job_id, kind, step, json.dumps(shown)[:300]),
        extra={"event": kind, "job_id": job_id, "step": step, "details": shown},
    )


def progress_dict(progress) -> dict:
    """A Progress message as the dict stored and shown (val_loss only once there is one)."""
    out = {
        "step": progress.step,
        "loss": progress.loss,
        "lr": progress.lr,
        "tokens_per_s": progress.tokens_per_s,
        "samples_per_s": progress.samples_per_s,
    }
    if progress.HasField("val_loss"):
        out |= {"val_loss": progress.val_loss, "val_step": progress.val_step}
    return out


def check_version(job: RunningJob, version: int, where: str) -> None:
    """An agent cannot run a plan version the job never had (a stale or foreign agent)."""
    if version > job.version:
        raise FailedPrecondition(f"{where} = {version}: job {job.id} has no plan version above {job.version}")


def whole_nodes_within(budget: int, nodes: list) -> list:
    """Whole nodes, in name order, while their devices fit the budget."""
    out = []
    for node in nodes:
        if len(node[1]) > budget:
            break
        out.append(node)
        budget -= len(node[1])
    return out
