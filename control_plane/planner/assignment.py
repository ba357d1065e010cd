"""Phase 3: workload assignment.

A pipeline with m micro-batches takes T(m) = first + (m - 1) * each (the
one-forward-one-backward formula of the cost model). Micro-batches go to
pipelines so that the slowest finishes as early as possible: in proportion to
what each can do, every pipeline at least one, summing to M.
"""

from __future__ import annotations

import heapq


def assign_micro_batches(first: list[float], each: list[float], total: int) -> list[int] | None:
    """Minimise max_p first[p] + (m[p] - 1) * each[p] subject to sum m = total, m >= 1.

    Starts from the proportional share rounded down, then adds the rest one
    at a time where it finishes earliest (optimal for this min-max since
    every T grows with m). None when there are more pipelines than micro-batches.
    """
    D = len(first)
    if D > total:
        return None
    inverse = [1.0 / e for e in each]
    scale = total / sum(inverse)
    counts = [max(1, int(scale * inv)) for inv in inverse]
    # Rounding up to one can overshoot; take back from the pipelines that finish last.
    while sum(counts) > total:
        p = max((p for p in range(D) if counts[p] > 1), key=lambda p: first[p] + (counts[p] - 1) * each[p])
        counts[p] -= 1
    heap = [(first[p] + counts[p] * each[p], p) for p in range(D)]
    heapq.heapify(heap)
    for _ in range(total - sum(counts)):
        _, p = heapq.heappop(heap)
        counts[p] += 1
        heapq.heappush(heap, (first[p] + counts[p] * each[p], p))
    return counts
