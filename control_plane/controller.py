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
import time
from concurrent.futures import ThreadPoolExecutor

from drover.planner import plan_from_dict
from drover.planner.errors import SpecError
from drover.storage import queries
from drover.storage.db import Store
from drover.storage.models import Job

from .admission import Admission
from .detector import Detector, DetectorSettings
from .intake import Intake
from .jobfile import JobSpec, job_from_stored
from .logs import LogRouter
from .membership import Membership
from .metrics import PlaneMetrics
from .rollout import Rollouts
from .running import DEVICE_SILENCE_S, FLUSH_EVERY_S, FLUSH_ROWS, PLANNING_BUDGET_S, RunningJob, log


class ControlPlane(Membership, Admission, Intake, Rollouts):
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
        self.planning_budget_s = PLANNING_BUDGET_S
        self.device_silence_s = device_silence_s
        self.detection_paused = False
        self.outboxes: dict[str, asyncio.Queue] = {}  # node -> messages for its agent
        self.hosts: dict[str, str] = {}  # node -> the address its agent connects from
        self.node_devices: dict[str, set[str]] = {}  # node -> the device ids of its latest hello
        self.device_tflops: dict[str, float] = {}  # device -> its nominal TFLOP/s, as its hello said
        self.jobs: dict[str, RunningJob] = {}
        self._lost: dict[str, asyncio.Task] = {}
        self._heard_from: dict[str, float] = {}  # node -> when its stream last brought a message (monotonic)
        self.last_seen: dict[str, float] = {}  # node -> the same, wall clock, not yet written (Node.last_seen)
        self._handling: dict[str, int] = {}  # node -> its messages being handled now (its later ones wait)
        self.pending: list[str] = []  # jobs waiting for devices, oldest first
        self.closing = False
        self._placing = asyncio.Lock()
        self._background: set[asyncio.Task] = set()
        self.flusher: asyncio.Task | None = None
        self._saved_steps: dict[str, int] = {}  # job -> step last written
        self._saved_progress: dict[str, dict | None] = {}  # job -> progress last written
        self.new_events = asyncio.Event()  # set when an event is stored; watchers wait on it
        self.metrics = PlaneMetrics()
        self.logs = LogRouter()  # workers' logs on their way from agents to `drover job logs`

    async def recover(self) -> None:
        """Rebuild running jobs from storage (after a restart)."""

        def load(session):
            self.detection_paused = queries.setting(session, "detection_paused", False)
            for node in queries.nodes(session):
                node.connected = False  # until its agent says hello again
            self.pending = [job.id for job in queries.jobs(session) if job.state == "pending"]
            return [
                (job, queries.get_plan(session, job.id), queries.newest_history_step(session, job.id))
                for job in queries.jobs(session)
                if job.state == "running"
            ]

        for job, plan_row, history_step in await self.store.write(load):
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
                    history_step=history_step,  # agents send their newest steps again: kept once
                )
            )
        for node in sorted({n for job in self.jobs.values() for n in job.nodes}):
            self._expect_back(node)  # a node that never comes back fails its jobs, as after a disconnect

    async def pause_detection(self, paused: bool) -> None:
        """Pause (or resume) replanning on detected stragglers, for every job; stored, so a
        restarted control plane keeps it."""
        await self.store.write(lambda s: queries.set_setting(s, "detection_paused", paused))
        self.detection_paused = paused

    async def _stored_spec(self, row: Job) -> JobSpec | None:
        """A stored job's spec; None, with the job failed, if this version cannot read it (its
        rules changed): one unreadable job must not hold up the others or the start-up."""
        try:
            return job_from_stored(row.model_yaml, f"job {row.id}")
        except SpecError as exc:
            await self._fail_stored(row.id, f"this control plane cannot read the stored job: {exc}"[:4096])
            return None

    async def _fail_stored(self, job_id: str, detail: str) -> None:
        """Fail a job that is not running (queued, or unreadable after a restart): its state,
        detail and last event."""

        def fail(session):
            stored = queries.get_job(session, job_id)
            stored.state, stored.detail = "failed", detail
            queries.add_event(session, job_id, stored.step, "job_failed", {"reason": detail})

        await self.store.write(fail)
        self.new_events.set()
        log.error("job %s failed: %s", job_id, detail)

    def _track(self, job: RunningJob) -> None:
        self.jobs[job.id] = job
        job.reconciler = asyncio.create_task(self._reconcile_forever(job), name=f"reconcile {job.id}")

    async def close(self) -> None:
        """Stop the background work, write what is buffered, close the store."""
        self.closing = True  # streams ending from here on expect no node back (see _expect_back)
        tasks = [self.flusher] + [j.reconciler for j in self.jobs.values()] + list(self._lost.values())
        tasks += list(self._background)
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
        self.planning.shutdown(wait=False, cancel_futures=True)
        if not self.store.closed:  # closed once
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

    async def flush(self) -> None:
        steps = {j.id: j.step for j in self.jobs.values() if self._saved_steps.get(j.id) != j.step}
        progress = {j.id: j.progress for j in self.jobs.values() if self._saved_progress.get(j.id) is not j.progress}
        seen, self.last_seen = self.last_seen, {}

        def save(session):
            queries.set_last_seen(session, seen)
            for job_id, step in steps.items():
                queries.get_job(session, job_id).step = step
            for job_id, figures in progress.items():
                queries.set_progress(session, job_id, figures)

        with self.metrics.flush_time.time():
            try:
                await self.store.flush_samples(also=save if steps or progress or seen else None)
            except Exception:
                self.last_seen = seen | self.last_seen  # written with the next flush
                raise
        self._saved_steps.update(steps)  # only once they are stored: a failed flush retries them
        self._saved_progress.update(progress)
