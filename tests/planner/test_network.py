"""Network files (drover up --network): a cluster file with the named networks its nodes'
NICs join. Each mistake is one error naming the field, the value and what is allowed,
before anything is created."""

from __future__ import annotations

import copy

import pytest
import yaml

from drover.planner.cluster import cluster_from_dict, load_cluster
from drover.planner.errors import SpecError
from drover.planner.network import load_network, networks_from_dict

from support import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "clusters" / "ib-roce-eth.yaml"
DATA = yaml.safe_load(EXAMPLE.read_text())


def networks(data):
    return networks_from_dict(data, cluster_from_dict(data, "net.yaml"), "net.yaml")


def test_the_example_is_a_cluster_and_its_networks():
    cluster, nets = load_network(EXAMPLE)
    assert load_cluster(EXAMPLE) == cluster  # the planner reads the same file as its cluster
    assert [(w.name, w.type, w.nodes) for w in nets] == [
        ("ib", "infiniband", ("ib-0", "ib-1")),
        ("roce", "roce", ("roce-0", "roce-1")),
        ("eth", "ethernet", ("ib-0", "ib-1", "roce-0", "roce-1")),
    ]
    ib, eth = nets[0], nets[2]
    assert ib.gbps(cluster.nodes[0]) == 0.2 and eth.gbps(cluster.nodes[0]) == 0.025


def changed(path: list, value):
    data = copy.deepcopy(DATA)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "data, says",
    [
        (changed(["networks", "eth", "nodes"], ["ib-0", "ib-1", "roce-0"]), "one network of type ethernet with every"),
        (changed(["networks", "eth", "type"], "myrinet"), "'networks.eth.type' = 'myrinet': one of infiniband, roce"),
        (changed(["networks", "ib", "nodes"], ["ib-0", "gpu-7"]), "'gpu-7': a node of the cluster"),
        (changed(["networks", "ib", "nodes"], ["ib-0", "roce-0"]), "'roce-0': nodes with a infiniband NIC"),
        (changed(["networks", "ib"], None), "one infiniband network for its infiniband NIC"),
        (changed(["networks", "Bad_Name"], {"type": "roce", "nodes": "all"}), "1 to 8 lower-case letters"),
        (changed(["networks", "ib", "delay_ms"], -1), "'networks.ib.delay_ms' = -1"),
        (changed(["networks", "ib", "speed"], 5), "'networks.ib.speed' = 5: a known field"),
        (changed(["networks"], {}), "a mapping of network names"),
    ],
)
def test_a_bad_network_file_gets_one_clear_error(data, says):
    with pytest.raises(SpecError) as error:
        networks(data)
    assert says in str(error.value)


@pytest.mark.parametrize(
    "path, value, says",
    [
        (["nodes", 0, "nics"], [{"type": "omnipath", "gbps": 1}], "'nodes[0].nics[0].type' = 'omnipath'"),
        (["nodes", 1, "nics"], [{"type": "infiniband", "gbps": 0}], "'nodes[1].nics[0].gbps' = 0"),
        (["defaults", "ethernet_gbps"], 0, "'nodes[0].ethernet_gbps' = 0: a finite number >= 0.001"),
    ],
)
def test_a_bad_node_of_a_network_file_is_refused_by_drover_up_before_anything_runs(tmp_path, path, value, says):
    bad = tmp_path / "net.yaml"
    bad.write_text(yaml.safe_dump(changed(path, value)))
    run = run_cli("up", "--network", str(bad), "--out", str(tmp_path / "out"))
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert not (tmp_path / "out" / "logs").exists()  # nothing started
