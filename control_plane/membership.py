"""Nodes coming and going: hellos and streams, nodes lost (gone past their grace, silent,
or a device hung) and the jobs shrunk onto the survivors, nodes joining and jobs grown onto
them. A mixin of ControlPlane (controller.py), whose state it shares."""

from __future__ import annotations

import asyncio
import json
import time

from drover.planner import Plan, make_plan
from drover.planner.ports import free_port
from drover.planner.wire import is_loopback_host, job_state_name, plan_to_proto
from drover.storage import queries
from drover.v1 import agent_pb2

from . import planning
from .running import AGENT_GRACE_S, PEER_SILENCE_S, REPLACED, RunningJob, check_version, log
from .validation import check_hello


class Membership:
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
        self.node_devices[hello.node] = {d["id"] for d in devices}
        self.device_tflops.update({d["id"]: d["tflops"] for d in devices})  # the detector's yardstick
        self.outboxes[hello.node] = queue
        self._heard_from[hello.node] = time.monotonic()
        if hello.node in self._lost:
            self._lost.pop(hello.node).cancel()
        try:
            await self.store.write(
                lambda s: queries.upsert_node(s, hello.node, devices, nics, hello.agent_version, hello.probe_port)
            )
            self._offer(hello.node)
            running_here = {j.job_id: j for j in hello.jobs if job_state_name(j.state) == "running"}
            for ended in sorted(set(running_here) - set(self.jobs)):  # ended (cancelled, failed) while it was away
                queue.put_nowait(
                    agent_pb2.ControlMessage(command=agent_pb2.Command(cancel=agent_pb2.CancelJob(job_id=ended)))
                )
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
                check_version(job, running_here[job.id].active_plan_version, "hello.jobs.active_plan_version")
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
        self.last_seen[node] = time.time()
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
        if self.closing:  # the store is closing too; a restarted server marks every node away anyway
            return
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
            plan = await self._off_loop(make_plan, cluster, job.spec.model, "drover", self.planning_budget_s)
        except ValueError as exc:  # the survivors cannot hold the model
            await self._fail(job, f"{what} lost; the rest cannot run the job: {exc}")
            return
        ranks = {d.id: i for i, d in enumerate(cluster.usable)}
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

    def _offer(self, node: str) -> None:
        """A node came (back) or was undrained: a waiting job may fit now, and every running
        job hears a fresh offer of it, even one that turned it down before."""
        self.place_pending_soon()
        for job in self.jobs.values():
            job.join_skipped.discard(node)
        self._soon(self._grow_onto(node), f"grow onto {node}")

    def _may_grow(self, job: RunningJob) -> bool:
        """A job grows only up to what its resources ask: {nodes: N} N nodes, {devices: N} N
        devices (one that has lost some may grow back to them); neither, every free device.
        ({nodes: 1} grew onto every idle node, and a second such job waited for a free one.)"""
        wanted = job.spec.resources
        if wanted.nodes:
            return len(job.nodes) < wanted.nodes
        if wanted.devices:
            return len(job.ranks) < wanted.devices
        return True

    async def _grow_onto(self, node: str) -> None:
        """Offer a node that connected (new, or lost and back) to the running jobs, oldest
        first: the first whose plan the planner predicts at least min_gain faster with the
        node's free devices grows onto them, at a step boundary (a new world of its workers).
        A drained node grows none (undraining offers it again)."""
        async with self._placing:
            if await self.store.query(lambda s: queries.get_node(s, node).drained):
                return
            for job in sorted(self.jobs.values(), key=lambda j: j.id):
                if node in job.nodes or node in job.join_skipped or job.ending or node not in self.outboxes:
                    continue
                if not self._may_grow(job):
                    continue  # it has what it asked for: the node stays free for the next job
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
                    if job.spec.resources.devices:  # up to the devices it asked for
                        name, free, nics = nodes[-1]
                        nodes[-1] = (name, free[: job.spec.resources.devices - len(job.ranks)], nics)
                    if not nodes[-1][1]:
                        return  # nothing free on it
                    cluster = planning.cluster_of(nodes)
                    model = job.spec.model
                    grown = await self._off_loop(
                        planning.propose, cluster, model, job.plan, {}, self.restart_s, self.planning_budget_s
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
        job.set_plan(plan, version)
        job.ranks, job.nodes = ranks, nodes
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
