"""Jobs in and out: submission, placement on free devices (a queue while none are), start,
cancel, replan and straggle requests, drained nodes. A mixin of ControlPlane (controller.py),
whose state it shares."""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from pathlib import PurePosixPath

from drover.planner import PlanError, SpecError, make_plan
from drover.planner.cluster import MAX_RATE
from drover.planner.errors import quote
from drover.planner.ports import free_port
from drover.planner.wire import is_loopback_host, plan_to_proto
from drover.storage import queries
from drover.storage.models import Job
from drover.v1 import agent_pb2

from . import planning
from .detector import Detector
from .jobfile import JobSpec, job_from_stored
from .running import MAX_JOB_DEVICES, TERMINAL, RunningJob, log, log_event, whole_nodes_within
from .validation import FailedPrecondition, InvalidArgument, PermissionDenied, check_out_dir


class Admission:
    async def submit(self, spec: JobSpec, out_dir: str) -> Job:
        out_dir = check_out_dir(out_dir)
        job_id = f"job-{int(time.time() * 1000) % 10**10}{secrets.randbelow(100):02d}"  # unique, and a number
        out = out_dir or f"jobs/{job_id}"  # relative: each agent resolves it inside its data root
        model_yaml = json.dumps(spec.wire_dict())  # a restarted control plane reads it back
        async with self._placing:  # one placement at a time: two jobs never get the same device
            if not any(self.outboxes):
                raise FailedPrecondition("no connected, undrained node with devices: start agents first")
            await self._check_folders_free(spec, out)
            nodes, reason = await self._placement(spec)
            return await self._create(job_id, spec, model_yaml, out, nodes, reason)

    async def _create(self, job_id, spec: JobSpec, model_yaml: str, out: str, nodes, reason: str) -> Job:
        def row(state: str, detail: str) -> Job:
            return Job(
                id=job_id,
                state=state,
                model_yaml=model_yaml,
                model_name=spec.model.name,
                steps=spec.steps,
                seed=spec.seed,
                out_dir=out,
                created=time.time(),
                detail=detail,
            )

        if nodes is not None:  # planned before anything is stored: a job no plan fits leaves no trace
            cluster, plan = await self._plan(spec, nodes)
            return await self._start(job_id, spec, out, nodes, cluster, plan, new_row=row("running", ""))

        def create(session):
            session.add(row("pending", reason))
            session.flush()
            queries.add_event(session, job_id, 0, "job_pending", {"reason": reason})
            return queries.get_job(session, job_id)

        stored = await self.store.write(create)
        self.pending.append(job_id)
        self.new_events.set()
        log_event(job_id, "job_pending", 0, {"reason": reason})
        return stored

    async def _check_folders_free(self, spec: JobSpec, out: str) -> None:
        """No folder the job writes (its out dir, its checkpoints) is, holds or lies in one a
        running or pending job writes: the two would overwrite each other's files and prune
        each other's checkpoints. Nor is its out dir the out dir of an ended job still on record:
        its trace, telemetry and model would be replaced. (One inside or around that folder
        replaces none of them; a checkpoint folder an ended job wrote may be written again: a
        job resumed from it goes on there.)"""
        active = [(job.id, "running", job.spec, job.out_dir) for job in self.jobs.values()]
        ended = []
        for row in await self.store.query(queries.jobs):
            if row.state in TERMINAL:
                ended.append((row.id, row.state, PurePosixPath(row.out_dir)))
            elif row.id not in self.jobs:  # pending, or running while its end is being stored
                try:
                    stored = job_from_stored(row.model_yaml, row.id)
                except SpecError:
                    stored = None  # fails when its turn comes (_stored_spec); its out_dir counts till then
                active.append((row.id, row.state, stored, row.out_dir))
        for field, mine in _written(spec, out):
            for job_id, state, other_spec, other_out in active:
                for _, theirs in _written(other_spec, other_out):
                    if mine == theirs or mine in theirs.parents or theirs in mine.parents:
                        raise FailedPrecondition(
                            f"{field} = {quote(str(mine))}: job {job_id} ({state}) writes to {quote(str(theirs))}; "
                            "two jobs in one folder overwrite each other's files"
                        )
        for job_id, state, theirs in ended:
            if PurePosixPath(out) == theirs:
                raise FailedPrecondition(
                    f"out_dir = {quote(out)}: job {job_id} ({state}) wrote its output there, which this job's "
                    f"would replace; give another out_dir, or have an admin forget job {job_id} first "
                    f"(drover job delete {job_id})"
                )

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
            return whole_nodes_within(MAX_JOB_DEVICES, whole[: wanted.nodes]), ""
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
            return whole_nodes_within(MAX_JOB_DEVICES, picked), ""
        if not free:
            if nodes:
                why = "every connected device runs another job"
            else:
                why = "every connected node is drained" if self.outboxes else "no node is connected"
            return None, f"waiting for a free device: {why}"
        return whole_nodes_within(MAX_JOB_DEVICES, free), ""

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
            try:
                cluster, plan = await self._plan(spec, nodes)
            except Exception as exc:  # this job alone fails: the jobs queued behind it still start
                if not isinstance(exc, PlanError):
                    log.exception("planning pending job %s failed", job_id)
                cause = exc.detail if isinstance(exc, PlanError) else f"{type(exc).__name__} (a bug: see the log)"
                await self._fail_stored(job_id, f"planning on the free devices failed: {cause}"[:4096])
                continue
            await self._start(job_id, spec, row.out_dir, nodes, cluster, plan)

    async def _plan(self, spec: JobSpec, nodes: list):
        """(cluster, plan) of a job on these nodes' devices."""
        cluster = planning.cluster_of(nodes)
        return cluster, await self._off_loop(make_plan, cluster, spec.model, "drover", self.planning_budget_s)

    async def _start(
        self, job_id, spec: JobSpec, out: str, nodes: list, cluster, plan, new_row: Job | None = None
    ) -> Job:
        """Store the job as running with its first plan (as a new row, for a job not queued) and
        send every node its start."""
        devices = [d.id for d in cluster.usable]
        ranks = {d: i for i, d in enumerate(devices)}
        master_addr = self.hosts.get(devices[0].split("/")[0], "127.0.0.1")  # rank 0's node
        # On this machine a free port is known; elsewhere take one per job from a fixed range.
        port = free_port() if is_loopback_host(master_addr) else 29500 + int(job_id.split("-")[1]) % 2000

        def place(session):
            if new_row is not None:
                session.add(new_row)
                session.flush()
                session.expire(new_row)  # read back whole below, as a stored row is
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

    async def cancel(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            # Not while pending jobs are being placed: this one may be planned and started in the
            # meantime (it would run on, reported cancelled). After, it is pending or running.
            async with self._placing:
                return await self._cancel(job_id)
        return await self._cancel(job_id)

    async def _cancel(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is not None:
            self._cancel_workers(job)
            row = await self._end(job, "cancelled", "cancelled by request", "job_cancelled", {})
            if row is not None:
                return row
        row = await self.store.query(lambda s: queries.get_job(s, job_id))  # NOT_FOUND if unknown
        if row.state != "pending":
            raise FailedPrecondition(f"job {job_id} is {row.state}; only a running or pending job can be cancelled")
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

    async def delete(self, job_id: str) -> list[str]:
        """Forget an ended job: its stored rows, and each connected agent's work-dir folder of
        it (its output folder is the user's). The nodes told."""
        async with self._placing:  # not while a pending job is being started
            row = await self.store.query(lambda s: queries.get_job(s, job_id))  # NOT_FOUND if unknown
            if row.state not in TERMINAL:
                raise FailedPrecondition(f"job {job_id} is {row.state}; cancel it first, then delete it")
            if job_id in self.jobs:
                raise FailedPrecondition(f"job {job_id} is {row.state} and still ending; try again in a moment")
            await self.flush()  # its last samples, buffered still, go before its rows do (not after)
            await self.store.write(lambda s: queries.delete_job(s, job_id))
        told = sorted(self.outboxes)
        forget = agent_pb2.ControlMessage(command=agent_pb2.Command(forget_job=agent_pb2.ForgetJob(job_id=job_id)))
        for node in told:
            self.outboxes[node].put_nowait(forget)
        # Logged, not stored: the job's events went with it.
        log.info("job %s deleted; agents told: %s", job_id, ", ".join(told) or "none", extra={"event": "job_deleted"})
        return told

    async def replan(self, job_id: str, reason: str) -> int:
        """Plan for what is measured now, whatever the detector thinks; the job's reconcile
        task does it, so it never runs at the same time as a detector-started round."""
        job = await self._running(job_id)
        version = asyncio.get_running_loop().create_future()
        job.forced.append((reason or "forced by request", version))
        job.wake.set()
        return await version

    async def straggle(self, device: str, rate: float, from_step: int) -> str:
        if not (math.isfinite(rate) and 1.0 <= rate <= MAX_RATE):
            raise InvalidArgument(f"rate = {rate!r}: a number >= 1.0 and <= {MAX_RATE:g} (1.0 restores the device)")
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
            self._offer(node)
        return row

    async def _running(self, job_id: str) -> RunningJob:
        if job_id not in self.jobs:
            row = await self.store.query(lambda s: queries.get_job(s, job_id))
            raise FailedPrecondition(f"job {job_id} is {row.state}, not running")
        return self.jobs[job_id]

    def _job_placed_on(self, node: str, job_id: str) -> RunningJob | None:
        """The running job, if any; an agent speaks only for jobs placed on its node."""
        job = self.jobs.get(job_id)
        if job is not None and node in job.former_nodes and node not in job.nodes:
            return None  # its last words, after the job went on without it
        if job is not None and node not in job.nodes:
            raise PermissionDenied(f"job {job_id[:80]!r} has no workers on node {node}")
        return job


def _written(spec: JobSpec | None, out: str) -> list[tuple[str, PurePosixPath]]:
    """The folders a job writes, each with the field that names it, inside an agent's data root."""
    folders = [("out_dir", PurePosixPath(out))]
    if spec is not None and spec.training.checkpoint is not None:
        folders.append(("checkpoint.dir", PurePosixPath(spec.training.checkpoint.dir)))
    return folders
