"""The control plane's Prometheus metrics (`drover server --metrics HOST:PORT`).

Per device of a running job (labels job_id, node, device): its straggling rate
(1 = healthy; what the detector judged, or for a device the plan leaves idle
the rate the plan assumed), and from its newest telemetry its
compute seconds per block per micro-batch and the seconds it waited on
pipeline neighbours and on gradient sync. Per job (label job_id): step, step
time, samples/s, loss, learning rate, the plan versions pushed and
committed, rollouts pending, and the migrations and bytes they moved since
this server started. Per server: agents connected, jobs waiting for devices,
samples waiting to be written, telemetry lag and the store's flush time.
Names and units follow Prometheus's conventions (seconds, bytes, _total).
"""

from __future__ import annotations

import asyncio
import math

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from drover.metrics import LoopCollector

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PlaneMetrics:
    """The registry served at /metrics: the timings observed as they happen, the rest read
    from the control plane at each scrape (attach)."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self.telemetry_lag = Histogram(
            "drover_telemetry_lag_seconds",
            "From an agent's telemetry message being sent (its clock) to the control plane taking it in.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.flush_time = Histogram(
            "drover_store_flush_seconds",
            "Time to write the buffered telemetry to the database.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )

    def attach(self, cp, loop: asyncio.AbstractEventLoop) -> None:
        self.registry.register(LoopCollector(loop, lambda: families(cp)))


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def families(cp) -> list:
    """The state of `cp` (a ControlPlane) as metric families; runs on its event loop."""
    device = ["job_id", "node", "device"]
    rate = _gauge(
        "drover_device_straggling_rate", "Compute time against the job's healthy devices (1 = healthy).", device
    )
    compute = _gauge(
        "drover_device_compute_seconds_per_block",
        "Own compute seconds per block per micro-batch in the newest step reported.",
        device,
    )
    p2p = _gauge("drover_device_p2p_wait_seconds", "Seconds waited on pipeline neighbours in the newest step.", device)
    sync = _gauge("drover_device_grad_sync_seconds", "Seconds of gradient sync in the newest step.", device)
    job = ["job_id"]
    step = _gauge("drover_job_step", "Newest step reported (0-based).", job)
    step_time = _gauge("drover_job_step_seconds", "Duration of the newest step.", job)
    samples = _gauge("drover_job_samples_per_second", "Training throughput in the newest step.", job)
    loss = _gauge("drover_job_loss", "Training loss of the newest step.", job)
    lr = _gauge("drover_job_learning_rate", "Learning rate of the newest step.", job)
    version = _gauge("drover_job_plan_version", "Newest plan version pushed to the job's agents.", job)
    committed = _gauge("drover_job_committed_plan_version", "Newest plan version every agent runs.", job)
    pending = _gauge("drover_job_pending_rollouts", "Plan versions pushed and not yet committed.", job)
    migrations = CounterMetricFamily(
        "drover_job_migrations", "Plan switches finished (since this server started).", labels=job
    )
    moved = CounterMetricFamily(
        "drover_job_migration_bytes", "Bytes moved by plan switches (since this server started).", labels=job
    )
    for running in cp.jobs.values():
        rates = running.device_rates()
        for name, (c, w, s) in sorted(running.samples.items()):
            if name not in rates:
                continue  # left the job in a recovery
            labels = [running.id, name.split("/")[0], name]
            rate.add_metric(labels, rates[name])
            compute.add_metric(labels, c)
            p2p.add_metric(labels, w)
            sync.add_metric(labels, s)
        labels = [running.id]
        version.add_metric(labels, running.version)
        committed.add_metric(labels, running.committed)
        pending.add_metric(labels, running.version - running.committed)
        migrations.add_metric(labels, running.migrations)
        moved.add_metric(labels, running.migration_bytes)
        if running.step >= 0:
            step.add_metric(labels, running.step)
        progress = running.progress or {}
        if progress:
            loss.add_metric(labels, progress["loss"])  # NaN for a diverged run: Prometheus carries it
            lr.add_metric(labels, progress["lr"])
            samples.add_metric(labels, progress["samples_per_s"])
            if progress["samples_per_s"] > 0:
                step_time.add_metric(labels, running.spec.model.global_batch / progress["samples_per_s"])
    agents = GaugeMetricFamily("drover_agents_connected", "Agents with a stream open.", value=len(cp.outboxes))
    waiting = GaugeMetricFamily("drover_jobs_pending", "Jobs waiting for devices.", value=len(cp.pending))
    running = GaugeMetricFamily("drover_jobs_running", "Jobs running.", value=len(cp.jobs))
    buffered = GaugeMetricFamily(
        "drover_store_pending_samples", "Telemetry samples waiting to be written.", value=cp.store.pending
    )
    dropped = CounterMetricFamily(
        "drover_store_dropped_samples",
        "Telemetry samples dropped because too many were waiting to be written.",
        value=cp.store.dropped_samples,
    )
    paused = GaugeMetricFamily(
        "drover_detection_paused",
        "1 while replanning on detected stragglers is paused (drover detect pause; stored, it outlives a restart).",
        value=1.0 if cp.detection_paused else 0.0,
    )
    out = [rate, compute, p2p, sync, step, step_time, samples, loss, lr, version, committed, pending]
    return [*out, migrations, moved, agents, waiting, running, buffered, dropped, paused]


def lag_of(sent_at: float, now: float) -> float:
    """An agent's clock may run ahead of ours: never a negative lag."""
    return max(0.0, now - sent_at) if math.isfinite(sent_at) else 0.0
