"""What agents report: telemetry (samples, progress, links measured) and job statuses, and
link probes asked of them. Only records and wakes the job's reconcile task. A mixin of
ControlPlane (controller.py), whose state it shares."""

from __future__ import annotations

import asyncio
import json
import math
import time

from drover.planner.wire import job_state_name
from drover.storage import queries
from drover.storage.models import HistoryPoint, NicSample, TelemetrySample
from drover.v1 import agent_pb2

from .metrics import lag_of
from .running import MAX_LINKS, PROBE_EVERY_S, PROBE_S, RunningJob, check_version, progress_dict
from .validation import InvalidArgument, PermissionDenied, check_telemetry


class Intake:
    async def telemetry(self, node: str, message: agent_pb2.Telemetry) -> None:
        """Record what the agent observed and wake the job's reconcile task; decide nothing here."""
        check_telemetry(message)
        self.metrics.telemetry_lag.observe(lag_of(message.time, time.time()))
        # Stored with the agent's clock, but never ahead of ours: retention trims by it, and a
        # sample from the far future would never be trimmed.
        at = min(message.time, time.time())
        job = self._job_placed_on(node, message.job_id)
        own = self.node_devices.get(node, set())
        for i, s in enumerate(message.devices):  # checked before anything is kept
            if s.device not in own:
                raise PermissionDenied(
                    f"telemetry.devices[{i}].device = {s.device[:80]!r}: node {node} reports for its own devices "
                    "only, those of its hello"
                )
            if job is not None and s.step >= job.spec.steps:
                raise InvalidArgument(
                    f"telemetry.devices[{i}].step = {s.step}: job {job.id} has {job.spec.steps} steps"
                )
        if job is not None:
            check_version(job, message.active_plan_version, "telemetry.active_plan_version")
            for i, m in enumerate(message.migrations):
                check_version(job, m.plan_version, f"telemetry.migrations[{i}].plan_version")
                if m.step >= job.spec.steps:
                    raise InvalidArgument(
                        f"telemetry.migrations[{i}].step = {m.step}: job {job.id} has {job.spec.steps} steps"
                    )
        for field in ("lost_devices", "stalled_devices"):
            for i, device in enumerate(getattr(message, field)):
                if device not in own:
                    raise PermissionDenied(f"telemetry.{field}[{i}] = {device[:80]!r}: not a device of {node}")
        # A device of this node that a recovery has left out of the job is news no more, not an
        # offence: its samples, loss or stall were on their way when the job's world changed. (Such
        # a stall once ended the node's stream, which lost the node and its healthy devices too.)
        current = (lambda device: device in job.ranks) if job is not None else (lambda device: True)
        samples = [s for s in message.devices if current(s.device)]
        lost = [d for d in message.lost_devices if current(d)]
        stalled = [d for d in message.stalled_devices if current(d)]
        if job is not None and lost:
            await self._event(job, "device_lost", {"node": node, "devices": lost})
            await self._recover_job(job, set(), set(lost))
            return
        if job is not None and stalled:
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
            if node == job.rank0_node():  # only rank 0's agent reports progress; anything else is kept out
                job.progress = progress_dict(message.progress)
                steps = [p for p in (message.steps or [message.progress]) if job.history_step < p.step < job.spec.steps]
                self.store.buffer_samples(HistoryPoint, [self._history_point(job, p, message, at) for p in steps])
                job.history_step = max([job.history_step] + [p.step for p in steps])
        if job is not None:
            sizes = job.tp_sizes(message.active_plan_version)
            for s in samples:
                job.heard[s.device] = time.monotonic()
                job.samples[s.device] = (s.compute_s_per_block, s.p2p_wait_s, s.grad_sync_s)
                if s.compute_s_per_block > 0:
                    # Judged as work done at the device's own nominal speed: a healthy GPU of a
                    # slower kind, or one with a larger share of a block (a smaller TP group), read
                    # as a straggler against the job's median (spec: a rate is against its own GPU).
                    work = s.compute_s_per_block * (self.device_tflops.get(s.device) or 1.0) * sizes.get(s.device, 1)
                    job.detector.observe(s.device, s.step, work, s.p2p_wait_s, s.grad_sync_s)
                else:  # idle (left out of the plan): no work to judge, and an old window would mislead
                    job.detector.forget(s.device)
                job.step = max(job.step, s.step)
        rates = job.detector.rates() if job is not None and samples else {}
        self.store.buffer_samples(
            TelemetrySample,
            [
                {
                    "job_id": message.job_id,
                    "device": s.device,
                    "time": at,
                    "step": s.step,
                    "compute_s_per_block": s.compute_s_per_block,
                    "p2p_wait_s": s.p2p_wait_s,
                    "grad_sync_s": s.grad_sync_s,
                    "rate": rates.get(s.device, 1.0),
                }
                for s in samples
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
                    "time": at,
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
            if (node, m.plan_version, m.recovered_from) in job.migrations_reported:
                continue  # a report repeated is not another migration
            job.migrations_reported.add((node, m.plan_version, m.recovered_from))
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

    def _history_point(self, job: RunningJob, progress, message: agent_pb2.Telemetry, at: float) -> dict:
        return {
            "job_id": job.id,
            "step": progress.step,
            "time": at,
            "loss": progress.loss if math.isfinite(progress.loss) else None,
            "lr": progress.lr,
            "samples_per_s": progress.samples_per_s,
            "plan_version": message.active_plan_version,
            "rates_json": json.dumps(job.device_rates()),
        }

    async def _record_links(self, job: RunningJob, node: str, links) -> None:
        # A probe's result can arrive after its peer left the job (a recovery): dropped, like
        # any sample that names no other node of the job, rather than ending the stream.
        now = time.time()  # the control plane's clock: a NIC's rounds of probes are told apart by it
        samples = [
            {"nic": k.nic, "peer": k.peer, "gbps": k.gbps, "time": now}
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
