"""Pipelines that pass from InfiniBand to RoCE stages cross at one common block: a block held
on InfiniBand in one pipeline and on RoCE in another would sync its gradients over TCP."""

from __future__ import annotations

import math

import pytest

from drover.planner.candidate import best_partition, score
from drover.planner.cost import dp_sync_s, min_pair_bw, stage_sync_bws
from drover.planner.grouping import form_groups
from drover.planner.orchestration import network_crossings, networks_in_one_order, partition_layers
from drover.planner.polish import Polisher

from support import make_cluster, make_model


def _pipelines(cluster, model, order):
    groups = {cluster.nodes[g.node].name: g for g in form_groups(cluster, model, 8)[0]}
    return [[groups[name] for name in pipe] for pipe in order]


def _crossing(row, cluster):
    """The first block on a RoCE stage."""
    return next(c.start for c in row if cluster.nodes[c.node].nic_class == "roce")


def test_a_straggler_moves_one_pipelines_crossing_and_a_common_one_is_faster():
    # n0, n2 InfiniBand; n1, n3 RoCE. 16 micro-batches: a short step, where TCP sync shows.
    cluster, model = make_cluster("ib-roce", n0_3=2.0), make_model(global_batch=16)
    pipes = _pipelines(cluster, model, [["n0", "n1"], ["n2", "n3"]])
    free = partition_layers(pipes, model, cluster)
    assert _crossing(free[0], cluster) < _crossing(free[1], cluster)  # the slow group takes fewer blocks
    crossings = network_crossings(free, cluster)
    assert crossings == sorted({(_crossing(free[0], cluster),), (_crossing(free[1], cluster),)})
    devices = [[g.devices for g in pipe] for pipe in pipes]
    unaligned = score(devices, free, [], model, cluster)
    best = best_partition(pipes, free, [], model, cluster)
    assert _crossing(best.costs[0], cluster) == _crossing(best.costs[1], cluster)
    assert dp_sync_s(best.costs, model, cluster) < dp_sync_s(free, model, cluster) / 4  # no block over TCP
    assert best.step_time_s < unaligned.step_time_s


def test_crossings_only_where_pipelines_pass_the_same_networks_at_different_blocks():
    cluster, model = make_cluster("ib-roce"), make_model()
    same = partition_layers(_pipelines(cluster, model, [["n0", "n1"], ["n2", "n3"]]), model, cluster)
    assert network_crossings(same, cluster) == []  # healthy: both cross at the same block already
    reversed_order = partition_layers(_pipelines(cluster, model, [["n0", "n1"], ["n3", "n2"]]), model, cluster)
    assert network_crossings(reversed_order, cluster) == []  # RoCE first in one: no common crossing
    one_network = partition_layers(_pipelines(cluster, model, [["n0", "n2"], ["n1", "n3"]]), model, cluster)
    assert network_crossings(one_network, cluster) == []


def test_pipelines_through_the_networks_in_unlike_orders_are_scored_in_one_order_too():
    # RoCE first in one pipeline, last in the other: no common crossing, so the blocks held on
    # InfiniBand in one and on RoCE in the other sync over TCP, unless both pass in one order.
    cluster, model = make_cluster("ib-roce", n0_3=2.0), make_model(global_batch=16)
    pipes = _pipelines(cluster, model, [["n0", "n1"], ["n3", "n2"]])
    aligned = networks_in_one_order(pipes, cluster)
    classes = [[cluster.nodes[g.node].nic_class for g in pipe] for pipe in aligned]
    assert classes[0] == classes[1] and sorted(map(id, aligned[1])) == sorted(map(id, pipes[1]))
    assert networks_in_one_order(aligned, cluster) is None  # in one order already
    as_dealt = partition_layers(pipes, model, cluster)
    devices = [[g.devices for g in pipe] for pipe in pipes]
    unaligned = best_partition(pipes, as_dealt, [], model, cluster, realign=False)
    best = best_partition(pipes, as_dealt, [], model, cluster)
    assert best.step_time_s < unaligned.step_time_s * 0.9
    assert [[cluster.nodes[c.node].nic_class for c in row] for row in best.costs] == classes
    assert best.step_time_s < score(devices, as_dealt, [], model, cluster).step_time_s


def test_each_network_run_gets_the_blocks_between_its_crossings():
    cluster, model = make_cluster("ib-roce", n0_3=2.0), make_model()
    pipes = _pipelines(cluster, model, [["n0", "n2", "n1"], ["n2", "n0", "n3"]])
    split = 0
    for crossing in range(2, model.layers - 1):
        costs = partition_layers(pipes, model, cluster, crossings=(crossing,))
        if costs is None:
            continue  # memory: a run cannot hold that many blocks
        split += 1
        for row in costs:
            assert _crossing(row, cluster) == crossing and row[-1].end == model.layers
    assert split > 20
    assert partition_layers(pipes, model, cluster, crossings=(10, 20)) is None  # two crossings: not these networks


def _held_at(costs, cluster, p, k):
    """Brute force: the slowest sync of any block of stage (p, k), per GPU of its TP size."""
    stage, worst = costs[p][k], math.inf
    for block in range(stage.start, stage.end):
        holders = [next(c for c in row if c.start <= block < c.end) for row in costs]
        bw = min_pair_bw([c.node for c in holders], cluster) * min(c.t for c in holders) / stage.t
        worst = min(worst, bw)
    return worst


def _unlike_depths(cluster, model):
    """Pipelines of 3, 4 and 5 stages on InfiniBand nodes, each ending on one GPU of n7, which
    has no RDMA: the n7 stages sync inside n7, the others over InfiniBand, if their blocks
    line up."""
    polisher = Polisher(cluster, model, stages=0)
    shapes = (
        [["n0/0", "n0/1"], ["n1/0", "n1/1"]],
        [["n2/0"], ["n3/0"], ["n4/0"]],
        [["n5/0"], ["n6/0"], ["n5/1"], ["n6/1"]],
    )
    return [[polisher.group(ids) for ids in shape] + [polisher.group([f"n7/{p}"])] for p, shape in enumerate(shapes)]


def test_stage_sync_bandwidths_are_those_of_each_stages_blocks_holders():
    cluster, model = make_cluster("one-ethernet", n2_0=1.5), make_model()
    costs = partition_layers(_unlike_depths(cluster, model), model, cluster)
    bws = stage_sync_bws(costs, cluster)
    assert [len(row) for row in bws] == [3, 4, 5]
    for p, row in enumerate(costs):
        for k in range(len(row)):
            assert bws[p][k] == pytest.approx(_held_at(costs, cluster, p, k))
    assert len({bw for row in bws for bw in row}) > 1


def test_pipelines_of_unlike_depths_are_split_again_by_what_their_blocks_sync_at():
    cluster, model = make_cluster("one-ethernet"), make_model(global_batch=64)
    pipes = _unlike_depths(cluster, model)
    devices = [[g.devices for g in pipe] for pipe in pipes]
    first = partition_layers(pipes, model, cluster)  # stage k's sync as the stages of index k pay it
    again = partition_layers(pipes, model, cluster, sync_bws=stage_sync_bws(first, cluster))
    assert again != first
    best = best_partition(pipes, first, [], model, cluster)
    splits = [first] + [partition_layers(pipes, model, cluster, crossings=c) for c in network_crossings(first, cluster)]
    assert best.step_time_s < min(score(devices, s, [], model, cluster).step_time_s for s in splits) * 0.99
    assert best.step_time_s <= score(devices, again, [], model, cluster).step_time_s
