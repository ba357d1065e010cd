"""Prometheus /metrics for the control plane and the agents, through prometheus_client
(its registry and exposition format; the HTTP(S) server is ours, see _Server).

Each daemon describes its state as metric families at scrape time (a Collector),
built on the daemon's event loop: the HTTP server's thread never reads state
the loop is changing, and the code that does the work counts nothing twice.
Histograms of timings (prometheus_client's own, thread-safe) sit in the same
registry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric

log = logging.getLogger("drover.metrics")
SNAPSHOT_TIMEOUT_S = 5.0  # a scrape waits this long for a busy event loop, then gets the histograms only
SOCKET_TIMEOUT_S = 10.0  # a scraper's handshake and request take at most this
MAX_CONNECTIONS = 16  # scrapes served at once
MAX_PER_CLIENT = 4  # of them from one address: one client that stalls cannot hold them all


class MetricsError(RuntimeError):
    """/metrics cannot be served as asked: the message names the option, the value and why."""


class LoopCollector:
    """Metric families made by `families()`, called on `loop` at each scrape."""

    def __init__(self, loop: asyncio.AbstractEventLoop, families: Callable[[], Iterable[Metric]]):
        self.loop, self.families = loop, families
        self.one_at_a_time = threading.Lock()  # scrapes at once put one snapshot on the loop, not many

    def collect(self) -> Iterable[Metric]:
        with self.one_at_a_time:
            return self._collect()

    def _collect(self) -> Iterable[Metric]:
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                done.set_result(list(self.families()))
            except Exception as exc:  # the scrape says so; the loop goes on
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        try:
            return done.result(SNAPSHOT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            log.warning("metrics: the event loop did not answer within %.0f s", SNAPSHOT_TIMEOUT_S)
            return []


def split_address(address: str, option: str) -> tuple[str, int]:
    """HOST:PORT (or [V6]:PORT) as (host, port), or a MetricsError naming the option."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise MetricsError(f"{option} = {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return host.strip("[]"), int(port)


class _Quiet(WSGIRequestHandler):
    timeout = SOCKET_TIMEOUT_S  # a client that stops sending is let go

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """Each connection in a thread of its own, the TLS handshake included: one client that
    connects and never speaks holds up only its own thread (prometheus_client's server does the
    handshake while accepting, where it blocks every scrape)."""

    daemon_threads = True
    block_on_close = False  # stopping does not wait for a slow client's thread
    context: ssl.SSLContext | None = None
    per_client: dict[str, int]  # address -> its connections open now (each server's own: serve)
    counting: threading.Lock

    def process_request(self, request, client_address) -> None:
        with self.counting:
            host = client_address[0]
            # A flood of connections, or too many from one client: the rest are closed.
            if self.per_client.get(host, 0) >= MAX_PER_CLIENT or sum(self.per_client.values()) >= MAX_CONNECTIONS:
                self.shutdown_request(request)
                return
            self.per_client[host] = self.per_client.get(host, 0) + 1
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.counting:
                host = client_address[0]
                self.per_client[host] -= 1
                if not self.per_client[host]:
                    del self.per_client[host]

    def finish_request(self, request, client_address) -> None:
        if self.context is not None:
            request.settimeout(SOCKET_TIMEOUT_S)
            try:
                request = self.context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                request.close()
                return
        super().finish_request(request, client_address)


def serve(address: str, registry: CollectorRegistry, tls: tuple[Path, Path] | None = None):
    """Serve `registry` at http(s)://ADDRESS/metrics from a thread; `tls` is (certificate, key),
    the daemon's own. Returns (the HTTP server, its port); `stop(server)` ends it."""
    host, port = split_address(address, "--metrics")

    class Server(_Server):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        per_client: dict[str, int] = {}
        counting = threading.Lock()

    if tls:
        Server.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        Server.context.load_cert_chain(str(tls[0]), str(tls[1]))
    try:
        server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_Quiet)
    except OSError as exc:
        raise MetricsError(f"--metrics = {address!r}: cannot listen there: {exc.strerror or exc}") from None
    threading.Thread(target=server.serve_forever, name="drover-metrics", daemon=True).start()
    return server, server.server_address[1]


def stop(server) -> None:
    """Stop serving and let go of the port (call from a thread: it waits for the loop)."""
    server.shutdown()
    server.server_close()
