"""What the coordinator's proposals are made of: the planner's view of the
agents' nodes, and a plan for measured rates weighed against the running one
by the reference cost model. Pure; the controller runs `propose` in its
planning thread."""

from __future__ import annotations

import math

from drover.planner import Cluster, Gpu, ModelSpec, Nic, Node, Plan, evaluate, make_plan, migration_seconds

from .coordinator import Proposal


def propose(
    cluster: Cluster, model: ModelSpec, current: Plan, rates: dict[str, float], restart_s: float, budget_s: float
) -> Proposal:
    """Drover's plan for the job's cluster at these straggling rates, weighed against the
    running plan by the reference cost model (pure; runs in the planning thread)."""
    # Rates of devices the cluster has: a lost node's stay in the detector's windows, and failed
    # every reconcile of the job (twice a second) as rates of devices the cluster does not have.
    measured = {d: r for d, r in rates.items() if r > 1.0 and d in cluster.device_by_id}
    cluster = cluster.with_rates(measured | cluster.rates)  # a device not given stays failed
    plan = make_plan(cluster, model, "drover", budget_s)
    return Proposal(
        rates,
        plan,
        evaluate(current, cluster, model).step_time_s,
        evaluate(plan, cluster, model).step_time_s,
        migration_seconds(current, plan, cluster, model, restart_s),
    )


def _gbps(nic) -> float:
    """What a NIC does: measured by link probes where it has been, else its nominal speed."""
    return getattr(nic, "measured_gbps", 0.0) or nic.gbps


def nic_gbps(nodes: list[tuple[str, list, list]]) -> dict[str, float]:
    """What a plan made by cluster_of(nodes) assumes of each NIC ("node:nic" -> Gbps)."""
    return {f"{name}:{nic.name}": _gbps(nic) for name, _, nics in nodes for nic in nics}


def cluster_of(nodes: list[tuple[str, list, list]]) -> Cluster:
    """The planner's view of agents' nodes: devices as GPUs, NICs as links (measured ones at
    the bandwidth measured). A node's GPUs keep their ids: the planner names a node's devices
    NODE/0 .. NODE/(n-1), so a device not given (lost, left out, another job's) is a GPU that
    has failed. (Counted as n GPUs, a node that had lost NODE/0 had its NODE/1 planned as
    NODE/0: the recovery handed the dead device a rank and left the healthy one out.)"""
    out, missing = [], {}
    for name, devices, nics in nodes:
        if not devices:
            continue  # nothing of it is given: no GPU to plan
        first = devices[0]
        given = {int(d.id.rpartition("/")[2]) for d in devices}  # NODE/INDEX, as every hello's
        count = max(given) + 1
        missing |= {f"{name}/{j}": math.inf for j in range(count) if j not in given}
        rdma = tuple(Nic(n.type, _gbps(n) or 100.0) for n in nics if n.type in ("infiniband", "roce"))
        ethernet = max([_gbps(n) for n in nics if n.type == "ethernet"] or [10.0]) or 10.0
        # CPU workers talk through gloo over loopback, which is latency-bound: the cost model has
        # no latency term, so CPU links get a low bandwidth (0.3 Gbps in a node, 1 Gbps between
        # nodes), chosen so the planner, like a measurement here, finds TP not worth it on CPU.
        # An emulated node (paced devices) says what its cluster file gives.
        intra = first.intra_gbps or (0.3 if first.kind == "cpu" else 2400.0)
        if first.kind == "cpu":
            ethernet = min(ethernet, 1.0)
        out.append(
            Node(
                name,
                count,
                Gpu(first.name or first.kind, first.tflops or 0.05, first.memory_gib or 16.0),
                intra_gbps=intra,
                ethernet_gbps=ethernet,
                nics=rdma,
            )
        )
    return Cluster("agents", tuple(out), rates=missing)
