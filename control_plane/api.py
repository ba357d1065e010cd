"""The grpc.aio servicers: thin, over ControlPlane, callers authenticated and
errors mapped to status codes in one place (server.py starts them, with health
checking and reflection).

Two ports: clients reach the job service over TLS with a bearer token; agents
reach the agent stream over mutual TLS, their certificate naming their node.
`--insecure` (loopback only) serves both without TLS and trusts everyone."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import time
from urllib.parse import unquote

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from drover.planner.errors import PlanError, SpecError
from drover.storage import queries
from drover.storage.errors import StoreClosed
from drover.storage.queries import NotFound
from drover.v1 import agent_pb2, agent_pb2_grpc, jobs_pb2, jobs_pb2_grpc

from .controller import ControlPlane
from .identity import Authenticator
from .limits import AGENT_MESSAGES, Pacer, RateLimiter, ResourceExhausted
from .logs import MAX_OPEN, MAX_TAIL_BYTES
from .logs import stream as stream_logs
from .messages import (
    MAX_PAGE_SIZE,
    event_message,
    job_message,
    next_token,
    node_message,
    page_of,
    plan_message,
    submitted_spec,
)
from .running import REPLACED, TERMINAL
from .validation import FailedPrecondition, InvalidArgument, PermissionDenied, Unauthenticated, check_bounds

log = logging.getLogger("drover.server")

STATUS_OF = [
    ((SpecError, PlanError, InvalidArgument), grpc.StatusCode.INVALID_ARGUMENT),
    ((NotFound,), grpc.StatusCode.NOT_FOUND),
    ((FailedPrecondition,), grpc.StatusCode.FAILED_PRECONDITION),
    ((Unauthenticated,), grpc.StatusCode.UNAUTHENTICATED),
    ((PermissionDenied,), grpc.StatusCode.PERMISSION_DENIED),
    ((ResourceExhausted,), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ((StoreClosed,), grpc.StatusCode.UNAVAILABLE),  # stopping: the caller retries against the next server
]
# The least role that may call each JobService RPC (reader < operator < admin).
ROLE_OF = {
    "GetJob": "reader",
    "ListJobs": "reader",
    "WatchEvents": "reader",
    "ListEvents": "reader",
    "GetPlan": "reader",
    "ListPlans": "reader",
    "ListNodes": "reader",
    "QueryTelemetry": "reader",
    "QueryHistory": "reader",
    "SubmitJob": "operator",
    "CancelJob": "operator",
    "DeleteJob": "admin",  # a job's whole record goes
    "StreamLogs": "operator",  # workers' output can hold what readers should not see
    "Replan": "operator",
    "DrainNode": "operator",
    "UndrainNode": "operator",
    "SetDetection": "admin",
    "Straggle": "admin",
}
MAX_AGENT_STREAMS = 4096  # nodes a control plane serves at once
# A stream says hello within this, and one node's certificate has at most MAX_OPENING streams
# waiting to: streams that never said hello held their slots for good, and one leaked node key
# could take every slot.
HELLO_WITHIN_S = 10.0
# Event watches open at once: each replays its job's events, then waits; 4,096 took 167 MB and
# slowed every call for seconds (security review).
MAX_WATCHES = 512
MAX_OPENING = 4
SERVER_LIMITS = [
    ("grpc.so_reuseport", 0),  # a second server on the same port fails to start instead of sharing it
    ("grpc.max_receive_message_length", 1 << 20),  # a 1,024-device hello is ~50 KiB; a job 64 KiB
    ("grpc.max_concurrent_streams", 64),  # per connection: one agent stream, a few watches
    # Pings find a peer whose host went away without closing the connection: its streams end.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


# A refused or paced caller is logged once per REFUSALS_LOGGED_EVERY_S per peer and method: an
# operator sees a leaked token or a misconfigured agent, and a hostile peer cannot flood the log.
REFUSALS_LOGGED_EVERY_S = 60.0
_logged_at: dict[tuple[str, str], float] = {}


def _log_due(peer: str, what: str) -> bool:
    """Whether (peer, what) was not logged within REFUSALS_LOGGED_EVERY_S; if so, it is now."""
    now = time.monotonic()
    if now - _logged_at.get((peer, what), -math.inf) < REFUSALS_LOGGED_EVERY_S:
        return False
    if len(_logged_at) >= 4096:  # bounded: those logged over a minute ago are forgotten
        for key in [k for k, at in _logged_at.items() if now - at >= REFUSALS_LOGGED_EVERY_S]:
            del _logged_at[key]
    _logged_at[peer, what] = now
    return True


def _log_refusal(exc: Exception, context, method: str) -> None:
    peer = _peer_host(context.peer())
    if _log_due(peer, method):
        log.warning("refused %s from %s: %s", method, peer, str(exc)[:200])


async def _abort_for(exc: Exception, context, method: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc  # already a status
    if isinstance(exc, (Unauthenticated, PermissionDenied)):
        _log_refusal(exc, context, method)
    for kinds, code in STATUS_OF:
        if isinstance(exc, kinds):
            await context.abort(code, str(exc))
    # A bug, not the caller's fault: one log line, and no internals in the answer.
    log.error("%s failed: %s: %s", method, type(exc).__name__, str(exc)[:200])
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; the control plane's log has the cause")


class Malformed:
    """What a request that does not parse as its message type becomes (see `register`)."""

    def __init__(self, message_type: str):
        self.message_type = message_type


def _check(request) -> None:
    """A request's sizes and ranges; a stream's messages are checked one by one as they come."""
    if isinstance(request, Malformed):
        raise InvalidArgument(f"the request is not a valid {request.message_type} message")
    if isinstance(request, Message):
        name = type(request).__name__
        check_bounds(request, name)
        # Every request with a job id is about one job: none is not "no such job" but a mistake.
        if name.endswith("Request") and "job_id" in request.DESCRIPTOR.fields_by_name and not request.job_id:
            raise InvalidArgument(f"{name}.job_id: '' is empty; a job's id is required (drover job list shows them)")


def register(server: grpc.aio.Server, servicer, service) -> None:
    """Serve `servicer` for the service descriptor `service`, as the generated add_*_to_server
    would, except that bytes that do not parse become Malformed (INVALID_ARGUMENT), not UNKNOWN."""

    def parser(message_class):
        def parse(data: bytes):
            try:
                return message_class.FromString(data)
            except DecodeError:
                return Malformed(message_class.DESCRIPTOR.full_name)

        return parse

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {
        method.name: kinds[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=parser(GetMessageClass(method.input_type)),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def map_errors(cls):
    """Wrap every RPC of a servicer so the caller is authorised (the servicer's `_authorise`)
    and domain errors become status codes, once."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or not callable(method):
            continue
        if inspect.isasyncgenfunction(method):

            @functools.wraps(method)
            async def streaming(self, request, context, _method=method, _name=name):
                try:
                    self._authorise(_name, context)
                    _check(request)
                    async for item in _method(self, request, context):
                        yield item
                except Exception as exc:  # noqa: BLE001 - mapped to a status code
                    await _abort_for(exc, context, _name)

            setattr(cls, name, streaming)
        else:

            @functools.wraps(method)
            async def unary(self, request, context, _method=method, _name=name):
                try:
                    self._authorise(_name, context)
                    _check(request)
                    return await _method(self, request, context)
                except Exception as exc:  # noqa: BLE001 - mapped to a status code
                    await _abort_for(exc, context, _name)

            setattr(cls, name, unary)
    return cls


@map_errors
class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, cp: ControlPlane, auth: Authenticator, max_streams: int = MAX_AGENT_STREAMS):
        self.cp, self.auth, self.max_streams = cp, auth, max_streams
        self.opening: dict[str, int] = {}  # caller -> its streams not yet past the hello
        self.streams = 0
        self.pacer = Pacer(*AGENT_MESSAGES)  # per node, across its streams

    def _authorise(self, name: str, context) -> None:
        pass  # Connect checks the node certificate against the hello it carries

    async def Connect(self, requests, context):
        if self.streams >= self.max_streams:
            raise ResourceExhausted(f"{self.streams} agent streams are open, the most this server takes")
        self.streams += 1
        try:
            async for message in self._connect(requests, context):
                yield message
        finally:
            self.streams -= 1

    async def _connect(self, requests, context):
        certified = self.auth.agent(context)
        # Without TLS nobody is known (many agents share a host), so only the deadline applies.
        caller = certified or ""
        if certified and self.opening.get(caller, 0) >= MAX_OPENING:
            raise ResourceExhausted(f"node {caller} has {MAX_OPENING} streams waiting to say hello, the most allowed")
        self.opening[caller] = self.opening.get(caller, 0) + 1
        try:
            first = await asyncio.wait_for(anext(aiter(requests), None), HELLO_WITHIN_S)
        except TimeoutError:
            raise InvalidArgument(
                f"no hello within {HELLO_WITHIN_S:g} s: a stream's first message is a hello"
            ) from None
        finally:
            self.opening[caller] -= 1
            if not self.opening[caller]:
                del self.opening[caller]
        _check(first)
        if first is None or not first.HasField("hello"):
            raise InvalidArgument("the first message of a stream must be a hello")
        node = first.hello.node
        if certified is not None and node != certified:
            raise PermissionDenied(f"hello.node = {node[:80]!r}: this agent's certificate is for {certified!r}")
        outbox = await self.cp.hello(first.hello, _peer_host(context.peer()))  # the node's stream from now on
        await context.send_initial_metadata(())  # the hello is taken: the agent knows it is connected
        reader = asyncio.create_task(self._read(node, requests))
        getter = None
        try:
            while True:
                getter = asyncio.create_task(outbox.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    if getter.result() is REPLACED:
                        raise FailedPrecondition(f"a newer stream of node {node} replaced this one")
                    yield getter.result()
                if reader in done:
                    reader.result()  # raises what broke the stream
                    return
        finally:
            for task in (getter, reader):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (getter, reader) if t is not None), return_exceptions=True)
            await self.cp.disconnected(node, outbox)

    async def _read(self, node: str, requests) -> None:
        async for message in requests:
            kind = message.WhichOneof("body") if isinstance(message, Message) else None  # Malformed: _check
            if kind in ("telemetry", "status"):  # log chunks flow only as a reader's window allows
                await self._paced(node)
            self.cp.handling(node, started=True)
            try:
                _check(message)
                if kind == "telemetry":
                    await self.cp.telemetry(node, message.telemetry)
                elif kind == "status":
                    await self.cp.status(node, message.status)
                elif kind == "log_chunk":
                    self.cp.logs.deliver(node, message.log_chunk)
            finally:
                self.cp.handling(node, started=False)

    async def _paced(self, node: str) -> None:
        """Wait until the node's next message may be handled (limits.AGENT_MESSAGES)."""
        while (wait := self.pacer.wait_s(node)) > 0:
            if _log_due(node, "paced"):
                burst, per_s = self.pacer.burst, self.pacer.per_s
                log.warning(
                    "agent %s sends more than %g messages a second (after a burst of %g): its stream is read "
                    "at that rate",
                    node,
                    per_s,
                    burst,
                    extra={"event": "agent_paced", "node": node},
                )
            await asyncio.sleep(wait)


def _peer_host(peer: str) -> str:
    """gRPC's peer string as the address the agent connects from: 'ipv4:10.0.0.5:41234' ->
    '10.0.0.5', 'ipv6:[2001:db8::5]:41234' -> '2001:db8::5'; a Unix socket or anything
    else is this machine."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return unquote(rest.rsplit(":", 1)[0]).strip("[]")
    return "127.0.0.1"


@map_errors
class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, cp: ControlPlane, auth: Authenticator, emulation: bool = False):
        self.cp, self.auth, self.emulation = cp, auth, emulation
        self.read = cp.store.query  # off the event loop
        self.limits = RateLimiter()
        self.watching = 0  # WatchEvents streams open now

    def _authorise(self, name: str, context) -> None:
        caller = self.auth.client(context, ROLE_OF[name])
        # Per token; without TLS (loopback only) every caller is this machine, counted as one.
        self.limits.check(name, caller.name)

    async def SubmitJob(self, request, context):
        return job_message(await self.cp.submit(submitted_spec(request), request.out_dir))

    async def GetJob(self, request, context):
        job = await self.read(lambda s: queries.get_job(s, request.job_id))
        live = self.cp.jobs.get(job.id)
        if live is not None:  # the step in storage lags by one flush
            job.step = max(job.step, live.step)
        return job_message(job, live.progress if live is not None else None)

    async def ListJobs(self, request, context):
        offset, size = page_of(request)
        rows = await self.read(lambda s: queries.jobs(s, offset, size + 1))
        return jobs_pb2.ListJobsResponse(
            jobs=[job_message(j) for j in rows[:size]], next_page_token=next_token(rows, offset, size)
        )

    async def CancelJob(self, request, context):
        return job_message(await self.cp.cancel(request.job_id))

    async def DeleteJob(self, request, context):
        told = await self.cp.delete(request.job_id)
        return jobs_pb2.DeleteJobResponse(job_id=request.job_id, nodes_told=told)

    async def WatchEvents(self, request, context):
        await self.read(lambda s: queries.get_job(s, request.job_id))
        if self.watching >= MAX_WATCHES:
            raise ResourceExhausted(f"{MAX_WATCHES} event watches are open, the most this server serves; try later")
        self.watching += 1
        try:
            async for event in self._watch(request):
                yield event
        finally:
            self.watching -= 1

    async def _watch(self, request):
        last = 0

        def events_after(after: int):
            return self.read(lambda s: queries.events(s, request.job_id, after))

        while True:
            self.cp.new_events.clear()  # before reading, so an event stored meanwhile wakes us
            for e in await events_after(last):
                last = e.id
                yield event_message(e)
            job = await self.read(lambda s: queries.get_job(s, request.job_id))
            if job.state in TERMINAL and not await events_after(last):
                return
            await self.cp.next_events()

    async def StreamLogs(self, request, context):
        job = await self.read(lambda s: queries.get_job(s, request.job_id))
        ranks = json.loads(job.ranks_json)
        running = self.cp.jobs.get(job.id)
        nodes = sorted({d.split("/")[0] for d in ranks} | (running.former_nodes if running else set()))
        # Unknown ids are NOT_FOUND, as the service's comment says: a node the job never ran on, a
        # device that node does not have (one a recovery left out keeps its logs: the traceback of
        # the worker that died is what a user asks for).
        if request.node:
            if request.node not in nodes:
                raise NotFound("node", request.node[:80], f"{job.id} ran on {', '.join(nodes)}")
            nodes = [request.node]
        if request.device:
            node = request.device.split("/")[0]
            known = await self.read(lambda s: {d.id for d in queries.devices_of(s, node)}) if node in nodes else set()
            if node not in nodes or request.device not in known | set(ranks):
                where = ", ".join(sorted(d for d in ranks if d.split("/")[0] in nodes)) or ", ".join(nodes)
                raise NotFound("device", request.device[:80], f"{job.id} ran on {where}")
            nodes = [node]
        if request.tail_bytes > MAX_TAIL_BYTES:
            raise InvalidArgument(f"tail_bytes = {request.tail_bytes}: at most {MAX_TAIL_BYTES}")
        if self.cp.logs.calls >= MAX_OPEN:
            raise ResourceExhausted(f"{MAX_OPEN} log readers are open, the most this server serves; ask again later")
        ask = agent_pb2.ReadLogs(
            job_id=job.id,
            devices=[request.device] if request.device else [],
            tail_bytes=request.tail_bytes,
            follow=request.follow,
        )
        async for lines in stream_logs(self.cp.logs, self.cp.outboxes, nodes, ask):
            yield lines

    async def ListEvents(self, request, context):
        offset, size = page_of(request)
        await self.read(lambda s: queries.get_job(s, request.job_id))
        rows = await self.read(lambda s: queries.events(s, request.job_id, offset=offset, limit=size + 1))
        events = [event_message(e) for e in rows[:size]]
        return jobs_pb2.ListEventsResponse(events=events, next_page_token=next_token(rows, offset, size))

    async def GetPlan(self, request, context):
        return plan_message(await self.read(lambda s: queries.get_plan(s, request.job_id, request.version)))

    async def ListPlans(self, request, context):
        offset, size = page_of(request)
        rows = await self.read(lambda s: queries.plans(s, request.job_id, offset, size + 1))
        return jobs_pb2.ListPlansResponse(
            plans=[plan_message(p) for p in rows[:size]], next_page_token=next_token(rows, offset, size)
        )

    async def Replan(self, request, context):
        version = await self.cp.replan(request.job_id, request.reason)
        return plan_message(await self.read(lambda s: queries.get_plan(s, request.job_id, version)))

    async def SetDetection(self, request, context):
        await self.cp.pause_detection(request.paused)
        return jobs_pb2.SetDetectionResponse(paused=request.paused)

    async def DrainNode(self, request, context):
        await self.cp.drain(request.node, True)
        return await self.read(lambda s: node_message(s, queries.get_node(s, request.node)))

    async def UndrainNode(self, request, context):
        await self.cp.drain(request.node, False)
        return await self.read(lambda s: node_message(s, queries.get_node(s, request.node)))

    async def ListNodes(self, request, context):
        offset, size = page_of(request)
        rows = await self.read(lambda s: [node_message(s, n) for n in queries.nodes(s, offset, size + 1)])
        return jobs_pb2.ListNodesResponse(nodes=rows[:size], next_page_token=next_token(rows, offset, size))

    async def QueryTelemetry(self, request, context):
        if request.limit > MAX_PAGE_SIZE:
            raise InvalidArgument(f"limit = {request.limit}: at most {MAX_PAGE_SIZE} (0 means 100)")
        await self.read(lambda s: queries.get_job(s, request.job_id))
        await self.cp.flush()
        rows = await self.read(lambda s: queries.telemetry(s, request.job_id, request.device, request.limit or 100))
        return jobs_pb2.QueryTelemetryResponse(
            points=[
                jobs_pb2.TelemetryPoint(
                    time=r.time, device=r.device, step=r.step, compute_s_per_block=r.compute_s_per_block, rate=r.rate
                )
                for r in rows
            ]
        )

    async def QueryHistory(self, request, context):
        offset, size = page_of(request)
        await self.read(lambda s: queries.get_job(s, request.job_id))
        await self.cp.flush()
        rows = await self.read(lambda s: queries.history(s, request.job_id, offset, size + 1))
        return jobs_pb2.QueryHistoryResponse(
            points=[
                jobs_pb2.HistoryPoint(
                    step=r.step,
                    time=r.time,
                    loss=r.loss,
                    lr=r.lr,
                    samples_per_s=r.samples_per_s,
                    plan_version=r.plan_version,
                    rates=json.loads(r.rates_json),
                )
                for r in rows[:size]
            ],
            next_page_token=next_token(rows, offset, size),
        )

    async def Straggle(self, request, context):
        if not self.emulation:
            raise PermissionDenied("emulation is off: start the server with --emulation to make devices slow")
        return jobs_pb2.StraggleResponse(node=await self.cp.straggle(request.device, request.rate, request.from_step))
