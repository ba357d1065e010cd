"""Baselines that Drover must beat, as a Megatron-style job would run.

uniform: the best plan chosen as if every GPU were healthy: one TP size inside
  nodes, one pipeline depth, blocks and micro-batches split evenly, ranks in
  file order (TP fastest, then data parallel, then pipeline, as Megatron
  orders them). A pipeline that holds a failed GPU cannot run: it is left
  out and its micro-batches spread over the others.
drop: the best uniform plan on the nodes that hold no straggler, as an
  elastic restart without those nodes would run.
"""

from __future__ import annotations

from dataclasses import replace

from .candidate import Candidate, score
from .cluster import Cluster
from .cost import StageCost, fits_memory
from .grouping import tp_degrees
from .model import ModelSpec


def even_split(total: int, parts: int) -> list[int]:
    """Split as evenly as possible; the earlier parts take the remainder."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def per_device(cluster: Cluster, model: ModelSpec) -> tuple[list[float], list[float]]:
    """Every device's speed and memory, in file order: uniform scores many layouts of one cluster."""
    return [cluster.speed(d, model.mfu) for d in cluster.devices], [cluster.memory_bytes(d) for d in cluster.devices]


def _layout(cluster: Cluster, model: ModelSpec, t: int, S: int, D: int, figures: tuple | None = None):
    """Megatron's rank order: rank = stage * (D * t) + pipeline * t + tp_rank. `figures`: the
    cluster's per_device, if the caller has them."""
    devices = cluster.devices
    speeds, memories = figures or per_device(cluster, model)
    bounds = [0]
    for n in even_split(model.layers, S):
        bounds.append(bounds[-1] + n)
    ids, costs = [], []
    for p in range(D):
        row_ids, row = [], []
        for k in range(S):
            first = k * D * t + p * t
            group = devices[first : first + t]
            row_ids.append(tuple(d.id for d in group))
            row.append(
                StageCost(
                    group[0].node,
                    t,
                    min(speeds[first : first + t]),
                    min(memories[first : first + t]),
                    bounds[k],
                    bounds[k + 1],
                )
            )
        ids.append(row_ids)
        costs.append(row)
    return ids, costs


def uniform(cluster: Cluster, model: ModelSpec) -> Candidate | None:
    """The uniform baseline evaluated on the cluster as it is (None if nothing fits)."""
    healthy = cluster.with_rates({})
    world = len(cluster.devices)
    figures = per_device(healthy, model)
    best = None
    for t in tp_degrees(cluster, model):
        if any(n.gpus % t for n in cluster.nodes):
            continue
        for S in range(1, model.layers + 1):
            if (world // t) % S or world % t:
                continue
            D = world // (t * S)
            if D > model.micro_batches:
                continue
            ids, costs = _layout(healthy, model, t, S, D, figures)
            micro = even_split(model.micro_batches, D)
            if not fits_memory(costs, micro, model):
                continue
            c = score(ids, costs, [], model, healthy, micro)
            if best is None or c.step_time_s < best[0].step_time_s:
                best = (c, t, S, D)
    if best is None:
        return None
    _, t, S, D = best
    ids, costs = _layout(cluster, model, t, S, D)
    failed = {d.id for d in cluster.devices if d.failed}
    keep = [p for p in range(D) if not any(d in failed for stage in ids[p] for d in stage)]
    if not keep:
        return None
    removed = [d for p in range(D) if p not in keep for stage in ids[p] for d in stage if d not in failed]
    micro = even_split(model.micro_batches, len(keep))
    ids, costs = [ids[p] for p in keep], [costs[p] for p in keep]
    if not fits_memory(costs, micro, model):
        return None
    return score(ids, costs, removed, model, cluster, micro)


def drop(cluster: Cluster, model: ModelSpec) -> Candidate | None:
    """The uniform baseline on the nodes whose every GPU is healthy."""
    slow_nodes = {d.node for d in cluster.devices if d.rate != 1.0}
    kept = tuple(n for i, n in enumerate(cluster.nodes) if i not in slow_nodes)
    if not kept:
        return None
    sub = replace(cluster, nodes=kept, rates={})
    c = uniform(sub, model)
    if c is None:
        return None
    # Re-resolve on the full cluster so node indices and the ideal refer to it.
    index = cluster.node_index
    costs = [[s._replace(node=index[sub.nodes[s.node].name]) for s in row] for row in c.costs]
    removed = [d.id for d in cluster.usable if d.node in slow_nodes]
    return score(c.devices, costs, removed, model, cluster, c.micro_batches)
