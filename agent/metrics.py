"""An agent's Prometheus metrics (`drover agent --metrics HOST:PORT`).

What the node sees first-hand, labelled by node: whether its stream to the
control plane is up and how many times it connected; per job, its workers
alive and its step; per device (labels job_id, device), the newest step's
compute seconds per block, pipeline waits and gradient sync; per NIC (label
nic), the bytes per second sent and received and the newest link probe from
it to each peer (label peer).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from drover.metrics import LoopCollector


def registry_of(agent, loop) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoopCollector(loop, lambda: families(agent)))
    return registry


def families(agent) -> list:
    """The state of `agent` (an Agent) as metric families; runs on its event loop."""
    node = agent.node
    connected = GaugeMetricFamily(
        "drover_agent_connected", "1 while the stream to the control plane is up.", labels=["node"]
    )
    connected.add_metric([node], float(agent.connected))
    sessions = CounterMetricFamily(
        "drover_agent_connections", "Streams to the control plane opened since the agent started.", labels=["node"]
    )
    sessions.add_metric([node], agent.connections)
    workers = GaugeMetricFamily("drover_agent_workers", "Worker processes alive, per job.", labels=["node", "job_id"])
    step = GaugeMetricFamily(
        "drover_agent_job_step", "Newest step the job's workers here ran.", labels=["node", "job_id"]
    )
    device = ["node", "job_id", "device"]
    compute = GaugeMetricFamily(
        "drover_agent_device_compute_seconds_per_block",
        "Own compute seconds per block per micro-batch, newest step.",
        labels=device,
    )
    p2p = GaugeMetricFamily(
        "drover_agent_device_p2p_wait_seconds", "Seconds waited on pipeline neighbours.", labels=device
    )
    sync = GaugeMetricFamily("drover_agent_device_grad_sync_seconds", "Seconds of gradient sync.", labels=device)
    for job_id, job in agent.jobs.items():
        workers.add_metric([node, job_id], job.alive())
        if job.step >= 0:
            step.add_metric([node, job_id], job.step)
        for name, row in sorted(job.latest.items()):
            labels = [node, job_id, name]
            compute.add_metric(labels, row["compute_s_per_block"] or 0.0)  # None: idle in the plan
            p2p.add_metric(labels, row["p2p_wait_s"])
            sync.add_metric(labels, row["grad_sync_s"])
    tx = GaugeMetricFamily("drover_nic_transmit_bytes_per_second", "Bytes sent per second.", labels=["node", "nic"])
    rx = GaugeMetricFamily("drover_nic_receive_bytes_per_second", "Bytes received per second.", labels=["node", "nic"])
    for sample in agent.nic_rates:
        tx.add_metric([node, sample.nic], sample.tx_bytes_per_s)
        rx.add_metric([node, sample.nic], sample.rx_bytes_per_s)
    probed = GaugeMetricFamily(
        "drover_link_probe_bits_per_second",
        "Newest link probe from this NIC to a peer.",
        labels=["node", "nic", "peer"],
    )
    for (nic, peer), gbps in sorted(agent.probed.items()):
        probed.add_metric([node, nic, peer], gbps * 1e9)
    return [connected, sessions, workers, step, compute, p2p, sync, tx, rx, probed]
