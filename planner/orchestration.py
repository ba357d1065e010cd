"""Phase 2: pipeline orchestration.

Arranges groups into pipelines (their number and length may differ), then
gives each stage a contiguous block range sized to its speed, its memory, its
tensor-parallel overhead, the LM head on the last stage, and the gradient
sync its links will pay.

NIC awareness (Holmes): groups are ordered by the network their node's
data-parallel traffic can use (InfiniBand, RoCE, Ethernet only) and dealt so
that stage k of every pipeline comes from one slice of that order. The
replicas of a block then sit on one RDMA type where the counts allow, and
only pipeline boundaries cross between InfiniBand and RoCE, where traffic
falls back to TCP.
"""

from __future__ import annotations

import heapq

from .cluster import Cluster
from .cost import BYTES_PER_PARAM, MEMORY_HEADROOM, StageCost, min_pair_bw
from .grouping import Group
from .model import ModelSpec

ARRANGEMENTS = ("columns", "rows")


def nic_order(cluster: Cluster) -> dict[str, int]:
    """NIC classes, fastest data-parallel network first."""
    best: dict[str, float] = {}
    for n in cluster.nodes:
        bw = max([n.rdma_bw(t) for t in n.rdma_types] or [n.eth_bw])
        best[n.nic_class] = max(best.get(n.nic_class, 0.0), bw)
    return {c: r for r, c in enumerate(sorted(best, key=lambda c: (-best[c], c)))}


def arrange(groups: list[Group], stages: int, how: str, cluster: Cluster, max_pipelines: int) -> list[list[Group]]:
    """Deal groups into pipelines of about `stages` stages (at most `max_pipelines`,
    one per micro-batch; with fewer, the pipelines grow longer).

    columns: in network then file order, stage k of every pipeline from the
      k-th slice, so a straggler lands in one pipeline and replicas of a block
      share a network.
    rows: in network then speed order, each pipeline a run of consecutive
      groups, so slow groups share pipelines (which then get fewer
      micro-batches) instead of slowing many.
    """
    rank = nic_order(cluster)
    cls = [rank[cluster.nodes[g.node].nic_class] for g in groups]
    if how == "columns":
        order = sorted(range(len(groups)), key=lambda i: (cls[i], groups[i].node))
    else:
        order = sorted(range(len(groups)), key=lambda i: (cls[i], -groups[i].speed, groups[i].node))
    ordered = [groups[i] for i in order]
    count = max(1, min(round(len(ordered) / stages), max_pipelines))
    if how == "columns":
        return [ordered[p::count] for p in range(count)]
    sizes = [len(ordered) // count + (p < len(ordered) % count) for p in range(count)]
    out, at = [], 0
    for size in sizes:
        out.append(ordered[at : at + size])
        at += size
    return out


def partition_layers(
    pipelines: list[list[Group]], model: ModelSpec, cluster: Cluster, in_flight: int = 0
) -> list[list[StageCost]] | None:
    """Blocks per stage for every pipeline, or None if some pipeline cannot hold the model.
    Memory is counted with `in_flight` micro-batches at most (0: M, so any split of the
    micro-batches fits; fewer lets a small GPU hold a stage of a pipeline given few).

    Per pipeline, minimises max_k (n_k * w_k + e_k), where w_k is the stage's
    time per block (compute, tensor-parallel all-reduces, and its share of the
    gradient sync spread over the expected micro-batches) and e_k the LM head.
    Adding blocks one at a time to the stage that stays fastest is optimal for
    this min-max because every stage's time grows with its block count.
    """
    D = len(pipelines)
    depth = max(len(p) for p in pipelines)
    mu = model.micro_batches / D + depth - 1  # how many tau a pipeline's step lasts
    sync_factor = 2 * (D - 1) / D * 2 * model.block_params if D > 1 else 0.0
    position_bw = [
        min_pair_bw([p[k].node for p in pipelines if len(p) > k], cluster)
        if sum(len(p) > k for p in pipelines) > 1
        else float("inf")
        for k in range(depth)
    ]
    out = []
    solved: dict[tuple, list[int] | None] = {}  # most pipelines look alike: solve each kind once
    for pipe in pipelines:
        shape = tuple((g.t, g.speed, g.memory, g.intra_bw, position_bw[k]) for k, g in enumerate(pipe))
        if shape not in solved:
            solved[shape] = _blocks_per_stage(shape, model, mu, sync_factor, in_flight or model.micro_batches)
        counts = solved[shape]
        if counts is None:
            return None
        row, start = [], 0
        for g, n in zip(pipe, counts):
            row.append(StageCost(g.node, g.t, g.speed, g.memory, start, start + n))
            start += n
        out.append(row)
    return out


def _blocks_per_stage(
    shape: tuple, model: ModelSpec, mu: float, sync_factor: float, in_flight: int
) -> list[int] | None:
    L, S = model.layers, len(shape)
    if S > L:
        return None
    weights, extras, caps = [], [], []
    for k, (t, speed, memory, intra_bw, sync_bw) in enumerate(shape):
        w = 3 * model.block_flops / (t * speed)
        if t > 1:
            w += 4 * (2 * (t - 1) / t) * model.activation_bytes / intra_bw
        w += sync_factor / (t * sync_bw) / mu
        weights.append(w)
        extras.append(3 * model.head_flops / (t * speed) if k == S - 1 else 0.0)
        # Section 5's memory, solved for n, with the most micro-batches in flight (m = M).
        fixed = BYTES_PER_PARAM * (model.embedding_params * (k == 0) + model.head_params * (k == S - 1))
        per_block = BYTES_PER_PARAM * model.block_params + min(S - k, in_flight) * model.block_activation_memory
        caps.append(int((MEMORY_HEADROOM * memory * t - fixed) // per_block))
    if min(caps) < 1 or sum(caps) < L:
        return None
    counts = [1] * S
    heap = [(2 * weights[k] + extras[k], k) for k in range(S) if caps[k] > 1]
    heapq.heapify(heap)
    for _ in range(L - S):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        if counts[k] < caps[k]:
            heapq.heappush(heap, ((counts[k] + 1) * weights[k] + extras[k], k))
    return counts
