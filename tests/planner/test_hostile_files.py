"""A cluster or model file either is refused with an error naming a field, or plans: mutated
files (a value swapped for junk or an extreme, a key dropped or added) never crash the planner."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimum_cases import random_case

from drover.planner.cluster import cluster_from_dict
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan

EXTREMES = [0, -1, 10**18, 1e300, 1.7e308, 1e-300, math.inf, math.nan]  # in place of a number, mostly
JUNK = [None, True, 3, 0.5, "", "x", "inf", [], {}, "n0/0", *EXTREMES]


def _paths(data, prefix=()):
    """Every key or index path into nested dicts and lists."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _at(data, path):
    for key in path:
        data = data[key]
    return data


@st.composite
def mutated(draw, data: dict) -> dict:
    out = copy.deepcopy(data)
    paths = list(_paths(out))
    numbers = [p for p in paths if type(_at(out, p)) in (int, float)]
    how = draw(st.sampled_from(["extreme"] * 3 + ["junk", "drop", "add"]))
    path = draw(st.sampled_from(numbers if numbers and how == "extreme" else paths))
    parent = _at(out, path[:-1])
    if how == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == "add" and isinstance(parent, dict):
        parent["unknown"] = draw(st.sampled_from(JUNK))
    else:
        parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(EXTREMES if how == "extreme" else JUNK)))
    return out


@st.composite
def hostile_files(draw) -> tuple[dict, dict]:
    cluster, model = random_case(lambda options: draw(st.sampled_from(options)))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            cluster = draw(mutated(cluster))
        else:
            model = draw(mutated(model))
    return cluster, model


CLUSTER = {
    "name": "c",
    "nodes": [
        {
            "name": "n0",
            "gpus": 4,
            "gpu": {"name": "A100-80G", "tflops": 312, "memory_gib": 80},
            "intra_gbps": 2400,
            "ethernet_gbps": 100,
            "nics": [{"type": "infiniband", "gbps": 200, "count": 4}],
        },
        {"name": "n1", "gpus": 2, "gpu": {"name": "A10-24G", "tflops": 125, "memory_gib": 24}, "intra_gbps": 400}
        | {"ethernet_gbps": 10},
    ],
    "rates": {"n0/1": 1.5},
}
MODEL = {"family": "llama", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "seq_len": 512, "vocab": 32000}
MODEL |= {"global_batch": 16, "micro_batch": 2}
NUMBERS = [("cluster", p) for p in _paths(CLUSTER) if type(_at(CLUSTER, p)) in (int, float)]
NUMBERS += [("model", p) for p in _paths(MODEL) if type(_at(MODEL, p)) in (int, float)]


@pytest.mark.parametrize("which, path", NUMBERS, ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else v)
def test_every_number_of_a_file_at_an_extreme_is_refused_naming_it_or_plans(which, path):
    for value in EXTREMES:
        files = {"cluster": copy.deepcopy(CLUSTER), "model": copy.deepcopy(MODEL)}
        _at(files[which], path[:-1])[path[-1]] = value
        _refused_naming_a_field_or_planned(files["cluster"], files["model"])


@settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(hostile_files())
def test_a_mutated_file_is_refused_naming_a_field_or_plans(files):
    _refused_naming_a_field_or_planned(*files)


def _refused_naming_a_field_or_planned(cluster_dict: dict, model_dict: dict) -> None:
    try:
        cluster, model = cluster_from_dict(cluster_dict), model_from_dict(model_dict)
    except SpecError as err:
        assert err.field and err.allowed  # names the field and what it allows
        return
    try:
        plan = make_plan(cluster, model, budget_s=0.5)
    except PlanError:
        return  # nothing fits: said so by rule
    assert plan.predicted.samples_per_s > 0 and math.isfinite(plan.predicted.step_time_s)
