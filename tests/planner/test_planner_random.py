"""Random clusters and models: every plan any strategy returns is valid, and
Drover's is never worse than a baseline that finds a plan."""

from __future__ import annotations

import random

import pytest

from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import validate
from drover.planner.errors import PlanError
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan

GPUS = [
    {"name": "A100-80G", "tflops": 312, "memory_gib": 80},
    {"name": "A10-24G", "tflops": 125, "memory_gib": 24},
    {"name": "H100-80G", "tflops": 989, "memory_gib": 80},
]
NICS = [
    [],
    [{"type": "infiniband", "gbps": 200, "count": 4}],
    [{"type": "roce", "gbps": 100, "count": 2}],
    [{"type": "roce", "gbps": 100}, {"type": "infiniband", "gbps": 400}],
]


def random_case(rng: random.Random):
    nodes = [
        {
            "name": f"n{i}",
            "gpus": rng.choice([1, 2, 4, 8]),
            "gpu": rng.choice(GPUS),
            "intra_gbps": rng.choice([400, 2400]),
            "ethernet_gbps": rng.choice([10, 100]),
            "nics": rng.choice(NICS),
        }
        for i in range(rng.randint(1, 5))
    ]
    devices = [f"{n['name']}/{j}" for n in nodes for j in range(n["gpus"])]
    rates = {d: rng.choice([1.2, 2, 5, 12, "inf"]) for d in rng.sample(devices, rng.randint(0, min(4, len(devices))))}
    b = rng.choice([1, 2, 4])
    model = {
        "layers": rng.choice([2, 4, 12, 24]),
        "hidden": rng.choice([512, 2048, 4096]),
        "heads": rng.choice([8, 16, 32]),
        "seq_len": rng.choice([512, 2048]),
        "vocab": rng.choice([1000, 50000]),
        "global_batch": b * rng.choice([1, 3, 8, 16, 64]),
        "micro_batch": b,
    }
    return cluster_from_dict({"name": "random", "nodes": nodes, "rates": rates}), model_from_dict(model)


@pytest.mark.parametrize("seed", range(40))
def test_random_cluster(seed):
    cluster, model = random_case(random.Random(seed))
    found = {}
    for strategy in ("uniform", "drop", "drover"):
        try:
            plan = make_plan(cluster, model, strategy)
        except PlanError as err:
            assert err.rule in ("no-feasible-plan", "no-usable-device"), err
            continue
        validate(plan, cluster, model)
        found[strategy] = plan.predicted.samples_per_s
    baselines = [found[s] for s in ("uniform", "drop") if s in found]
    if baselines:
        assert "drover" in found and found["drover"] >= max(baselines) * (1 - 1e-12)
