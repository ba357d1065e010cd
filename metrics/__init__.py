"""Prometheus /metrics for the control plane and the agents, through prometheus_client.

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
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric

log = logging.getLogger("drover.metrics")
SNAPSHOT_TIMEOUT_S = 5.0  # a scrape waits this long for a busy event loop, then gets the histograms only


class MetricsError(RuntimeError):
    """/metrics cannot be served as asked: the message names the option, the value and why."""


class LoopCollector:
    """Metric families made by `families()`, called on `loop` at each scrape."""

    def __init__(self, loop: asyncio.AbstractEventLoop, families: Callable[[], Iterable[Metric]]):
        self.loop, self.families = loop, families

    def collect(self) -> Iterable[Metric]:
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


def serve(address: str, registry: CollectorRegistry, tls: tuple[Path, Path] | None = None):
    """Serve `registry` at http(s)://ADDRESS/metrics from a thread; `tls` is (certificate, key),
    the daemon's own. Returns (the HTTP server, its port); `server.shutdown()` stops it."""
    host, port = split_address(address, "--metrics")
    certfile, keyfile = (str(tls[0]), str(tls[1])) if tls else (None, None)
    try:
        server, _ = start_http_server(port, host, registry, certfile=certfile, keyfile=keyfile)
    except OSError as exc:
        raise MetricsError(f"--metrics = {address!r}: cannot listen there: {exc.strerror or exc}") from None
    return server, server.server_address[1]
