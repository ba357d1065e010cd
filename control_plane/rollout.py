"""The loop: one reconcile task per job observes, asks coordinator.decide and acts (plans
proposed off the event loop, pushed, committed), and the ends of jobs and their events. A
mixin of ControlPlane (controller.py), whose state it shares."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from drover.planner import Plan
from drover.planner.wire import plan_to_proto
from drover.storage import queries
from drover.storage.models import Job
from drover.v1 import agent_pb2

from . import coordinator, planning
from .coordinator import Observation, Proposal
from .running import RunningJob, log, log_event
from .validation import FailedPrecondition

WORLD_CHANGE_POLL_S = 0.05


class Rollouts:
    async def _reconcile_forever(self, job: RunningJob) -> None:
        while True:
            await job.wake.wait()
            job.wake.clear()
            # A recovery or growth under way has its new generation before its nodes and ranks
            # are stored: decide once it is done, for the world it makes. Not by taking its lock:
            # a job it ends waits for this task.
            while job.world_change.locked() and not job.ending:
                await asyncio.sleep(WORLD_CHANGE_POLL_S)
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
        def current(session):  # the job's world: a device a recovery left out is out of its plans too
            devices = [(n, [d for d in queries.devices_of(session, n) if d.id in job.ranks]) for n in job.nodes]
            return [(n, kept, queries.nics_of(session, n)) for n, kept in devices if kept]

        nodes = await self.store.query(current)
        proposal = await self._off_loop(
            planning.propose,
            planning.cluster_of(nodes),
            job.spec.model,
            job.plan,
            rates,
            self.restart_s,
            self.planning_budget_s,
        )
        return replace(proposal, links=planning.nic_gbps(nodes))  # what that cluster was made with

    async def _off_loop(self, fn, *args):
        """Plan in the planning thread, which the event loop never waits on."""

        def timed():
            started = time.monotonic()
            result = fn(*args)
            if (took := time.monotonic() - started) > self.planning_budget_s:
                log.warning(
                    "planning took %.1f s, past its %.0f s budget: the best plan found by then",
                    took,
                    self.planning_budget_s,
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
            job.set_plan(plan, row.version)
            job.planned_rates = dict(rates)
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
