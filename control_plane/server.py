"""Starting and stopping the grpc.aio server: the two ports (clients over TLS with a token,
agents over mutual TLS; `--insecure` on loopback only), the control plane behind them, health,
reflection and the metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from drover.metrics import MetricsError, split_address
from drover.metrics import serve as serve_metrics
from drover.metrics import stop as stop_metrics
from drover.planner import COMPILED_MODULES
from drover.planner.wire import STREAM_OPTIONS, is_loopback
from drover.storage.db import Store, sqlite_url
from drover.v1 import agent_pb2, jobs_pb2

from .api import MAX_AGENT_STREAMS, SERVER_LIMITS, AgentService, JobService, register
from .controller import ControlPlane
from .errors import StartError
from .identity import Authenticator, load_tokens

log = logging.getLogger("drover.server")


def check_loopback(*addresses: str) -> None:
    """Serving without TLS is for this machine only."""
    for where in addresses:
        if not is_loopback(where):
            raise ValueError(f"{where}: insecure serving is for loopback only (127.0.0.1, localhost, [::1])")


@dataclass
class Served:
    server: grpc.aio.Server
    cp: ControlPlane
    port: int  # the job service's (and, insecure, the agents')
    agent_port: int  # the agent stream's
    metrics_port: int = 0  # /metrics's, when served
    metrics_http: object = None
    agent_server: grpc.aio.Server | None = None  # the agent port's, when it is a port of its own


class WrongPort(grpc.GenericRpcHandler):
    """The other port's service, answered FAILED_PRECONDITION with where its callers go: an agent
    given the clients' port read 'UNIMPLEMENTED: Method not found!', and retried for ever."""

    def __init__(self, service: str, who: str, option: str):
        self.prefix, self.message = (
            f"/{service}/",
            f"this is not the port for {who}: they use the server's {option} port",
        )

    def service(self, handler_call_details):
        if not handler_call_details.method.startswith(self.prefix):
            return None

        async def refuse(request_iterator, context):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.message)

        return grpc.stream_stream_rpc_method_handler(refuse)


def _credentials(tls_dir: Path, agents: bool) -> grpc.ServerCredentials:
    """TLS with the server's certificate; for the agent port, also each agent's, checked against the CA."""
    pair = [((tls_dir / "server.key").read_bytes(), (tls_dir / "server.pem").read_bytes())]
    if not agents:
        return grpc.ssl_server_credentials(pair)
    ca = (tls_dir / "ca.pem").read_bytes()
    return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=True)


async def start_server(
    db: str,
    address: str,
    agent_address: str | None = None,
    tls_dir: str | Path | None = None,
    emulation: bool = False,
    new_db: bool = False,
    max_agent_streams: int = MAX_AGENT_STREAMS,
    metrics_address: str | None = None,
    **options,
) -> Served:
    """A started server with its control plane; `db` is a SQLAlchemy URL or a SQLite file path.
    With `tls_dir` (see `drover certs init`) clients need TLS and a token at `address`, agents
    mutual TLS at `agent_address`; without it both are served insecure on loopback only.
    `emulation` allows Straggle; `new_db` starts empty where a used database went missing;
    `max_agent_streams` caps the agents served at once; `metrics_address` (HOST:PORT) serves
    Prometheus metrics at /metrics, over TLS with the server's certificate when there is one;
    `options` go to ControlPlane."""
    if metrics_address:
        split_address(metrics_address, "--metrics")
    if tls_dir is None:
        check_loopback(address, agent_address or address, *([metrics_address] if metrics_address else []))
    elif agent_address is None:
        raise ValueError("with TLS, agents need a port of their own (agent_address)")
    auth = Authenticator(load_tokens(Path(tls_dir) / "tokens.json") if tls_dir is not None else None)
    store = Store(db if "://" in db else sqlite_url(db), create=new_db)
    cp = ControlPlane(store, **options)
    try:
        await cp.recover()
        # With a port of their own, agents reach only the agent stream there and clients only the
        # job service, health and reflection on theirs; insecure on one port, all of them.
        server = grpc.aio.server(options=STREAM_OPTIONS + SERVER_LIMITS)
        agent_server = grpc.aio.server(options=STREAM_OPTIONS + SERVER_LIMITS) if agent_address else server
        agent_service = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
        job_service = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]
        register(agent_server, AgentService(cp, auth, max_agent_streams), agent_service)
        register(server, JobService(cp, auth, emulation), job_service)
        if agent_server is not server:  # the other port's callers are told where to go
            server.add_generic_rpc_handlers([WrongPort(agent_service.full_name, "agents", "--agent-listen")])
            agent_server.add_generic_rpc_handlers([WrongPort(job_service.full_name, "clients", "--listen")])
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        served_names = [job_service.full_name] + ([] if agent_address else [agent_service.full_name])
        reflection.enable_server_reflection(served_names + [health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        try:
            if tls_dir is None:
                port = server.add_insecure_port(address)
                agent_port = agent_server.add_insecure_port(agent_address) if agent_address else port
            else:
                port = server.add_secure_port(address, _credentials(Path(tls_dir), agents=False))
                agent_port = agent_server.add_secure_port(agent_address, _credentials(Path(tls_dir), agents=True))
        except RuntimeError as exc:
            raise StartError(f"cannot listen on {address} or {agent_address}: {exc} (another server?)") from None
        await server.start()
        if agent_server is not server:
            await agent_server.start()
        cp.metrics.attach(cp, asyncio.get_running_loop())
        metrics_http, metrics_port = None, 0
        if metrics_address:
            tls = (Path(tls_dir) / "server.pem", Path(tls_dir) / "server.key") if tls_dir is not None else None
            try:
                metrics_http, metrics_port = serve_metrics(metrics_address, cp.metrics.registry, tls)
            except MetricsError:
                await asyncio.gather(server.stop(grace=None), agent_server.stop(grace=None))
                raise
    except BaseException:
        await cp.close()  # the database and its lock are let go
        raise
    for name in served_names + [""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    cp.flusher = asyncio.create_task(cp.flush_forever())
    security = "TLS" if tls_dir is not None else "INSECURE"
    where = store.engine.url.render_as_string(hide_password=True)  # logs are shipped and read by many
    log.info("control plane: clients on port %d, agents on port %d, %s; database %s", port, agent_port, security, where)
    # An image or install without the planner's build plans in about 1.4 times the time: say which.
    planner = "compiled" if COMPILED_MODULES else "pure Python (drover compile-planner compiles it)"
    log.info("planner: %s", planner)
    if metrics_http is not None:
        log.info("metrics at %s://%s/metrics", "https" if tls_dir else "http", metrics_address)
    return Served(server, cp, port, agent_port, metrics_port, metrics_http, agent_server)


async def stop_server(served: Served) -> None:
    try:
        if served.metrics_http is not None:
            await asyncio.to_thread(stop_metrics, served.metrics_http)
        servers = [served.server] + [s for s in [served.agent_server] if s not in (None, served.server)]
        await asyncio.gather(*(s.stop(grace=1) for s in servers))
    finally:
        # Always: on SIGTERM gRPC's stop raised CancelledError, so the buffered telemetry was
        # never written nor the database closed (and a node's give-up task died pending).
        await served.cp.close()


async def serve(db: str, address: str, **options) -> None:
    """Run until cancelled; `options` as start_server's."""
    served = await start_server(db, address, **options)
    try:
        await served.server.wait_for_termination()
    finally:
        await stop_server(served)
