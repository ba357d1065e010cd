"""The search's innermost functions against their plain definitions (Hypothesis): the shortcuts
they take for speed must not change a single answer."""

from __future__ import annotations

import heapq
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from drover.planner.cost import StageCost, dp_sync_s, min_pair_bw
from drover.planner.grouping import form_groups
from drover.planner.orchestration import holds_model, partition_layers, split_blocks

from support import make_cluster, make_model


def split_one_block_at_a_time(weights, extras, caps, blocks):
    """Every stage one block, then each further block to the stage whose time stays lowest."""
    if len(weights) > blocks or min(caps) < 1 or sum(caps) < blocks:
        return None
    counts = [1] * len(weights)
    heap = [(2 * w + e, k) for k, (w, e, cap) in enumerate(zip(weights, extras, caps)) if cap > 1]
    heapq.heapify(heap)
    for _ in range(blocks - len(weights)):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        if counts[k] < caps[k]:
            heapq.heappush(heap, ((counts[k] + 1) * weights[k] + extras[k], k))
    return counts


# Weights from a few values, so stages tie (the order of ties is part of the answer).
WEIGHT = st.one_of(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), st.floats(0.05, 8.0))


@st.composite
def stages(draw):
    count = draw(st.integers(1, 12))
    weights = draw(st.lists(WEIGHT, min_size=count, max_size=count))
    extras = [0.0] * count
    extras[-1] = draw(st.one_of(st.just(0.0), st.floats(0.0, 30.0), st.just(weights[-1] * 2)))
    caps = draw(st.lists(st.one_of(st.integers(1, 6), st.just(1000)), min_size=count, max_size=count))
    return weights, extras, caps, draw(st.integers(1, 90))


@settings(max_examples=400, deadline=None)
@given(stages())
def test_split_equals_adding_one_block_at_a_time(case):
    assert split_blocks(*case) == split_one_block_at_a_time(*case)


CLUSTER = make_cluster("ib-roce")  # 4 nodes of 8, two networks: pairs sync at unlike bandwidths
MODEL = make_model("gpt-7b")


def dp_sync_by_block(costs, model, cluster):
    """T_dp as section 6 states it: each device pays, for every block it holds, that block's
    all-reduce over its holders (at the narrowest holder's TP and the slowest pair), and the
    embedding's on first stages and the head's on last stages."""
    D = len(costs)
    if D == 1:
        return 0.0

    def sync(params, holders):
        bw = min_pair_bw([s.node for s in holders], cluster)
        return 2 * (D - 1) / D * 2 * params / (min(s.t for s in holders) * bw)

    def holder(row, block):
        return next(s for s in row if s.start <= block < s.end)

    paid = []
    for row in costs:
        for k, s in enumerate(row):
            cost = sum(sync(model.block_params, [holder(r, b) for r in costs]) for b in range(s.start, s.end))
            cost += sync(model.embedding_params, [r[0] for r in costs]) if k == 0 else 0.0
            cost += sync(model.head_params, [r[-1] for r in costs]) if k == len(row) - 1 else 0.0
            paid.append(cost)
    return max(paid)


@st.composite
def layouts(draw):
    """Pipelines of stages on random nodes and TP sizes, split at the same blocks or not."""
    layers = MODEL.layers
    count = draw(st.integers(1, 5))
    aligned = draw(st.booleans())
    cuts = None
    rows = []
    for _ in range(count):
        if cuts is None or not aligned:
            depth = draw(st.integers(1, 6))
            cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=depth - 1, max_size=depth - 1)))
        bounds = [0, *cuts, layers]
        rows.append(
            [
                StageCost(draw(st.integers(0, 3)), draw(st.sampled_from([1, 2, 4, 8])), 1e14, 8e10, a, b)
                for a, b in zip(bounds, bounds[1:])
            ]
        )
    return rows


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_dp_sync_equals_its_definition_block_by_block(costs):
    assert math.isclose(dp_sync_s(costs, MODEL, CLUSTER), dp_sync_by_block(costs, MODEL, CLUSTER), rel_tol=1e-12)


# Stragglers and failed GPUs make groups of several sizes; 32 A100s hold gpt-7b only in pipelines
# of a few stages or more, and fewer the more micro-batches are in flight.
HOLDING = make_cluster("failed", n1_3=3.0)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.data(), st.sampled_from([1, 8]), st.sampled_from([2, 16, 64]))
def test_holds_model_says_what_partitioning_one_pipeline_says(tp, data, micro_batch, micro_batches):
    """Micro-batches of 8 sequences: activations in flight weigh as much as the weights; 8
    blocks: pipelines deeper than a stage per block."""
    layers = data.draw(st.sampled_from([8, 32]))
    model = make_model("gpt-7b", layers=layers, micro_batch=micro_batch, global_batch=micro_batch * micro_batches)
    groups, _ = form_groups(HOLDING, model, tp, split_ratio=1.1)
    pipe = data.draw(st.permutations(groups))[: data.draw(st.integers(1, len(groups)))]
    assert holds_model(pipe, model) == (partition_layers([pipe], model, HOLDING) is not None)
