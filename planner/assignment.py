"""Phase 3: workload assignment.

A pipeline with m micro-batches takes T(m) = first + (m - 1) * each (the
one-forward-one-backward formula of the cost model). Micro-batches go to
pipelines so that the slowest finishes as early as possible: in proportion to
what each can do, every pipeline at least one, summing to M.
"""

from __future__ import annotations

import heapq


def assign_micro_batches(
    first: list[float], each: list[float], total: int, caps: list[int] | None = None
) -> list[int] | None:
    """Minimise max_p first[p] + (m[p] - 1) * each[p] subject to sum m = total, m >= 1.

    Starts from the continuous optimum rounded down (never above the integer
    optimum), then adds the rest one at a time where it finishes earliest,
    which is optimal for this min-max since every T grows with m. `caps`: the
    most each pipeline's memory holds. None when there are more pipelines than
    micro-batches, or the caps hold fewer than all.
    """
    D = len(first)
    caps = caps or [total] * D
    if D > total or sum(caps) < total:
        return None
    # Real-valued m (even below 1) with every pipeline finishing at the same time.
    rate = sum(1.0 / e for e in each)
    finish = (total - D + sum(f / e for f, e in zip(first, each))) / rate
    counts = [min(cap, max(1, int((finish - f) / e) + 1)) for f, e, cap in zip(first, each, caps)]
    if sum(counts) > total:  # clamping to one overshot: start from the bottom
        counts = [1] * D
    heap = [(first[p] + counts[p] * each[p], p) for p in range(D) if counts[p] < caps[p]]
    heapq.heapify(heap)
    for _ in range(total - sum(counts)):
        _, p = heapq.heappop(heap)
        counts[p] += 1
        if counts[p] < caps[p]:
            heapq.heappush(heap, (first[p] + counts[p] * each[p], p))
    return counts
