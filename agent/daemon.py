"""The node agent: dial the control plane, say hello, stream telemetry,
run the job's workers and apply what comes down the stream.

Level-triggered, like flocker's agent loop: after any reconnect the agent
sends its whole state (Hello with the jobs it runs and the plan version
active), and the control plane answers with the newest plans. Nothing
depends on a message having been seen before.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import shutil
import time
from pathlib import Path

import grpc

from drover.metrics import serve as serve_metrics
from drover.metrics import stop as stop_metrics
from drover.planner.cluster import Cluster
from drover.planner.wire import STREAM_OPTIONS, host_port, job_state, plan_from_proto
from drover.v1 import agent_pb2, agent_pb2_grpc

from . import discovery, probe
from .logs import JOB_ID, MAX_READERS, Credit, send_logs
from .metrics import registry_of
from .runtime.handoff import start_worker_launcher
from .supervisor import FailedHere, JobWorkers, inside

MAX_LINKS_SENT = 256  # link samples per telemetry message (the control plane keeps as many)
MAX_STEPS_SENT = 256  # steps' progress per telemetry message, the oldest not yet sent
MAX_SAMPLES_SENT = 512  # device samples per telemetry message, the newest (the rest are dropped)

log = logging.getLogger("drover.agent")
# An attempt is one TCP connection, cheap for a control plane even from a thousand agents,
# while every job waits for its agents: back within a second of the control plane's return.
RECONNECT_MAX_S = 1.0
AGENT_VERSION = "0.1.0"
HEARTBEAT_S = 2.0  # telemetry goes up when workers report a step, or at least this often
FORGET_AFTER_S = 300.0  # an ended job stays in hellos this long after its end went up, then is dropped


def _credentials(tls_dir: Path, node: str) -> grpc.ChannelCredentials:
    """Mutual TLS: this node's certificate (node-NODE.pem, from `drover certs init`), and
    only a control plane whose certificate the cluster's CA signed is believed."""
    for name in ("ca.pem", f"node-{node}.key", f"node-{node}.pem"):
        if not (tls_dir / name).is_file():
            hint = "drover certs init makes it" if name == "ca.pem" else f"drover certs add-node {node} makes it"
            raise FileNotFoundError(errno.ENOENT, f"no such file ({hint}, with --dir {tls_dir})", str(tls_dir / name))
    return grpc.ssl_channel_credentials(
        root_certificates=(tls_dir / "ca.pem").read_bytes(),
        private_key=(tls_dir / f"node-{node}.key").read_bytes(),
        certificate_chain=(tls_dir / f"node-{node}.pem").read_bytes(),
    )


class AgentReplaced(RuntimeError):
    """Another agent process said hello as this node: this one stops (drover agent exits 1)."""


async def off_the_loop(abandoned: set, start, *args, **kwargs):
    """start(*args, **kwargs) in a thread. A job's input check and its worker starts wait on the
    worker launcher, which on a fresh agent may still be importing torch: heartbeats go on
    meanwhile. If the waiting is cancelled first, what was being started stops once it has
    started; until then it is in `abandoned`, for an agent that exits to wait on and stop (the
    loop is gone by the time the thread ends, and its workers were left running)."""
    starting = asyncio.ensure_future(asyncio.to_thread(start, *args, **kwargs))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        abandoned.add(starting)
        starting.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().stop())
        starting.add_done_callback(abandoned.discard)
        raise


class Outbox:
    """What goes up the stream: hellos, telemetry and status before any log chunk, so a
    reader of long logs never delays what the control plane judges the node by."""

    def __init__(self):
        self._queue: asyncio.PriorityQueue = asyncio.PriorityQueue()
        self._order = itertools.count()  # first in, first out within a priority

    def put_nowait(self, message: agent_pb2.AgentMessage) -> None:
        self._queue.put_nowait((0, next(self._order), message))

    def put_log(self, message: agent_pb2.AgentMessage) -> None:
        self._queue.put_nowait((1, next(self._order), message))

    async def get(self) -> agent_pb2.AgentMessage:
        return (await self._queue.get())[2]


class Agent:
    def __init__(
        self,
        control_plane: str,
        node: str,
        cpu_devices: int = 0,
        interval_s: float = 0.5,
        work_dir: str = ".drover-agent",
        data_root: str = "drover-data",
        tls_dir: str | Path | None = None,
        model_modules: tuple[str, ...] = (),
        emulate: Cluster | None = None,
        metrics_address: str | None = None,
        advertise_address: str = "",
        probe_port: int = 0,
    ):
        """emulate: this node is node NODE of an emulated cluster: paced devices and NICs as
        the cluster file gives them (discovery.emulated), not what the machine has.
        metrics_address: HOST:PORT to serve Prometheus metrics at (agent/metrics.py), plain HTTP.
        advertise_address: the IP address this node's workers are reached at, when it is not
        the one the agent connects to the control plane from. probe_port: the link-probe
        responder's TCP port (0: any free one)."""
        self.address, self.node, self.interval_s = control_plane, node, interval_s
        if emulate is not None:
            self.devices, self.nics = discovery.emulated(emulate, node)
            labelled = discovery.emulated_nics()  # inside an emulated network: its interfaces
            # Without one, the file's NICs are names only: no address, so nothing probes them.
            self.nics = discovery.with_addresses(labelled) if labelled else self.nics
        else:
            self.devices = discovery.devices(node, cpu_devices)
            self.nics = discovery.with_addresses(discovery.nics())
        self.probe_port = probe_port  # the link-probe responder's (once it runs, the one it got)
        self._links: dict[str, list] = {}  # job -> LinkSamples measured, for its next telemetry
        self.work_dir = Path(work_dir)
        self.data_root = Path(data_root)  # every job's output lies inside it
        self.model_modules = tuple(model_modules)  # what custom models' entry points may import
        self.credentials = _credentials(Path(tls_dir), node) if tls_dir is not None else None
        self.jobs: dict[str, JobWorkers] = {}
        self.straggled: dict[str, float] = {}  # device -> rate `drover straggle` set (emulation)
        self.abandoned: set[asyncio.Future] = set()  # job starts whose waiting was cancelled (off_the_loop)
        self._nic_counters: dict[str, tuple[float, int, int]] = {}
        self._reported: set[str] = set()  # jobs whose end this session's stream has carried
        self._steps_to_send: dict[str, list[dict]] = {}  # job -> steps' figures not yet sent, oldest first
        self._ended_at: dict[str, float] = {}  # job -> when its end first went up (monotonic)
        self._last_sent: dict[str, float] = {}  # job -> when its last telemetry went up
        self._probing: set[asyncio.Task] = set()
        self._log_readers: dict[str, tuple[asyncio.Task, Credit]] = {}  # request id -> its sender
        self._outbox: Outbox | None = None  # the current stream's
        self.metrics_address, self.advertise_address = metrics_address, advertise_address
        self.connected, self.connections = False, 0  # the stream's state, for /metrics
        self.nic_rates: list[agent_pb2.NicSample] = []  # the newest NIC rates
        self.probed: dict[tuple[str, str], float] = {}  # (nic, peer) -> newest probe's Gbps
        start_worker_launcher()  # before the agent lowers its priority: workers keep the full one

    async def run_forever(self) -> None:
        """Until cancelled; the workers are stopped on the way out."""
        backoff = 0.2
        metrics_http = self._serve_metrics() if self.metrics_address else None
        server, self.probe_port = await probe.serve(self.probe_port)
        try:
            while True:
                try:
                    await self._session()
                    backoff = 0.2
                except (grpc.aio.AioRpcError, ConnectionError) as exc:
                    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
                    if code == grpc.StatusCode.FAILED_PRECONDITION and "newer stream" in (exc.details() or ""):
                        # Another agent process speaks for this node now: reconnecting would only
                        # take the node back from it, and the two would do so forever.
                        raise AgentReplaced(
                            f"another agent now serves node {self.node} (its stream replaced this one's); "
                            "this one stops"
                        ) from None
                    # The details say why: a TLS handshake refused (a certificate our CA did
                    # not sign, or ours refused) reads UNAVAILABLE like a server that is down.
                    why = f"{code.name}: {(exc.details() or '')[:300]}" if code else str(exc)
                    log.warning(
                        "control plane %s: %s; retrying in %.1fs",
                        *(self.address, why, backoff),
                        extra={"event": "disconnected", "code": str(code or exc)},
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
        finally:
            server.close()
            if metrics_http is not None:
                await asyncio.to_thread(stop_metrics, metrics_http)
            self.stop()
            for starting in list(self.abandoned):  # workers still starting: stopped once started
                try:
                    (await starting).stop()
                except Exception:
                    pass  # the start failed: nothing runs

    def _serve_metrics(self):
        # Plain HTTP: a node's certificate is a client's on purpose (it names no host, so it can
        # never pass for the control plane's), so bind this where only the scraper reaches.
        http, _ = serve_metrics(self.metrics_address, registry_of(self, asyncio.get_running_loop()))
        log.info("metrics at http://%s/metrics", self.metrics_address)
        return http

    async def _session(self) -> None:
        if self.credentials is None:
            channel = grpc.aio.insecure_channel(self.address, options=STREAM_OPTIONS)
        else:
            channel = grpc.aio.secure_channel(self.address, self.credentials, options=STREAM_OPTIONS)
        async with channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            outbox = Outbox()
            self._outbox = outbox
            # Jobs whose end went up in an earlier stream are done with. Every other job sends its
            # newest steps again (the control plane keeps each once), after those it has not sent
            # yet, then the steps its workers ran while no stream was up; a job that ended
            # meanwhile reports its end after them, and is said running in the hello till then
            # (the control plane takes no steps of a job it has ended).
            self._reported = set(self._ended_at)
            for job_id, workers in self.jobs.items():
                if job_id not in self._reported:
                    resent = {id(row) for row in workers.recent_steps}
                    unsent = [row for row in self._steps_to_send.get(job_id, []) if id(row) not in resent]
                    self._steps_to_send[job_id] = unsent + list(workers.recent_steps)
            outbox.put_nowait(agent_pb2.AgentMessage(hello=self._hello()))

            # Written from a task of our own, not read by gRPC from an async generator: a stream
            # that failed while the generator awaited its next message (a refused call, an agent
            # paused past the keepalive) made gRPC close it from another task, and the log filled
            # with "aclose(): asynchronous generator is already running" at every retry.
            call = stub.Connect()

            async def send_forever():
                try:
                    while True:
                        await call.write(await outbox.get())
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    return  # the call has ended: reading it says how

            sender = asyncio.create_task(send_forever())
            ticker = None
            try:
                # Sent once the control plane has taken the hello (a server before that sent it with
                # its first message, which is then when this returns): logged "connected" at the first
                # job's start, an idle agent looked as if it never connected.
                await call.initial_metadata()
                if not call.done():  # (a refused hello ends the call with no metadata)
                    self.connected, self.connections = True, self.connections + 1
                    log.info("connected to the control plane at %s", self.address, extra={"event": "connected"})
                    # Only now: a tick takes the workers' new lines, and those of a stream that
                    # never came up were lost with it (steps run while the control plane was down).
                    ticker = asyncio.create_task(self._tick_forever(outbox))
                async for message in call:
                    await self._apply(message)
            finally:
                self.connected = False
                if ticker is not None:
                    ticker.cancel()
                sender.cancel()
                call.cancel()
                for reader, _ in self._log_readers.values():  # their requests ended with the stream
                    reader.cancel()
        raise ConnectionError("stream ended")

    def _hello(self) -> agent_pb2.Hello:
        return agent_pb2.Hello(
            node=self.node,
            agent_version=AGENT_VERSION,
            devices=[
                agent_pb2.Device(
                    id=d.id, kind=d.kind, name=d.name, memory_gib=d.memory_gib, tflops=d.tflops, intra_gbps=d.intra_gbps
                )
                for d in self.devices
            ],
            nics=[agent_pb2.Nic(name=n.name, type=n.type, gbps=n.gbps, address=n.address) for n in self.nics],
            probe_port=self.probe_port,
            advertise_address=self.advertise_address,
            jobs=[self._status(job_id, w, job_id not in self._reported) for job_id, w in self.jobs.items()],
        )  # ended ones too: level-triggered

    def _status(self, job_id: str, workers: JobWorkers, end_untold: bool = False) -> agent_pb2.JobStatus:
        """end_untold: its end goes up after its steps, as running till then."""
        state, detail = workers.state()
        return agent_pb2.JobStatus(
            job_id=job_id,
            state=job_state("running" if end_untold else state),
            step=max(workers.step, 0),
            active_plan_version=workers.active_version,
            detail="" if end_untold else detail,
        )

    # -- what comes down -------------------------------------------------------------

    async def _apply(self, message: agent_pb2.ControlMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "start_job":
            start = message.start_job
            if start.job_id in self.jobs:
                return  # already running it: the reconnect resend of desired state
            try:
                self.jobs[start.job_id] = await off_the_loop(
                    self.abandoned,
                    JobWorkers,
                    start.job_id,
                    json.loads(start.model_yaml),
                    start.steps,
                    start.seed,
                    start.world_size,
                    dict(start.ranks),
                    f"tcp://{host_port(start.master_addr, start.master_port)}",
                    plan_from_proto(start.plan, "start_job.plan"),
                    inside(self.data_root, start.out_dir),
                    self.node,
                    self.work_dir,
                    self.data_root,
                    joining=(
                        start.generation,
                        start.plan_version,
                        plan_from_proto(start.previous_plan, "start_job.previous_plan"),
                        dict(start.previous_ranks),
                    )
                    if start.generation
                    else None,
                    model_modules=self.model_modules,
                    paced={d.id: (d.tflops, d.rate) for d in self.devices if d.kind == "paced"},
                )
            except (OSError, ValueError) as exc:  # this job fails, with its cause; the agent carries on
                log.error("job %s cannot start here: %s", start.job_id[:80], exc)
                self.jobs[start.job_id] = FailedHere(f"workers could not start on {self.node}: {exc}")
                return
            workers = self.jobs[start.job_id]
            for device, rate in self.straggled.items():  # emulation: slowed before this job came
                if device in workers.local:
                    workers.straggle(device, rate, 0)
            log.info("started %d workers of %s", len(workers.local), start.job_id)
        elif kind == "recover":
            recover = message.recover
            workers = self.jobs.get(recover.job_id)
            if workers is not None:
                world = {
                    "generation": recover.generation,
                    "init_method": f"tcp://{host_port(recover.master_addr, recover.master_port)}",
                    "ranks": dict(recover.ranks),
                    "plan_version": recover.plan_version,
                    "plan": plan_from_proto(recover.plan, "recover.plan").to_dict(),
                }
                try:
                    workers.recover(world, dict(recover.ranks))
                except OSError as exc:
                    self._fail_here(recover.job_id, f"world {recover.generation} not handed on {self.node}: {exc}")
                log.info("handed world %d of %s to its workers", recover.generation, recover.job_id)
        elif kind == "plan":
            workers = self.jobs.get(message.plan.job_id)
            if workers is not None:
                try:
                    workers.hand_plan(message.plan.version, plan_from_proto(message.plan.plan, "plan"))
                except OSError as exc:  # its inbox is unwritable (a full disk): the job cannot follow plans
                    self._fail_here(
                        message.plan.job_id, f"plan {message.plan.version} not handed on {self.node}: {exc}"
                    )
        elif kind == "command":
            command = message.command
            if command.WhichOneof("body") == "straggle":
                # Kept for the jobs started here later (from their first step) until set back to 1.
                if command.straggle.rate > 1.0:
                    self.straggled[command.straggle.device] = command.straggle.rate
                else:
                    self.straggled.pop(command.straggle.device, None)
                for job_id, workers in list(self.jobs.items()):
                    try:
                        workers.straggle(command.straggle.device, command.straggle.rate, command.straggle.from_step)
                    except OSError as exc:
                        self._fail_here(job_id, f"straggle not handed on {self.node}: {exc}")
            elif command.WhichOneof("body") == "stop_workers":
                workers = self.jobs.get(command.stop_workers.job_id)
                if workers is not None:
                    workers.stop_devices(list(command.stop_workers.devices))
            elif command.WhichOneof("body") == "probe_links":
                task = asyncio.get_running_loop().create_task(self._probe(command.probe_links))
                self._probing.add(task)
                task.add_done_callback(self._probing.discard)
            elif command.WhichOneof("body") == "read_logs":
                self._read_logs(command.read_logs)
            elif command.WhichOneof("body") == "stop_logs":
                reader = self._log_readers.get(command.stop_logs.request_id)
                if reader is not None:
                    reader[0].cancel()
            elif command.WhichOneof("body") == "ack_logs":
                reader = self._log_readers.get(command.ack_logs.request_id)
                if reader is not None:
                    reader[1].give(command.ack_logs.chunks)
            elif command.WhichOneof("body") == "forget_job":
                await self._forget(command.forget_job.job_id)
            elif command.WhichOneof("body") == "cancel":
                workers = self.jobs.pop(command.cancel.job_id, None)
                if workers is not None:
                    workers.stop()

    def _drop(self, job_id: str) -> None:
        """Forget a job that has ended: nothing of it is kept in memory."""
        for kept in (self.jobs, self._ended_at, self._steps_to_send, self._links, self._last_sent):
            kept.pop(job_id, None)
        self._reported.discard(job_id)

    async def _forget(self, job_id: str) -> None:
        """A deleted job: its folder under the work dir goes (inbox, worker logs), unless its
        workers still run here; its output folder is the user's."""
        workers = self.jobs.get(job_id)
        if workers is not None and workers.state()[0] == "running":
            log.warning("job %s was deleted while its workers run here: its folder stays", job_id[:80])
            return
        if not JOB_ID.fullmatch(job_id):
            return  # names no folder of ours
        if workers is not None:
            workers.stop()
        self._drop(job_id)
        folder = self.work_dir / job_id
        if folder.is_dir() and not folder.is_symlink():
            await asyncio.to_thread(shutil.rmtree, folder, True)  # a job's logs: not on the event loop
            log.info("removed %s of deleted job %s", folder, job_id)

    def _read_logs(self, request: agent_pb2.ReadLogs) -> None:
        outbox = self._outbox

        def running() -> bool:
            workers = self.jobs.get(request.job_id)
            return workers is not None and workers.state()[0] == "running"

        if len(self._log_readers) >= MAX_READERS or request.request_id in self._log_readers:
            note = f"{len(self._log_readers)} log requests are being served on {self.node}, the most at once"
            chunk = agent_pb2.LogChunk(request_id=request.request_id, end=True, note=note)
            outbox.put_log(agent_pb2.AgentMessage(log_chunk=chunk))
            return
        credit = Credit(request.window)
        task = asyncio.get_running_loop().create_task(
            send_logs(self.work_dir, self.node, request, outbox.put_log, running, credit)
        )
        self._log_readers[request.request_id] = (task, credit)
        task.add_done_callback(lambda _: self._log_readers.pop(request.request_id, None))

    async def _probe(self, command: agent_pb2.ProbeLinks) -> None:
        """Each target in turn (probes at once would share the links they measure)."""
        own = {n.name: n.address for n in self.nics}
        for target in command.targets:
            if target.nic not in own:
                continue  # not an interface of this node: nothing to measure from
            gbps = await probe.probe(target.address, target.port, target.bytes, own[target.nic])
            sample = agent_pb2.LinkSample(nic=target.nic, peer=target.peer, gbps=gbps, time=time.time())
            self.probed[(target.nic, target.peer)] = gbps
            self._links.setdefault(command.job_id, []).append(sample)
            log.info("link %s -> %s: %.3f Gbps", target.nic, target.peer, gbps)

    # -- what goes up ------------------------------------------------------------------

    async def _tick_forever(self, outbox: Outbox) -> None:
        while True:
            for message in self._tick():
                outbox.put_nowait(message)
            await asyncio.sleep(self.interval_s)

    def _tick(self) -> list[agent_pb2.AgentMessage]:
        out = []
        nics = self._nic_samples()
        for job_id in [j for j, at in self._ended_at.items() if time.monotonic() - at > FORGET_AFTER_S]:
            self._drop(job_id)  # long reported: forgotten, so hellos stay small and old processes are let go
        for job_id, workers in list(self.jobs.items()):
            if job_id in self._reported:
                continue
            try:
                out += self._job_messages(job_id, workers, nics)
            except (OSError, ValueError, KeyError, TypeError) as exc:  # this job's files, not the agent
                self._fail_here(job_id, f"telemetry of {job_id} on {self.node} unreadable: {exc}")
        return out

    def _fail_here(self, job_id: str, detail: str) -> None:
        """End one job on this node with its cause (reported at the next tick); the others go on."""
        log.error("%s", detail[:300])
        self.jobs[job_id].stop()
        self.jobs[job_id] = FailedHere(detail[:1000])

    def _job_messages(self, job_id: str, workers, nics) -> list[agent_pb2.AgentMessage]:
        out = []
        samples = [
            agent_pb2.DeviceSample(  # idle devices report zeros: they are alive, not slow
                device=row["device"],
                step=row["step"],
                compute_s_per_block=row["compute_s_per_block"] or 0.0,
                p2p_wait_s=row["p2p_wait_s"],
                grad_sync_s=row["grad_sync_s"],
            )
            # The newest: after an outage thousands wait, past what a message may carry (1,024), and
            # the detector judges by the newest anyway.
            for row in workers.new_telemetry()[-MAX_SAMPLES_SENT:]
        ]
        migrations = [
            agent_pb2.Migration(
                step=m["step"],
                plan_version=m["plan_version"],
                bytes_moved=m["bytes_moved"],
                blocks_moved=m["blocks_moved"],
                seconds=m["seconds"],
                recovered_from=m.get("recovered_from", ""),
                steps_redone=m.get("steps_redone", 0),
            )
            for m in workers.new_migrations()
        ]
        # Oldest first, at most MAX_STEPS_SENT a message: the rest wait for the next ticks.
        backlog = self._steps_to_send.get(job_id, []) + workers.new_progress()
        steps, self._steps_to_send[job_id] = backlog[:MAX_STEPS_SENT], backlog[MAX_STEPS_SENT:]
        stalled, lost = workers.stalled(), workers.lost_devices()
        progress = workers.progress if steps else None  # the newest read: the steps may be older ones sent again
        links = self._links.get(job_id, [])[:MAX_LINKS_SENT]
        self._links[job_id] = self._links.get(job_id, [])[MAX_LINKS_SENT:]
        now = time.time()
        news = samples or migrations or progress or stalled or lost or links
        if news or now - self._last_sent.get(job_id, 0.0) >= HEARTBEAT_S:
            self._last_sent[job_id] = now  # nothing new: only a heartbeat now and then
            out.append(
                agent_pb2.AgentMessage(
                    telemetry=agent_pb2.Telemetry(
                        time=now,
                        job_id=job_id,
                        active_plan_version=workers.active_version,
                        devices=samples,
                        nics=nics,
                        migrations=migrations,
                        progress=progress,
                        steps=steps,
                        stalled_devices=stalled,
                        lost_devices=lost,
                        links=links,
                    )
                )
            )
        if workers.state()[0] != "running" and not self._steps_to_send[job_id]:  # the end, once per stream, last
            out.append(agent_pb2.AgentMessage(status=self._status(job_id, workers)))
            self._reported.add(job_id)
            self._ended_at.setdefault(job_id, time.monotonic())
            workers.stop()
        return out

    def _nic_samples(self) -> list[agent_pb2.NicSample]:
        now, out = time.time(), []
        for nic in self.nics:
            tx, rx = discovery.nic_bytes(nic.name)
            if nic.name in self._nic_counters:
                then, tx0, rx0 = self._nic_counters[nic.name]
                dt = max(now - then, 1e-6)
                out.append(
                    agent_pb2.NicSample(
                        nic=nic.name, tx_bytes_per_s=max(0, tx - tx0) / dt, rx_bytes_per_s=max(0, rx - rx0) / dt
                    )
                )
            self._nic_counters[nic.name] = (now, tx, rx)
        self.nic_rates = out
        return out

    def stop(self) -> None:
        for workers in self.jobs.values():
            workers.stop()
