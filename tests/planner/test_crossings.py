"""Pipelines that pass from InfiniBand to RoCE stages cross at one common block: a block held
on InfiniBand in one pipeline and on RoCE in another would sync its gradients over TCP."""

from __future__ import annotations

from drover.planner.candidate import best_partition, score
from drover.planner.cost import dp_sync_s
from drover.planner.grouping import form_groups
from drover.planner.orchestration import network_crossings, partition_layers

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
