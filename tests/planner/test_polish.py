"""Local search's edits: every edit of every kind is a layout a plan can be made of."""

from __future__ import annotations

import pytest

from drover.planner.polish import Layout, Polisher, layout_of
from drover.planner.search import search

from support import make_cluster, make_model


def _check(layout: Layout, polisher: Polisher) -> None:
    cluster, model = polisher.cluster, polisher.model
    used = [d for pipe in layout.pipelines for g in pipe for d in g.devices]
    assert sorted(used + list(layout.removed)) == sorted(d.id for d in cluster.usable), "each usable GPU once"
    assert all(pipe for pipe in layout.pipelines) and layout.pipelines, "no empty pipeline"
    for pipe in layout.pipelines:
        assert len(pipe) <= model.layers
        for g in pipe:
            assert {cluster.device_by_id[d].node for d in g.devices} == {g.node}, "a group on one node"
            assert model.tp_divides(g.t) and g == polisher.group(g.devices)


@pytest.mark.parametrize("variant", ["one-straggler", "failed", "ib-roce", "slow-node"])
def test_every_edit_keeps_each_gpu_once_and_groups_valid(variant):
    cluster = make_cluster(variant, n2_5=1.6)
    model = make_model("gpt-1b")
    polisher = Polisher(cluster, model, stages=10**9)
    start = layout_of(search(cluster, model), polisher)
    kinds = {kind.__name__: 0 for kind in polisher.kinds()}
    for kind in polisher.kinds():
        for edit in kind(start):
            _check(edit, polisher)
            kinds[kind.__name__] += 1
    interleaved = list(polisher.edits(start))
    assert len(interleaved) == sum(kinds.values())  # taking turns drops no edit
    assert sum(count > 0 for count in kinds.values()) >= len(kinds) // 2, kinds  # most kinds apply


def test_identical_pipelines_give_one_swap_per_position_pair():
    cluster = make_cluster("one-straggler")
    model = make_model("gpt-1b")
    polisher = Polisher(cluster, model, stages=10**9)
    fast = [polisher.group((f"n0/{2 * i}", f"n0/{2 * i + 1}")) for i in range(4)]
    other = [polisher.group((f"n2/{2 * i}", f"n2/{2 * i + 1}")) for i in range(4)]
    slow = polisher.group(("n1/3",))
    rest = tuple(d.id for d in cluster.usable if d.node not in (0, 2) and d.id != "n1/3")
    layout = Layout(((slow, fast[0]), (other[0], fast[1]), (other[1], fast[2]), (other[2], fast[3])), rest)
    swaps = list(polisher._swaps_across(layout))
    # The three other pipelines are alike (TP2 groups of one speed and network), so from the
    # straggler's pipeline each position pair is tried once, and only the straggler's group
    # differs in kind: two swaps. Between the alike pipelines nothing differs: none.
    assert len(swaps) == 2
    assert {swap.pipelines[0][0] for swap in swaps} == {other[0], fast[1]}
