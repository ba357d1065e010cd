"""The control plane's state: jobs, agent sessions, telemetry ingest, and
each job's reconcile task.

Desired state vs observed state, as a Kubernetes controller: a job's plan
version is the desired generation, the version every agent reports active
is the observed one; a plan is committed when the two meet. After any
reconnect an agent says what it runs and gets the newest plans back.

Telemetry only records what it observes and wakes the job's reconcile task;
that one task per job asks `coordinator.decide` what to do and does it, so
rollouts of a job never overlap. The planner and database reads run off the
event loop. Everything kept is in storage, so a restarted control plane
picks up where the last one stopped. The gRPC servicers (api.py) only
translate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from drover.planner import Plan, make_plan, plan_from_dict
from drover.planner.errors import SpecError
from drover.planner.ports import free_port
from drover.planner.wire import is_loopback_host, job_state_name, plan_to_proto
from drover.storage import queries
from drover.storage.db import Store
from drover.storage.models import HistoryPoint, Job, NicSample, TelemetrySample
from drover.v1 import agent_pb2

from . import coordinator, planning
from .coordinator import JobState, Observation, Proposal
from .detector import Detector, DetectorSettings
from .jobfile import JobSpec, job_from_stored
from .logs import LogRouter
from .metrics import PlaneMetrics, lag_of
from .validation import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    check_hello,
    check_out_dir,
    check_telemetry,
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
# A job spans at most this many devices: planning grows with them (about 4 s at 8,192 devices
# with 1,024 layers and 65,536 micro-batches, the model's caps), and must stay bounded.
MAX_JOB_DEVICES = 16_384
# Planning stops trying layouts after this long and takes the best found (1,024 GPUs plan in
# about 2 s; the largest job allowed, 16,384 devices and 1,024 layers, takes 20 s unbudgeted).
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


class ControlPlane:
    def __init__(
        self,
        store: Store,
        detector: DetectorSettings = DetectorSettings(),
        restart_s: float = 300.0,
        device_silence_s: float = DEVICE_SILENCE_S,
    ):
        self.store = store
        self.settings = detector
        # One planning thread: plans take seconds at 1,024 GPUs and must not hold up the event loop.
        self.planning = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drover-planner")
        self.restart_s = restart_s
        self.device_silence_s = device_silence_s
        self.detection_paused = False
        self.outboxes: dict[str, asyncio.Queue] = {}  # node -> messages for its agent
        self.hosts: dict[str, str] = {}  # node -> the address its agent connects from
        self.jobs: dict[str, RunningJob] = {}
        self._lost: dict[str, asyncio.Task] = {}
        self._heard_from: dict[str, float] = {}  # node -> when its stream last brought a message (monotonic)
        self._handling: dict[str, int] = {}  # node -> its messages being handled now (its later ones wait)
        self.pending: list[str] = []  # jobs waiting for devices, oldest first
        self._placing = asyncio.Lock()
        self._background: set[asyncio.Task] = set()
        self.flusher: asyncio.Task | None = None
        self._saved_steps: dict[str, int] = {}  # job -> step last written
        self._saved_progress: dict[str, dict | None] = {}  # job -> progress last written
        self.new_events = asyncio.Event()  # set when an event is stored; watchers wait on it
        self.metrics = PlaneMetrics()
        self.logs = LogRouter()  # workers' logs on their way from agents to `drover job logs`

    # -- start-up and background work ---------------------------------------------

    async def recover(self) -> None:
        """Rebuild running jobs from storage (after a restart)."""

        def load(session):
            for node in queries.nodes(session):
                node.connected = False  # until its agent says hello again
            self.pending = [job.id for job in queries.jobs(session) if job.state == "pending"]
            return [(job, queries.get_plan(session, job.id)) for job in queries.jobs(session) if job.state == "running"]

        for job, plan_row in await self.store.write(load):
            spec = await self._stored_spec(job)
            if spec is None:
                continue
            ranks = json.loads(job.ranks_json)
            self._track(
                RunningJob(
                    job.id,
                    spec,
                    ranks,
                    sorted({d.split("/")[0] for d in ranks}),
                    plan_from_dict(json.loads(plan_row.plan_json)),
                    plan_row.version,
                    job.committed_plan_version,
                    json.loads(plan_row.rates_json),
                    Detector(self.settings),
                    step=job.step,
                    out_dir=job.out_dir,
                )
            )
        for node in sorted({n for job in self.jobs.values() for n in job.nodes}):
            self._expect_back(node)  # a node that never comes back fails its jobs, as after a disconnect

    async def _stored_spec(self, row: Job) -> JobSpec | None:
        """A stored job's spec; None, with the job failed, if this version cannot read it (its
        rules changed): one unreadable job must not hold up the others or the start-up."""
        try:
            return job_from_stored(row.model_yaml, f"job {row.id}")
        except SpecError as exc:
            detail = f"this control plane cannot read the stored job: {exc}"[:4096]

            def fail(session):
                stored = queries.get_job(session, row.id)
                stored.state, stored.detail = "failed", detail
                queries.add_event(session, row.id, row.step, "job_failed", {"reason": detail})

            await self.store.write(fail)
            log.error("job %s failed: %s", row.id, detail)
            return None

    def _track(self, job: RunningJob) -> None:
        self.jobs[job.id] = job
        job.reconciler = asyncio.create_task(self._reconcile_forever(job), name=f"reconcile {job.id}")

    async def close(self) -> None:
        """Stop the background work, write what is buffered, close the store."""
        tasks = [self.flusher] + [j.reconciler for j in self.jobs.values()] + list(self._lost.values())
        tasks += list(self._background)
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
        self.planning.shutdown(wait=False, cancel_futures=True)
        await self.flush()
        self.store.close()

    async def flush_forever(self, tick_s: float = 0.25) -> None:
        flushed = time.monotonic()
        while True:
            await asyncio.sleep(tick_s)
            if self.store.pending >= FLUSH_ROWS or time.monotonic() - flushed >= FLUSH_EVERY_S:
                flushed = time.monotonic()
                try:
                    await self.flush()
                except Exception as exc:  # the samples stay buffered; the next tick tries again
                    log.error("telemetry flush failed: %s: %s", type(exc).__name__, str(exc)[:200])
            try:
                await self._fail_silent_devices()
            except Exception as exc:  # a failed write must not end the flusher
                log.error("checking for silent devices failed: %s: %s", type(exc).__name__, str(exc)[:200])

    async def _fail_silent_devices(self) -> None:
        """A device that stops reporting while the rest of its job does is treated as failed."""
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if not job.heard:
                continue
            newest = max(job.heard.values())
            silent = sorted(
                d
                for d in job.ranks
                if now - job.heard.get(d, newest) > self.device_silence_s
                and newest - job.heard.get(d, newest) > self.device_silence_s / 2
            )
            if silent:
                # Hung, not gone: they hold the others up in their collectives. Their agents stop them
                # (the others' collectives then fail at once) and the job goes on without them.
                await self._event(job, "device_lost", {"devices": silent, "silent_s": self.device_silence_s})
                for node in sorted({d.split("/")[0] for d in silent} & set(self.outboxes)):
                    here = [d for d in silent if d.startswith(node + "/")]
                    stop = agent_pb2.StopWorkers(job_id=job.id, devices=here)
                    self.outboxes[node].put_nowait(
                        agent_pb2.ControlMessage(command=agent_pb2.Command(stop_workers=stop))
                    )
                await self._recover_job(job, set(), set(silent))

    async def flush(self) -> None:
        steps = {j.id: j.step for j in self.jobs.values() if self._saved_steps.get(j.id) != j.step}
        progress = {j.id: j.progress for j in self.jobs.values() if self._saved_progress.get(j.id) is not j.progress}

        def save(session):
            for job_id, step in steps.items():
                queries.get_job(session, job_id).step = step
            for job_id, figures in progress.items():
                queries.set_progress(session, job_id, figures)

        with self.metrics.flush_time.time():
            await self.store.flush_samples(also=save if steps or progress else None)
        self._saved_steps.update(steps)  # only once they are stored: a failed flush retries them
        self._saved_progress.update(progress)

    # -- agents ---------------------------------------------------------------------

    async def hello(self, hello: agent_pb2.Hello, host: str = "127.0.0.1") -> asyncio.Queue:
        """A sound hello makes this stream the node's (a newer one replaces an older) and
        returns its outbox; `host` is where the agent connects from, which is where its
        workers listen when they host rank 0. A bad hello changes nothing."""
        devices, nics = check_hello(hello)
        queue: asyncio.Queue = asyncio.Queue()
        replaced = self.outboxes.get(hello.node)
        if replaced is not None:
            replaced.put_nowait(REPLACED)  # one stream a node: the older one ends
            self.logs.node_gone(hello.node)  # log requests sent down the older stream end with it
        self.hosts[hello.node] = hello.advertise_address or host
        self.outboxes[hello.node] = queue
        self._heard_from[hello.node] = time.monotonic()
        if hello.node in self._lost:
            self._lost.pop(hello.node).cancel()
        try:
            await self.store.write(
                lambda s: queries.upsert_node(s, hello.node, devices, nics, hello.agent_version, hello.probe_port)
            )
            self.place_pending_soon()  # a waiting job may fit now
            for job in self.jobs.values():
                job.join_skipped.discard(hello.node)  # a fresh offer
            self._soon(self._grow_onto(hello.node), f"grow onto {hello.node}")
            running_here = {j.job_id: j for j in hello.jobs if job_state_name(j.state) == "running"}
            for ended in (j for j in hello.jobs if job_state_name(j.state) in ("completed", "failed")):
                await self.status(hello.node, ended)  # it may have ended while we were away
            for job in list(self.jobs.values()):
                if hello.node not in job.nodes:
                    continue
                if job.node_states.get(hello.node) == "completed":
                    continue
                if job.id not in running_here:
                    await self._fail(job, f"node {hello.node} came back without the job's workers")
                    continue
                _check_version(job, running_here[job.id].active_plan_version, "hello.jobs.active_plan_version")
                job.node_versions[hello.node] = running_here[job.id].active_plan_version
                if job.node_versions[hello.node] < job.version:  # level-triggered: resend the desired state
                    queue.put_nowait(self._plan_update(job))
        except BaseException:
            await self.disconnected(hello.node, queue)  # the stream ends here: nothing of it stays
            raise
        log.info(
            "agent %s connected from %s (workers at %s): %d devices, %d NICs, %d jobs",
            *(hello.node, host, self.hosts[hello.node], len(hello.devices), len(hello.nics), len(hello.jobs)),
            extra={"event": "agent_connected", "node": hello.node, "host": host, "advertised": self.hosts[hello.node]},
        )
        return queue

    def handling(self, node: str, started: bool) -> None:
        """A message of the node's stream is being handled (started) or was (not): the node
        is heard, and not silent while its next messages wait for this one."""
        self._heard_from[node] = time.monotonic()
        self._handling[node] = self._handling.get(node, 0) + (1 if started else -1)

    def _silent(self, node: str, now: float) -> bool:
        """Connected, yet nothing from it for PEER_SILENCE_S and nothing of it being handled."""
        return (
            node in self.outboxes
            and not self._handling.get(node)
            and now - self._heard_from.get(node, now) > PEER_SILENCE_S
        )

    async def disconnected(self, node: str, queue: asyncio.Queue) -> None:
        """The end of a stream; only the node's current one counts (a reconnect replaced it)."""
        if self.outboxes.get(node) is not queue:
            return
        del self.outboxes[node]
        log.info("agent %s disconnected", node, extra={"event": "agent_disconnected", "node": node})
        self.logs.node_gone(node)
        # Before any await: this runs in the finally of a stream's task that gRPC may cancel again,
        # and a node never expected back would never be found lost.
        if any(node in j.nodes for j in self.jobs.values()):
            self._expect_back(node)
        await asyncio.shield(self.store.write(lambda s: queries.set_connected(s, node, False)))

    def _expect_back(self, node: str) -> None:
        """The node's jobs go on without it unless its agent says hello within AGENT_GRACE_S."""
        if node in self._lost:
            self._lost.pop(node).cancel()
        self._lost[node] = asyncio.create_task(self._give_up_on(node))

    async def _give_up_on(self, node: str, after_s: float = AGENT_GRACE_S) -> None:
        """The node is lost: its jobs go on without it (recovery), or fail if nothing is left."""
        await asyncio.sleep(after_s)
        self._lost.pop(node, None)
        log.info("agent %s lost (gone %.1f s)", node, after_s, extra={"event": "agent_lost", "node": node})
        for job in list(self.jobs.values()):
            if node in job.nodes:
                await self._event(job, "node_lost", {"node": node, "after_s": after_s})
                await self._recover_job(job, {node})

    async def _recover_job(self, job: RunningJob, lost_nodes: set[str], lost: set[str] = frozenset()) -> None:
        """Plan for the surviving devices (all but those of lost_nodes and the `lost` ones) and
        hand their workers a new world (agent Recover): they keep their state, take lost parts
        from replicas or roll back to a checkpoint."""
        async with job.world_change:  # two losses at once: the second plans from the first's world
            if not job.ending and self.jobs.get(job.id) is job:
                await self._shrink(job, lost_nodes, lost)

    async def _shrink(self, job: RunningJob, lost_nodes: set[str], lost: set[str]) -> None:
        keep = {d for d in job.ranks if d.split("/")[0] not in lost_nodes and d not in lost}
        left = [n for n in job.nodes if n not in lost_nodes and not any(d.split("/")[0] == n for d in keep)]
        lost_nodes = set(lost_nodes) | set(left)  # a node none of whose devices is left
        if len(keep) == len(job.ranks):
            return  # lost before, by an earlier recovery
        survivors = [n for n in job.nodes if n not in lost_nodes and n in self.outboxes]
        started = [n for n in survivors if n not in job.joining]
        if started and all(job.node_states.get(n) == "completed" for n in started):
            # Lost after the last step, once the others had finished: nothing is left to recover.
            self._cancel_workers(job, only=set(job.joining))
            job.step = max(job.step, job.spec.steps - 1)
            await self._end(job, "completed", "", "job_completed", {})
            return
        what = ", ".join(sorted(lost_nodes) + sorted(d for d in lost if d.split("/")[0] not in lost_nodes))
        limit = job.spec.recoveries
        job.recovered_at = [s for s in job.recovered_at if s > job.step - limit.within_steps]
        if len(job.recovered_at) >= limit.max:
            await self._fail(
                job,
                f"{what} lost: a recovery more than the {limit.max} allowed "
                f"within {limit.within_steps} steps (recoveries in the job file)",
            )
            return
        job.recovered_at.append(job.step)
        if not survivors:
            await self._fail(job, f"{what} lost and no node of the job is left")
            return
        nodes = await self.store.query(
            lambda s: [
                (n, [d for d in queries.devices_of(s, n) if d.id in keep], queries.nics_of(s, n)) for n in survivors
            ]
        )
        cluster = planning.cluster_of([n for n in nodes if n[1]])
        try:
            plan = await self._off_loop(make_plan, cluster, job.spec.model, "drover", PLANNING_BUDGET_S)
        except ValueError as exc:  # the survivors cannot hold the model
            await self._fail(job, f"{what} lost; the rest cannot run the job: {exc}")
            return
        ranks = {d.id: i for i, d in enumerate(cluster.devices)}
        lost_devices = [d for d in job.ranks if d not in ranks]
        job.former_nodes |= lost_nodes
        recover = await self._new_world(job, plan, ranks, survivors, f"recovery: {what} lost")
        version = recover.plan_version
        log.info("job %s recovers without %s: world %d, plan v%d", job.id, what, job.generation, version)
        job.lost_at = time.monotonic()
        for node in lost_nodes:
            job.node_versions.pop(node, None)
            job.node_states.pop(node, None)
        for device in lost_devices:
            job.detector.forget(device)
            job.heard.pop(device, None)
        await self._event(
            job,
            "recovery_started",
            {"lost": sorted(lost_nodes), "devices": lost_devices, "plan_version": version, "world": job.generation},
        )
        for node in survivors:
            if node in self.outboxes:  # one that left meanwhile is found lost in its turn
                self.outboxes[node].put_nowait(agent_pb2.ControlMessage(recover=recover))

    async def telemetry(self, node: str, message: agent_pb2.Telemetry) -> None:
        """Record what the agent observed and wake the job's reconcile task; decide nothing here."""
        check_telemetry(message)
        self.metrics.telemetry_lag.observe(lag_of(message.time, time.time()))
        job = self._job_placed_on(node, message.job_id)
        for i, s in enumerate(message.devices):  # checked before anything is kept
            if not s.device.startswith(node + "/"):
                raise PermissionDenied(
                    f"telemetry.devices[{i}].device = {s.device[:80]!r}: node {node} reports for its own devices only"
                )
            if job is not None and s.device not in job.ranks:
                raise PermissionDenied(f"telemetry.devices[{i}].device = {s.device[:80]!r}: not a device of {job.id}")
            if job is not None and s.step >= job.spec.steps:
                raise InvalidArgument(
                    f"telemetry.devices[{i}].step = {s.step}: job {job.id} has {job.spec.steps} steps"
                )
        if job is not None:
            _check_version(job, message.active_plan_version, "telemetry.active_plan_version")
        for i, device in enumerate(message.lost_devices):
            if not device.startswith(node + "/") or (job is not None and device not in job.ranks):
                raise PermissionDenied(f"telemetry.lost_devices[{i}] = {device[:80]!r}: not a device of {node} here")
        if job is not None and message.lost_devices:
            await self._event(job, "device_lost", {"node": node, "devices": list(message.lost_devices)})
            await self._recover_job(job, set(), set(message.lost_devices))
            return
        for i, device in enumerate(message.stalled_devices):
            if not device.startswith(node + "/") or (job is not None and device not in job.ranks):
                raise PermissionDenied(f"telemetry.stalled_devices[{i}] = {device[:80]!r}: not a device of {node} here")
        if job is not None and message.stalled_devices:
            # Its workers lost a peer: a node of the job whose stream is gone is lost now, not
            # after the grace period (a node still connected is given the grace), and so is one
            # whose stream is open but silent (a host gone without closing its connection).
            now = time.monotonic()
            for gone in job.nodes:
                silent = gone not in self._lost and self._silent(gone, now)
                if (gone not in self.outboxes and gone in self._lost) or silent:
                    if gone in self._lost:
                        self._lost.pop(gone).cancel()
                    if silent:  # its agent drops the job, and the job is not grown onto it again
                        self._heard_from[gone] = now  # acted on once, not again at the next report
                        job.join_skipped.add(gone)  # until it says hello again
                        self._cancel_workers(job, only={gone})
                    self._lost[gone] = asyncio.create_task(self._give_up_on(gone, after_s=0.0))
        for m in message.migrations if job is not None else ():
            if m.recovered_from:  # a rollback: the steps it redoes are history again
                job.history_step = min(job.history_step, m.step - 1)
        if job is not None and message.HasField("progress"):
            if message.progress.step >= job.spec.steps:
                raise InvalidArgument(
                    f"telemetry.progress.step = {message.progress.step}: job {job.id} has {job.spec.steps} steps"
                )
            job.progress = progress_dict(message.progress)
            if node == job.rank0_node():  # only rank 0's agent reports progress; anything else is kept out
                steps = [p for p in (message.steps or [message.progress]) if job.history_step < p.step < job.spec.steps]
                self.store.buffer_samples(HistoryPoint, [self._history_point(job, p, message) for p in steps])
                job.history_step = max([job.history_step] + [p.step for p in steps])
        if job is not None:
            for s in message.devices:
                job.heard[s.device] = time.monotonic()
                job.samples[s.device] = (s.compute_s_per_block, s.p2p_wait_s, s.grad_sync_s)
                if s.compute_s_per_block > 0:
                    job.detector.observe(s.device, s.step, s.compute_s_per_block, s.p2p_wait_s, s.grad_sync_s)
                else:  # idle (left out of the plan): no work to judge, and an old window would mislead
                    job.detector.forget(s.device)
                job.step = max(job.step, s.step)
        rates = job.detector.rates() if job is not None and message.devices else {}
        self.store.buffer_samples(
            TelemetrySample,
            [
                {
                    "job_id": message.job_id,
                    "device": s.device,
                    "time": message.time,
                    "step": s.step,
                    "compute_s_per_block": s.compute_s_per_block,
                    "p2p_wait_s": s.p2p_wait_s,
                    "grad_sync_s": s.grad_sync_s,
                    "rate": rates.get(s.device, 1.0),
                }
                for s in message.devices
                # Kept for a running job, or for no job (a node's own devices); a job that ended or
                # never was keeps none.
                if job is not None or not message.job_id
            ],
        )
        self.store.buffer_samples(
            NicSample,
            [
                {
                    "node": node,
                    "nic": n.nic,
                    "time": message.time,
                    "tx_bytes_per_s": n.tx_bytes_per_s,
                    "rx_bytes_per_s": n.rx_bytes_per_s,
                }
                for n in message.nics
            ],
        )
        if job is None:
            return
        if message.links:
            await self._record_links(job, node, message.links)
        for m in message.migrations:
            job.switched_at[m.plan_version] = m.step
            if m.recovered_from:
                await self._event(
                    job,
                    "recovered",
                    {
                        "from": m.recovered_from,
                        "plan_version": m.plan_version,
                        "steps_redone": m.steps_redone,
                        "seconds": time.monotonic() - job.lost_at if job.lost_at else m.seconds,
                        "bytes_moved": m.bytes_moved,
                    },
                    step=m.step,
                )
                continue
            job.migrations += 1
            job.migration_bytes += m.bytes_moved
            await self._event(
                job,
                "migration_done",
                {
                    "plan_version": m.plan_version,
                    "bytes_moved": m.bytes_moved,
                    "blocks_moved": m.blocks_moved,
                    "seconds": m.seconds,
                },
                step=m.step,
            )
        job.node_versions[node] = message.active_plan_version
        job.wake.set()

    def _history_point(self, job: RunningJob, progress, message: agent_pb2.Telemetry) -> dict:
        return {
            "job_id": job.id,
            "step": progress.step,
            "time": message.time,
            "loss": progress.loss if math.isfinite(progress.loss) else None,
            "lr": progress.lr,
            "samples_per_s": progress.samples_per_s,
            "plan_version": message.active_plan_version,
            "rates_json": json.dumps(job.device_rates()),
        }

    async def _record_links(self, job: RunningJob, node: str, links) -> None:
        # A probe's result can arrive after its peer left the job (a recovery): dropped, like
        # any sample that names no other node of the job, rather than ending the stream.
        samples = [
            {"nic": k.nic, "peer": k.peer, "gbps": k.gbps, "time": k.time}
            for k in links[:MAX_LINKS]
            if k.peer in job.nodes and k.peer != node
        ]
        if not samples:
            return
        changed = await self.store.write(lambda s: queries.record_links(s, node, samples))
        for (owner, nic), (before, after) in sorted(changed.items()):
            job.links[f"{owner}:{nic}"] = after
            await self._event(job, "link_measured", {"node": owner, "nic": nic, "gbps": after, "was_gbps": before})
        if changed:
            job.wake.set()

    async def status(self, node: str, status: agent_pb2.JobStatus) -> None:
        job = self._job_placed_on(node, status.job_id)
        if job is None:
            return
        state = job_state_name(status.state)
        job.node_states[node] = state
        if state == "failed":
            await self._event(job, "workers_failed", {"node": node, "detail": status.detail})
            await self._fail(job, f"workers on {node} failed: {status.detail}")
        elif all(job.node_states.get(n) == "completed" for n in job.nodes if n not in job.joining):
            # The others finished the last step before a grown world formed: a newcomer still
            # waiting for them has nothing to do.
            self._cancel_workers(job, only=set(job.joining))
            job.step = max(job.step, job.spec.steps - 1)
            await self._end(job, "completed", "", "job_completed", {})

    # -- jobs -------------------------------------------------------------------------

    def _job_placed_on(self, node: str, job_id: str) -> RunningJob | None:
        """The running job, if any; an agent speaks only for jobs placed on its node."""
        job = self.jobs.get(job_id)
        if job is not None and node in job.former_nodes and node not in job.nodes:
            return None  # its last words, after the job went on without it
        if job is not None and node not in job.nodes:
            raise PermissionDenied(f"job {job_id[:80]!r} has no workers on node {node}")
        return job

    async def submit(self, spec: JobSpec, out_dir: str) -> Job:
        out_dir = check_out_dir(out_dir)
        job_id = f"job-{int(time.time() * 1000) % 10**10}{secrets.randbelow(100):02d}"  # unique, and a number
        out = out_dir or f"jobs/{job_id}"  # relative: each agent resolves it inside its data root
        model_yaml = json.dumps(spec.wire_dict())  # a restarted control plane reads it back
        async with self._placing:  # one placement at a time: two jobs never get the same device
            if not any(self.outboxes):
                raise FailedPrecondition("no connected, undrained node with devices: start agents first")
            nodes, reason = await self._placement(spec)
            return await self._create(job_id, spec, model_yaml, out, nodes, reason)

    async def _create(self, job_id, spec: JobSpec, model_yaml: str, out: str, nodes, reason: str) -> Job:

        def create(session):
            session.add(
                Job(
                    id=job_id,
                    state="pending",
                    model_yaml=model_yaml,
                    model_name=spec.model.name,
                    steps=spec.steps,
                    seed=spec.seed,
                    out_dir=out,
                    created=time.time(),
                    detail=reason if nodes is None else "",
                )
            )
            session.flush()
            if nodes is None:
                queries.add_event(session, job_id, 0, "job_pending", {"reason": reason})
            return queries.get_job(session, job_id)

        row = await self.store.write(create)
        if nodes is None:
            self.pending.append(job_id)
            self.new_events.set()
            log_event(job_id, "job_pending", 0, {"reason": reason})
            return row
        return await self._start(job_id, spec, out, nodes)

    async def _placement(self, spec: JobSpec) -> tuple[list | None, str]:
        """The nodes and devices a job gets now, as (name, devices, nics); or None and why not.
        A device belongs to at most one running job; drained and disconnected nodes get none."""
        taken = {d for job in self.jobs.values() for d in job.ranks}
        nodes = await self.store.query(
            lambda s: [
                (n.name, [d for d in queries.devices_of(s, n.name) if d.id not in taken], queries.nics_of(s, n.name))
                for n in queries.nodes(s)
                if n.connected and not n.drained and n.name in self.outboxes
            ]
        )
        free = [n for n in nodes if n[1]]
        wanted = spec.resources
        if wanted.nodes:
            whole = [n for n in free if n[0] not in {d.split("/")[0] for d in taken}]
            if len(whole) < wanted.nodes:
                return None, f"waiting for {wanted.nodes} free nodes ({len(whole)} free now)"
            return _within(MAX_JOB_DEVICES, whole[: wanted.nodes]), ""
        if wanted.devices:
            picked, count = [], 0
            for name, devices, nics in sorted(free, key=lambda n: -len(n[1])):  # fewest nodes
                if count >= wanted.devices:
                    break
                take = devices[: wanted.devices - count]
                picked.append((name, take, nics))
                count += len(take)
            if count < wanted.devices:
                return None, f"waiting for {wanted.devices} free devices ({count} free now)"
            return _within(MAX_JOB_DEVICES, picked), ""
        if not free:
            return None, "waiting for a free device: every connected device runs another job"
        return _within(MAX_JOB_DEVICES, free), ""

    def place_pending_soon(self) -> None:
        if self.pending:
            self._soon(self.place_pending(), "place pending jobs")

    def _soon(self, work, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s failed: %s: %s", task.get_name(), type(exc).__name__, str(exc)[:300])

    async def _grow_onto(self, node: str) -> None:
        """Offer a node that connected (new, or lost and back) to the running jobs, oldest
        first: the first whose plan the planner predicts at least min_gain faster with the
        node's free devices grows onto them, at a step boundary (a new world of its workers)."""
        async with self._placing:
            for job in sorted(self.jobs.values(), key=lambda j: j.id):
                if node in job.nodes or node in job.join_skipped or job.ending or node not in self.outboxes:
                    continue
                if job.committed != job.version:
                    continue  # a switch in flight settles first (the newcomer must know what is held)
                taken = {d for j in self.jobs.values() for d in j.ranks}

                def usable(session, job=job, taken=taken):
                    def mine(n, d):
                        return d.id in job.ranks or (n == node and d.id not in taken)

                    members = [*job.nodes, node]
                    return [(n, [d for d in queries.devices_of(session, n) if mine(n, d)], queries.nics_of(session, n))
                            for n in members]  # fmt: skip

                async with job.world_change:
                    if job.ending or job.committed != job.version:
                        continue  # a recovery came first: the node is offered again once it commits
                    nodes = await self.store.query(usable)
                    if not nodes[-1][1]:
                        return  # nothing free on it
                    cluster = planning.cluster_of(nodes)
                    model = job.spec.model
                    grown = await self._off_loop(
                        planning.propose, cluster, model, job.plan, {}, self.restart_s, PLANNING_BUDGET_S
                    )
                    now, after = grown.current_step_s, grown.proposed_step_s
                    # Growing pays only if the steps left win back the switch (none near the end:
                    # workers that finish meanwhile never meet the newcomer).
                    steps_left = max(0, job.spec.steps - job.step - 1)
                    if after > now * (1 - self.settings.min_gain) or (now - after) * steps_left <= grown.migration_s:
                        job.join_skipped.add(node)
                        skipped = {"node": node, "step_s_now": now, "step_s_grown": after}
                        skipped |= {"steps_left": steps_left, "migration_s": grown.migration_s}
                        await self._event(job, "join_skipped", skipped)
                        continue
                    if node not in self.outboxes:
                        return  # gone while planning
                    if job.ending or job.committed != job.version:
                        continue  # a plan was pushed while this one was made: offered again at its commit
                    job.planned_links.update(planning.nic_gbps(nodes))
                    await self._grow(job, node, [d.id for d in nodes[-1][1]], grown.plan)
                    return

    async def _new_world(
        self, job: RunningJob, plan: Plan, ranks: dict[str, int], nodes: list[str], reason: str
    ) -> agent_pb2.Recover:
        """A new world for the job (after a loss, or to grow): its rendezvous at rank 0's node,
        the plan and ranks stored, the job updated; the Recover its members are sent."""
        master_addr = self.hosts.get(min(ranks, key=ranks.get).split("/")[0], "127.0.0.1")
        job.generation += 1  # first: a reconcile round awaiting meanwhile sees the world change
        port = free_port() if is_loopback_host(master_addr) else 29500 + (job.generation * 7 + len(job.id)) % 2000

        def store(session):
            row = queries.get_job(session, job.id)
            row.ranks_json, row.master_addr, row.master_port = json.dumps(ranks), master_addr, port
            return queries.add_plan(session, job.id, plan.to_dict(), reason, {}).version

        version = await self.store.write(store)
        job.plan, job.version, job.ranks, job.nodes = plan, version, ranks, nodes
        return agent_pb2.Recover(
            job_id=job.id,
            generation=job.generation,
            ranks=ranks,
            master_addr=master_addr,
            master_port=port,
            plan_version=version,
            plan=plan_to_proto(plan),
        )

    async def _grow(self, job: RunningJob, node: str, devices: list[str], plan: Plan) -> None:
        old_plan, old_ranks = job.plan, dict(job.ranks)
        ranks = old_ranks | {d: len(old_ranks) + i for i, d in enumerate(devices)}
        recover = await self._new_world(job, plan, ranks, [*job.nodes, node], f"grow: {node} joined")
        if job.ending or self.jobs.get(job.id) is not job:
            return  # it ended while the world was stored: nobody is to start
        version = recover.plan_version
        job.joining[node] = version
        await self._event(job, "node_joined", {"node": node, "devices": devices, "plan_version": version})
        for member in job.nodes[:-1]:
            if member in self.outboxes:  # one that left meanwhile is found lost in its turn
                self.outboxes[member].put_nowait(agent_pb2.ControlMessage(recover=recover))
        start = agent_pb2.StartJob(
            job_id=job.id,
            model_yaml=job.spec.workers_json(),
            steps=job.spec.steps,
            seed=job.spec.seed,
            world_size=len(ranks),
            ranks=ranks,
            master_addr=recover.master_addr,
            master_port=recover.master_port,
            plan_version=version,
            plan=plan_to_proto(plan),
            out_dir=job.out_dir,
            generation=job.generation,
            previous_plan=plan_to_proto(old_plan),
            previous_ranks=old_ranks,
        )
        self.outboxes[node].put_nowait(agent_pb2.ControlMessage(start_job=start))

    async def place_pending(self) -> None:
        """Start waiting jobs, oldest first, on what is free now (after a node joins, a job
        ends or a node is undrained)."""
        async with self._placing:
            await self._place_pending()

    async def _place_pending(self) -> None:
        for job_id in list(self.pending):
            row = await self.store.query(lambda s, j=job_id: queries.get_job(s, j))
            spec = await self._stored_spec(row)
            if spec is None:
                self.pending.remove(job_id)
                continue
            nodes, reason = await self._placement(spec)
            if nodes is None:
                if reason != row.detail:
                    await self.store.write(lambda s, j=job_id, r=reason: setattr(queries.get_job(s, j), "detail", r))
                continue
            self.pending.remove(job_id)
            await self._start(job_id, spec, row.out_dir, nodes)

    async def _start(self, job_id: str, spec: JobSpec, out: str, nodes: list) -> Job:
        cluster = planning.cluster_of(nodes)
        plan = await self._off_loop(make_plan, cluster, spec.model, "drover", PLANNING_BUDGET_S)
        devices = [d.id for d in cluster.devices]
        ranks = {d: i for i, d in enumerate(devices)}
        master_addr = self.hosts.get(devices[0].split("/")[0], "127.0.0.1")  # rank 0's node
        # On this machine a free port is known; elsewhere take one per job from a fixed range.
        port = free_port() if is_loopback_host(master_addr) else 29500 + int(job_id.split("-")[1]) % 2000

        def place(session):
            row = queries.get_job(session, job_id)
            row.state, row.detail, row.ranks_json = "running", "", json.dumps(ranks)
            row.master_addr, row.master_port = master_addr, port
            queries.add_plan(session, job_id, plan.to_dict(), "initial plan", {})
            queries.add_event(
                session,
                job_id,
                0,
                "job_started",
                {"nodes": [n for n, _, _ in nodes], "devices": devices, "plan_version": 1},
            )
            return row

        job_row = await self.store.write(place)
        log_event(job_id, "job_started", 0, {"nodes": [n for n, _, _ in nodes], "plan_version": 1})
        job = RunningJob(
            job_id, spec, ranks, [n for n, _, _ in nodes], plan, 1, 0, {}, Detector(self.settings), out_dir=out
        )
        job.planned_links = planning.nic_gbps(nodes)
        self._track(job)
        start = agent_pb2.StartJob(
            job_id=job_id,
            model_yaml=spec.workers_json(),
            steps=spec.steps,
            seed=spec.seed,
            world_size=len(devices),
            ranks=ranks,
            master_addr=master_addr,
            master_port=port,
            plan_version=1,
            plan=plan_to_proto(plan),
            out_dir=out,
        )
        gone = [node for node in job.nodes if node not in self.outboxes]
        if gone:  # an agent left while the job was being planned and stored
            await self._fail(job, f"node {', '.join(gone)} left while the job was being placed; submit it again")
            return await self.store.query(lambda s: queries.get_job(s, job_id))
        for node in job.nodes:
            self.outboxes[node].put_nowait(agent_pb2.ControlMessage(start_job=start))
        if len(job.nodes) > 1:
            self._soon(self._probe_links(job, job.nodes), f"probe the links of {job_id}")
        return job_row

    async def _probe_links(self, job: RunningJob, nodes: list[str]) -> None:
        """Ask the agents of `nodes` to measure their links to the job's other nodes, network by
        network (a NIC of the same name and type at both ends); each pair once."""
        nodes = [n for n in nodes if job.probed_at.get(n, -PROBE_EVERY_S) <= time.monotonic()]  # not one due
        if not nodes:
            return
        due = max(job.probed_at.get(n, -PROBE_EVERY_S) + PROBE_EVERY_S for n in nodes)
        for node in nodes:
            job.probed_at[node] = max(due, time.monotonic())
        await asyncio.sleep(max(0.0, due - time.monotonic()))  # probes a moment ago: this one waits its turn
        if job.ending:
            return

        def members(session):
            return {
                n: (queries.get_node(session, n).probe_port, {c.name: c for c in queries.nics_of(session, n)})
                for n in job.nodes
            }

        known = await self.store.query(members)
        for node in nodes:
            if node not in known:
                continue  # left the job (a recovery) while this round waited
            port, nics = known[node]
            targets = []
            for peer, (peer_port, peer_nics) in known.items():
                if peer == node or not peer_port or (peer in nodes and peer < node):
                    continue  # each pair once: the node with the smaller name sends
                for name, nic in nics.items():
                    other = peer_nics.get(name)
                    if nic.address and other is not None and other.address and other.type == nic.type:
                        size = int(min(max((nic.gbps or 1.0) * 1e9 / 8 * PROBE_S, 64 << 10), 64 << 20))
                        targets.append(
                            agent_pb2.LinkTarget(nic=name, peer=peer, address=other.address, port=peer_port, bytes=size)
                        )
            if targets and node in self.outboxes:
                probe = agent_pb2.ProbeLinks(job_id=job.id, targets=targets)
                self.outboxes[node].put_nowait(agent_pb2.ControlMessage(command=agent_pb2.Command(probe_links=probe)))

    async def cancel(self, job_id: str) -> Job:
        if job_id in self.pending:
            self.pending.remove(job_id)

            def cancelled(session):
                row = queries.get_job(session, job_id)
                row.state, row.detail = "cancelled", "cancelled by request while pending"
                queries.add_event(session, job_id, 0, "job_cancelled", {})
                return row

            row = await self.store.write(cancelled)
            self.new_events.set()
            log_event(job_id, "job_cancelled", 0, {})
            return row
        job = self.jobs.get(job_id)
        if job is not None:
            self._cancel_workers(job)
            row = await self._end(job, "cancelled", "cancelled by request", "job_cancelled", {})
            if row is not None:
                return row
        row = await self.store.query(lambda s: queries.get_job(s, job_id))  # NOT_FOUND if unknown
        raise FailedPrecondition(f"job {job_id} is {row.state}; only a running job can be cancelled")

    async def replan(self, job_id: str, reason: str) -> int:
        """Plan for what is measured now, whatever the detector thinks; the job's reconcile
        task does it, so it never runs at the same time as a detector-started round."""
        job = await self._running(job_id)
        version = asyncio.get_running_loop().create_future()
        job.forced.append((reason or "forced by request", version))
        job.wake.set()
        return await version

    async def straggle(self, device: str, rate: float, from_step: int) -> str:
        if not (math.isfinite(rate) and rate >= 1.0):
            raise InvalidArgument(f"rate = {rate!r}: a finite number >= 1.0 (1.0 restores the device)")
        row = await self.store.query(lambda s: queries.get_device(s, device))  # from_step >= 0: check_bounds
        if row.node not in self.outboxes:
            raise FailedPrecondition(f"node {row.node} of {device} is not connected")
        self.outboxes[row.node].put_nowait(
            agent_pb2.ControlMessage(
                command=agent_pb2.Command(straggle=agent_pb2.Straggle(device=device, rate=rate, from_step=from_step))
            )
        )
        return row.node

    async def drain(self, node: str, drained: bool):
        def update(session):
            row = queries.get_node(session, node)
            row.drained = drained
            return row

        row = await self.store.write(update)
        if not drained:
            self.place_pending_soon()
        return row

    async def _running(self, job_id: str) -> RunningJob:
        if job_id not in self.jobs:
            row = await self.store.query(lambda s: queries.get_job(s, job_id))
            raise FailedPrecondition(f"job {job_id} is {row.state}, not running")
        return self.jobs[job_id]

    # -- the loop: observe, decide, act (one reconcile task per job) ---------------------

    async def _reconcile_forever(self, job: RunningJob) -> None:
        while True:
            await job.wake.wait()
            job.wake.clear()
            if job.ending:
                return
            while job.forced and job.forced[0][1].done():
                job.forced.pop(0)  # its caller gave up waiting
            forced = job.forced.pop(0) if job.forced else None
            if job.forced:
                job.wake.set()  # another request waits: come round again
            try:
                await self._reconcile(job, forced)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad round must not end the job's loop
                if forced is not None and not forced[1].done():
                    forced[1].set_exception(exc)
                else:
                    log.error("reconciling %s failed: %s: %s", job.id, type(exc).__name__, str(exc)[:200])

    async def _reconcile(self, job: RunningJob, forced: tuple[str, asyncio.Future] | None) -> None:
        rates = job.detector.rates()
        observation = Observation(
            rates, tuple(job.detector.slow_links(rates)), forced=forced[0] if forced else "", links=dict(job.links)
        )
        state = job.state(self.detection_paused)
        generation = job.generation
        actions = coordinator.decide(state, observation, self.settings)
        for action in actions:
            if job.generation != generation:
                # A recovery or a join changed the world while this round awaited (planning, the
                # store): what it decided was for devices that may be gone. Decide again.
                job.wake.set()
                break
            if isinstance(action, coordinator.ProposePlan):
                proposal = await self._propose(job, action.rates)
                actions += coordinator.decide(state, replace(observation, proposal=proposal), self.settings)
            elif isinstance(action, coordinator.Commit):
                await self._commit(job, action.version)
            elif isinstance(action, coordinator.AnnounceStraggler):
                job.announced.add((action.device, action.rate))
                await self._event(job, "straggler_detected", {"device": action.device, "rate": action.rate})
            elif isinstance(action, coordinator.AnnounceSlowLink):  # measured: a slow link replans
                job.announced.add((action.device, "link"))
                await self._event(job, "slow_link_suspected", {"device": action.device})
                self._soon(self._probe_links(job, [action.device.split("/")[0]]), f"probe {action.device}'s links")
            elif isinstance(action, coordinator.PushPlan):
                if job.ending:
                    break  # no new plan for a job that is ending
                version = await self._push(job, action.plan, action.rates, action.reason, generation)
                if version is None:  # the world changed first: decide again for the new one
                    job.wake.set()
                    break
                job.planned_links.update(action.links)
                if forced is not None and not forced[1].done():
                    forced[1].set_result(version)
            elif isinstance(action, coordinator.SkipPlan):
                job.planned_rates = dict(action.rates)  # settled: do not reconsider until rates move again
                job.planned_links.update(action.links)
                await self._event(job, "replan_skipped", {"reason": action.reason, **action.details})
        if forced is not None and not forced[1].done():  # a commit came first: ask again next round
            job.forced.insert(0, forced)
            job.wake.set()

    async def _propose(self, job: RunningJob, rates: dict[str, float]) -> Proposal:
        nodes = await self.store.query(
            lambda s: [(n, queries.devices_of(s, n), queries.nics_of(s, n)) for n in job.nodes]
        )
        proposal = await self._off_loop(
            planning.propose,
            planning.cluster_of(nodes),
            job.spec.model,
            job.plan,
            rates,
            self.restart_s,
            PLANNING_BUDGET_S,
        )
        return replace(proposal, links=planning.nic_gbps(nodes))  # what that cluster was made with

    async def _off_loop(self, fn, *args):
        """Plan in the planning thread, which the event loop never waits on."""

        def timed():
            started = time.monotonic()
            result = fn(*args)
            if (took := time.monotonic() - started) > PLANNING_BUDGET_S:
                log.warning(
                    "planning took %.1f s, past its %.0f s budget: the best plan found by then", took, PLANNING_BUDGET_S
                )
            return result

        return await asyncio.get_running_loop().run_in_executor(self.planning, timed)

    async def _push(
        self, job: RunningJob, plan: Plan, rates: dict[str, float], reason: str, generation: int
    ) -> int | None:
        """Store and send a plan made for world `generation`; None, and nothing done, when a
        recovery or a join changed the world first. Holding the world lock, no change can start
        until the plan is out: a plan naming devices of an older world never reaches workers
        already in a newer one (they would not know those devices)."""
        async with job.world_change:
            if job.generation != generation:
                return None
            row = await self.store.write(lambda s: queries.add_plan(s, job.id, plan.to_dict(), reason, rates))
            job.plan, job.version, job.planned_rates = plan, row.version, dict(rates)
            await self._event(job, "plan_pushed", {"plan_version": row.version, "reason": reason})
            for node in job.nodes:
                if node in self.outboxes:
                    self.outboxes[node].put_nowait(self._plan_update(job))
            return row.version

    async def _commit(self, job: RunningJob, version: int) -> None:
        await self.store.write(lambda s: queries.commit_plan(s, job.id, version))
        # The plan has run since its switch (plan 1: since step 0); judge it on its own steps.
        job.committed = version
        job.joining = {n: v for n, v in job.joining.items() if v > version}
        job.committed_at = job.switched_at.get(version, 0 if version == 1 else job.step)
        job.announced = {a for a in job.announced if a[1] != "link"}  # a new plan: links judged afresh
        job.detector.discard_before(job.committed_at)
        await self._event(
            job, "plan_committed", {"plan_version": version, "plan": job.plan.to_dict()}, step=job.committed_at
        )
        # Nodes that connected while a switch was in flight were not offered to the job then.
        busy = {n for j in self.jobs.values() for n in j.nodes}
        for node in sorted(set(self.outboxes) - busy - job.join_skipped):
            self._soon(self._grow_onto(node), f"grow onto {node}")

    def _plan_update(self, job: RunningJob) -> agent_pb2.ControlMessage:
        return agent_pb2.ControlMessage(
            plan=agent_pb2.PlanUpdate(job_id=job.id, version=job.version, plan=plan_to_proto(job.plan))
        )

    def _cancel_workers(self, job: RunningJob, only: set[str] | None = None) -> None:
        for node in job.nodes:
            if node in self.outboxes and (only is None or node in only):
                self.outboxes[node].put_nowait(
                    agent_pb2.ControlMessage(command=agent_pb2.Command(cancel=agent_pb2.CancelJob(job_id=job.id)))
                )

    async def _fail(self, job: RunningJob, detail: str) -> None:
        self._cancel_workers(job)
        await self._end(job, "failed", detail, "job_failed", {"reason": detail})

    async def _end(self, job: RunningJob, state: str, detail: str, kind: str, details: dict) -> Job | None:
        """End a running job once: its reconcile task stops first, so the ending event is the
        job's last; None when it had ended already."""
        if job.ending or self.jobs.get(job.id) is not job:
            return None
        job.ending = True  # a round under way finishes whole (its events and writes), then the task stops
        job.wake.set()
        if job.reconciler is not None:
            await asyncio.gather(job.reconciler, return_exceptions=True)
        # A plan every node ran before the end is committed, even if the end came first.
        for action in coordinator.decide(job.state(self.detection_paused), Observation({}), self.settings):
            if isinstance(action, coordinator.Commit):
                await self._commit(job, action.version)
        del self.jobs[job.id]  # from here on, nothing but the ending event is written for it
        for _, version in job.forced:
            if not version.done():
                version.set_exception(FailedPrecondition(f"job {job.id} is {state}, not running"))
        await self._event(job, kind, details, ending=True)

        def update(session):
            row = queries.get_job(session, job.id)
            row.state, row.detail, row.step = state, detail, job.step
            queries.set_progress(session, job.id, job.progress)
            return row

        row = await self.store.write(update)
        self.place_pending_soon()  # its devices are free now
        return row

    async def _event(
        self, job: RunningJob, kind: str, details: dict, step: int | None = None, ending: bool = False
    ) -> None:
        if not ending and self.jobs.get(job.id) is not job:
            return  # the job has ended: its ending event stays its last
        at = job.step if step is None else step
        await self.store.write(lambda s: queries.add_event(s, job.id, at, kind, details))
        self.new_events.set()
        log_event(job.id, kind, at, details)

    async def next_events(self, timeout_s: float = 1.0) -> None:
        """Wait until an event is stored since the last clear, or a second at most (several
        watchers share the flag, and a job can end while no event is being written)."""
        try:
            await asyncio.wait_for(self.new_events.wait(), timeout_s)
        except TimeoutError:
            pass


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


def _check_version(job: RunningJob, version: int, where: str) -> None:
    """An agent cannot run a plan version the job never had (a stale or foreign agent)."""
    if version > job.version:
        raise FailedPrecondition(f"{where} = {version}: job {job.id} has no plan version above {job.version}")


def _within(budget: int, nodes: list) -> list:
    """Whole nodes, in name order, while their devices fit the budget."""
    out = []
    for node in nodes:
        if len(node[1]) > budget:
            break
        out.append(node)
        budget -= len(node[1])
    return out
