"""The Python client of a Drover control plane: `Client` (blocking) and `AsyncClient` (asyncio).

    from drover.client import Client, Target

    with Client(Target.from_files("cp.example.org:50051", "ca.pem", "operator.token")) as drover:
        job = drover.submit_file("examples/jobs/tiny.yaml", out_dir="runs/one")
        for event in drover.watch(job.id):
            if event.type == EventKind.EVENT_KIND_STRAGGLER_DETECTED:
                print(event.step, event.payload.device, event.payload.rate)
        assert drover.wait(job.id) == "completed"

A job is a drover.v1.JobSpec: built field by field, or from a job file's mapping or text with
`job_spec` (`submit_file` reads the file and its model file where you run it). Results are the
typed drover.v1 messages (Job, Node, PlanRecord, HistoryPoint, LogLines), and events are
`Event`s: the kind as an EventKind, its typed payload, and the details as a dict. A failed
call raises a `DroverError` of the status code's subclass (NotFound, InvalidArgument,
PermissionDenied, ...), its `details()` the server's message, which names the field, the value
and what is allowed; a job refused before it is sent (a field JobSpec lacks, a job file that
cannot be read) raises InvalidArgument too. TLS and the bearer token come from a `Target`, as for the CLI (which uses
this client).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from google.protobuf.message import Message

from drover.planner.wire import is_loopback, job_state_name, message_from_fields
from drover.v1 import jobs_pb2, jobs_pb2_grpc
from drover.v1.events_pb2 import EventKind
from drover.v1.jobspec_pb2 import JobSpec

__all__ = ["AsyncClient", "Client", "DroverError", "Event", "EventKind", "JobSpec", "Target", "job_spec"]

ENDED = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Target:
    """A control plane and how to reach it: TLS checked against `ca` with a bearer `token`,
    or (`ca` None) plain on loopback, for a server started with --insecure."""

    address: str
    ca: bytes | None = None
    token: str | None = None

    @classmethod
    def from_files(cls, address: str, ca_file: str | Path, token_file: str | Path) -> Target:
        return cls(address, Path(ca_file).read_bytes(), Path(token_file).read_text().strip())

    def credentials(self) -> grpc.ChannelCredentials | None:
        """None: a plain channel, for loopback only."""
        if self.ca is None:
            if not is_loopback(self.address):
                raise ValueError(f"{self.address}: without TLS only a loopback control plane may be reached")
            return None
        return grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=self.ca), grpc.access_token_call_credentials(self.token)
        )


def job_spec(job: str | dict) -> JobSpec:
    """A JobSpec from a job file's text (YAML, the model inline) or mapping, as it stands: the
    control plane checks it and names the field of anything wrong (InvalidArgument)."""
    data = yaml.safe_load(job) if isinstance(job, str) else job
    if not isinstance(data, dict):
        raise ValueError(f"a job file's mapping (steps, model, ...), not {type(data).__name__}")
    return message_from_fields(data, JobSpec())


@contextmanager
def refused_here() -> Iterator[None]:
    """A job this side cannot even send (a field JobSpec lacks, a model path where the model
    goes, a job file that cannot be read) is refused as the server refuses one: InvalidArgument,
    so a caller handles one kind of error."""
    try:
        yield
    except (ValueError, yaml.YAMLError) as exc:  # SpecError and FieldError are ValueErrors
        refused = InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        refused.sent = False  # found here: no control plane saw it
        raise refused from None


def _submit_request(spec: JobSpec | dict | str, out_dir: str) -> jobs_pb2.SubmitJobRequest:
    with refused_here():
        return jobs_pb2.SubmitJobRequest(spec=spec if isinstance(spec, JobSpec) else job_spec(spec), out_dir=out_dir)


@dataclass(frozen=True)
class Event:
    time: float
    step: int
    job_id: str
    kind: str  # the type's name in lower case: "straggler_detected"
    details: dict = field(default_factory=dict)
    type: int = EventKind.EVENT_KIND_UNSPECIFIED  # an EventKind; a newer server's kinds: their number
    payload: Message | None = None  # the typed details (StragglerDetected, ...); None for unknown kinds

    @classmethod
    def of(cls, message: jobs_pb2.Event) -> Event:
        which = message.WhichOneof("payload")
        return cls(
            message.time,
            message.step,
            message.job_id,
            message.kind,
            json.loads(message.details_json or "{}"),
            message.type,
            getattr(message, which) if which else None,
        )


class DroverError(grpc.RpcError):
    """A call the control plane refused or could not serve: `code()` (grpc.StatusCode) and
    `details()`, the server's message, as grpc's own errors have them (and an `except
    grpc.RpcError` catches it too)."""

    sent = True  # False: refused by this client before any call (a job file it cannot read or send)

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class InvalidArgument(DroverError): ...


class NotFound(DroverError): ...


class FailedPrecondition(DroverError): ...


class PermissionDenied(DroverError): ...


class Unauthenticated(DroverError): ...


class ResourceExhausted(DroverError): ...


class Unavailable(DroverError): ...


ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def error_of(exc: grpc.RpcError, plain: bool = False) -> DroverError:
    """The status code's DroverError, once, for every call of both clients. A TLS handshake
    that failed, or a `plain` (no TLS) connection closed at once, is Unauthenticated: gRPC
    reports both as UNAVAILABLE, like a server that is down, but no retry will help until the
    certificates are right."""
    code, details = exc.code(), exc.details() or ""
    # A certificate that names another host fails verification after the handshake: the same.
    tls = ("handshake failed", "hostname verification", "no match found for server name")
    if code == grpc.StatusCode.UNAVAILABLE and any(words in details.lower() for words in tls):
        return Unauthenticated(
            grpc.StatusCode.UNAUTHENTICATED,
            "the TLS handshake failed: check that the server serves TLS, that its certificate is signed by "
            f"the CA given (--ca) and names the address dialled ({details[:300]})",
        )
    # Closed while connecting, not mid-call: a server that dies during a stream reads
    # "Stream removed (Socket closed)", which is no credentials mistake.
    refused = "failed to connect to all addresses" in details and "socket closed" in details.lower()
    if plain and code == grpc.StatusCode.UNAVAILABLE and refused:
        return Unauthenticated(
            grpc.StatusCode.UNAUTHENTICATED,
            "the control plane closed a connection without TLS: a server started without --insecure serves "
            f"TLS, so give --ca and --token-file ($DROVER_CA, $DROVER_TOKEN_FILE) instead ({details[:300]})",
        )
    return ERRORS.get(code, DroverError)(code, details)


def _target(target: Target | str) -> Target:
    return Target(target) if isinstance(target, str) else target


class Client:
    """Blocking calls to a control plane's JobService (see the module's docstring)."""

    def __init__(self, target: Target | str):
        self.target = _target(target)
        credentials = self.target.credentials()
        address = self.target.address
        self.channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)  # every RPC, for what has no method here

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request):
        try:
            return getattr(self.stub, method)(request)
        except grpc.RpcError as exc:
            raise error_of(exc, plain=self.target.ca is None) from None

    def _stream(self, method: str, request) -> Iterator:
        try:
            yield from getattr(self.stub, method)(request)
        except grpc.RpcError as exc:
            raise error_of(exc, plain=self.target.ca is None) from None

    def _pages(self, method: str, request, items: str) -> list:
        out = []
        while True:
            page = self._call(method, request)
            out += getattr(page, items)
            if not page.next_page_token:
                return out
            request.page_token = page.next_page_token

    # -- jobs ------------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict | str, out_dir: str = "") -> jobs_pb2.Job:
        """A job: a JobSpec, or a job file's mapping or text with the model inline (see `job_spec`
        and `submit_file`); it runs in `out_dir` under each agent's data root."""
        return self._call("SubmitJob", _submit_request(spec, out_dir))

    def submit_file(self, path: str | Path, out_dir: str = "", resume: str | None = None, reader=None) -> jobs_pb2.Job:
        """A job file (docs/jobs.md), read here with its model file inlined; `reader` completes a
        custom model (drover.cli.models.ModelReader counts its parameters)."""
        from drover.control_plane.jobfile import read_job_file

        with refused_here():
            fields = read_job_file(path, resume, reader) if reader else read_job_file(path, resume)
        return self.submit(fields, out_dir)

    def get(self, job_id: str) -> jobs_pb2.Job:
        return self._call("GetJob", jobs_pb2.GetJobRequest(job_id=job_id))

    def list(self) -> list[jobs_pb2.Job]:
        return self._pages("ListJobs", jobs_pb2.ListJobsRequest(page_size=1000), "jobs")

    def cancel(self, job_id: str) -> jobs_pb2.Job:
        return self._call("CancelJob", jobs_pb2.CancelJobRequest(job_id=job_id))

    def delete(self, job_id: str) -> jobs_pb2.DeleteJobResponse:
        """Forget an ended job (admin): its stored record, and the agents' work-dir folders of it."""
        return self._call("DeleteJob", jobs_pb2.DeleteJobRequest(job_id=job_id))

    def events(self, job_id: str) -> list[Event]:
        """The job's events so far."""
        return [Event.of(e) for e in self._pages("ListEvents", jobs_pb2.ListEventsRequest(job_id=job_id), "events")]

    def watch(self, job_id: str) -> Iterator[Event]:
        """The job's events, past ones first, then as they happen, until it ends."""
        for event in self._stream("WatchEvents", jobs_pb2.WatchEventsRequest(job_id=job_id)):
            yield Event.of(event)

    def wait(self, job_id: str, timeout_s: float | None = None, every_s: float = 0.5) -> str:
        """The job's final state: completed, failed or cancelled. TimeoutError past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (state := job_state_name(self.get(job_id).state)) not in ENDED:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {state} after {timeout_s} s")
            time.sleep(every_s)
        return state

    def logs(self, job_id: str, node: str = "", device: str = "", tail_bytes: int = 0, follow: bool = False):
        """The workers' output as LogLines (see `drover job logs`)."""
        request = jobs_pb2.StreamLogsRequest(
            job_id=job_id, node=node, device=device, tail_bytes=tail_bytes, follow=follow
        )
        yield from self._stream("StreamLogs", request)

    # -- plans, telemetry, history ---------------------------------------------------

    def plan(self, job_id: str, version: int = 0) -> jobs_pb2.PlanRecord:
        """One plan version (0: the newest)."""
        return self._call("GetPlan", jobs_pb2.GetPlanRequest(job_id=job_id, version=version))

    def plans(self, job_id: str) -> list[jobs_pb2.PlanRecord]:
        return self._pages("ListPlans", jobs_pb2.ListPlansRequest(job_id=job_id, page_size=1000), "plans")

    def replan(self, job_id: str, reason: str = "") -> jobs_pb2.PlanRecord:
        return self._call("Replan", jobs_pb2.ReplanRequest(job_id=job_id, reason=reason))

    def telemetry(self, job_id: str, device: str = "", limit: int = 100) -> list[jobs_pb2.TelemetryPoint]:
        request = jobs_pb2.QueryTelemetryRequest(job_id=job_id, device=device, limit=limit)
        return list(self._call("QueryTelemetry", request).points)

    def history(self, job_id: str) -> list[jobs_pb2.HistoryPoint]:
        return self._pages("QueryHistory", jobs_pb2.QueryHistoryRequest(job_id=job_id, page_size=1000), "points")

    # -- nodes -------------------------------------------------------------------------

    def nodes(self) -> list[jobs_pb2.Node]:
        return self._pages("ListNodes", jobs_pb2.ListNodesRequest(page_size=1000), "nodes")

    def drain(self, node: str) -> jobs_pb2.Node:
        return self._call("DrainNode", jobs_pb2.NodeRequest(node=node))

    def undrain(self, node: str) -> jobs_pb2.Node:
        return self._call("UndrainNode", jobs_pb2.NodeRequest(node=node))

    def set_detection(self, paused: bool) -> bool:
        return self._call("SetDetection", jobs_pb2.SetDetectionRequest(paused=paused)).paused

    def straggle(self, device: str, rate: float, from_step: int = 0) -> str:
        """Emulation (admins, a server started with --emulation): the node it was sent to."""
        return self._call("Straggle", jobs_pb2.StraggleRequest(device=device, rate=rate, from_step=from_step)).node


class AsyncClient:
    """The same calls for asyncio code: `await client.get(job_id)`, `async for e in client.watch(...)`."""

    def __init__(self, target: Target | str):
        self.target = _target(target)
        credentials = self.target.credentials()
        address = self.target.address
        self.channel = (
            grpc.aio.secure_channel(address, credentials) if credentials else grpc.aio.insecure_channel(address)
        )
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: str, request):
        try:
            return await getattr(self.stub, method)(request)
        except grpc.RpcError as exc:
            raise error_of(exc, plain=self.target.ca is None) from None

    async def _pages(self, method: str, request, items: str) -> list:
        out = []
        while True:
            page = await self._call(method, request)
            out += getattr(page, items)
            if not page.next_page_token:
                return out
            request.page_token = page.next_page_token

    async def submit(self, spec: JobSpec | dict | str, out_dir: str = "") -> jobs_pb2.Job:
        return await self._call("SubmitJob", _submit_request(spec, out_dir))

    async def get(self, job_id: str) -> jobs_pb2.Job:
        return await self._call("GetJob", jobs_pb2.GetJobRequest(job_id=job_id))

    async def list(self) -> list[jobs_pb2.Job]:
        return await self._pages("ListJobs", jobs_pb2.ListJobsRequest(page_size=1000), "jobs")

    async def cancel(self, job_id: str) -> jobs_pb2.Job:
        return await self._call("CancelJob", jobs_pb2.CancelJobRequest(job_id=job_id))

    async def delete(self, job_id: str) -> jobs_pb2.DeleteJobResponse:
        return await self._call("DeleteJob", jobs_pb2.DeleteJobRequest(job_id=job_id))

    async def events(self, job_id: str) -> list[Event]:
        pages = await self._pages("ListEvents", jobs_pb2.ListEventsRequest(job_id=job_id), "events")
        return [Event.of(e) for e in pages]

    async def watch(self, job_id: str) -> AsyncIterator[Event]:
        try:
            async for event in self.stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id)):
                yield Event.of(event)
        except grpc.RpcError as exc:
            raise error_of(exc, plain=self.target.ca is None) from None

    async def wait(self, job_id: str, every_s: float = 0.5) -> str:
        """The job's final state (wrap in asyncio.timeout to bound it)."""
        import asyncio

        while (state := job_state_name((await self.get(job_id)).state)) not in ENDED:
            await asyncio.sleep(every_s)
        return state

    async def nodes(self) -> list[jobs_pb2.Node]:
        return await self._pages("ListNodes", jobs_pb2.ListNodesRequest(page_size=1000), "nodes")

    async def drain(self, node: str) -> jobs_pb2.Node:
        return await self._call("DrainNode", jobs_pb2.NodeRequest(node=node))

    async def undrain(self, node: str) -> jobs_pb2.Node:
        return await self._call("UndrainNode", jobs_pb2.NodeRequest(node=node))

    async def plans(self, job_id: str) -> list[jobs_pb2.PlanRecord]:
        return await self._pages("ListPlans", jobs_pb2.ListPlansRequest(job_id=job_id, page_size=1000), "plans")

    async def telemetry(self, job_id: str, device: str = "", limit: int = 100) -> list[jobs_pb2.TelemetryPoint]:
        request = jobs_pb2.QueryTelemetryRequest(job_id=job_id, device=device, limit=limit)
        return list((await self._call("QueryTelemetry", request)).points)

    async def history(self, job_id: str) -> list[jobs_pb2.HistoryPoint]:
        request = jobs_pb2.QueryHistoryRequest(job_id=job_id, page_size=1000)
        return await self._pages("QueryHistory", request, "points")
