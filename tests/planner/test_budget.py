"""Planning time: a budget cuts Drover's search short with the best plan found by then (a valid
plan, never better than the full search's, after far fewer layouts); the work the search skips
to go faster changes no plan."""

from __future__ import annotations

import gc
import math

import pytest

from drover.planner import candidate as candidate_module
from drover.planner import polish as polish_module
from drover.planner import search as search_module
from drover.planner.cost import dp_sync_floor, evaluate, pipeline_time_s, validate
from drover.planner.orchestration import slowest_floor
from drover.planner.search import make_plan

from support import make_cluster, make_model

PRUNED_CLUSTERS = [
    ("one-straggler", {"n0_2": 1.5, "n2_6": 6.0, "n3_1": 2.5}),
    ("ib-roce", {"n1_0": 4.0, "n1_1": 4.0, "n2_3": "inf"}),
    ("one-ethernet", {"n4_4": 1.3}),
]


def _counting_layouts(monkeypatch) -> list:
    tried = []
    layout = search_module._layout

    def counted(*args, **kwargs):
        tried.append(args[2:])
        return layout(*args, **kwargs)

    monkeypatch.setattr(search_module, "_layout", counted)
    return tried


def test_a_spent_budget_returns_the_first_plan_found_and_it_is_valid(monkeypatch):
    cluster, model = make_cluster("one-straggler"), make_model("gpt-7b")
    tried = _counting_layouts(monkeypatch)
    full = make_plan(cluster, model)
    full_layouts = len(tried)
    tried.clear()
    cut = make_plan(cluster, model, budget_s=0.0)
    validate(cut, cluster, model)
    assert len(tried) < full_layouts / 10, (len(tried), full_layouts)
    assert evaluate(cut, cluster, model).step_time_s >= evaluate(full, cluster, model).step_time_s * (1 - 1e-9)


def test_a_budget_that_is_not_spent_changes_nothing():
    cluster, model = make_cluster("one-straggler"), make_model("gpt-7b")
    assert make_plan(cluster, model, budget_s=3600.0) == make_plan(cluster, model)


@pytest.mark.parametrize("variant, rates", PRUNED_CLUSTERS)
def test_layouts_left_unsynced_past_the_leaders_change_no_plan(monkeypatch, variant, rates):
    """A layout whose pipelines alone are slower than every layout a later choice reads is not
    worked out further (search.KEPT): the plan is the one of the search that works out all."""
    cluster, model = make_cluster(variant, **rates), make_model("gpt-7b")
    syncs = []
    dp_sync = candidate_module.dp_sync_s
    monkeypatch.setattr(candidate_module, "dp_sync_s", lambda *a: syncs.append(1) or dp_sync(*a))
    plan = make_plan(cluster, model)
    pruned = len(syncs)
    syncs.clear()
    monkeypatch.setattr(search_module, "KEPT", 10**9)
    assert make_plan(cluster, model) == plan
    assert pruned < len(syncs), (pruned, len(syncs))


@pytest.mark.parametrize("variant, rates", PRUNED_CLUSTERS)
def test_the_floors_a_layout_is_dropped_by_are_below_every_split_of_it(monkeypatch, variant, rates):
    """search._layout drops a layout before splitting its blocks when its step_floor
    (slowest_floor + dp_sync_floor) passes its bound: neither may ever exceed what a split of
    the layout reaches."""
    cluster, model = make_cluster(variant, **rates), make_model("gpt-7b")
    checked = []
    best_partition = search_module.best_partition

    def checking(pipelines, costs, removed, model, cluster, every_crossing=False, bound=math.inf):
        found = best_partition(pipelines, costs, removed, model, cluster, every_crossing)
        if found is not None and found.micro_batches:
            slowest = max(pipeline_time_s(row, m, model, cluster) for row, m in zip(found.costs, found.micro_batches))
            floor = slowest_floor(pipelines, model, cluster)
            assert floor <= slowest * (1 + 1e-9)
            assert floor + dp_sync_floor(pipelines, model, cluster) <= found.step_time_s * (1 + 1e-9)
            checked.append(floor / slowest)
        return None if found is None or found.step_time_s > bound else found

    monkeypatch.setattr(search_module, "best_partition", checking)
    make_plan(cluster, model)
    assert len(checked) > 100 and max(checked) > 0.9, (len(checked), max(checked))


@pytest.mark.parametrize("variant, rates", PRUNED_CLUSTERS)
def test_edits_local_search_drops_by_their_floors_change_no_plan(monkeypatch, variant, rates):
    """An edit that cannot beat the layout it edits is not scored: charged the stages of a
    scored edit, the plan is the one of a local search that scores every edit."""
    cluster, model = make_cluster(variant, **rates), make_model("gpt-7b")
    monkeypatch.setattr(polish_module, "FLOOR_SHARE", 1)
    scored = []
    candidate = polish_module._candidate
    monkeypatch.setattr(polish_module, "_candidate", lambda *a, **k: scored.append(1) or candidate(*a, **k))
    plan = make_plan(cluster, model)
    dropping = len(scored)
    scored.clear()
    monkeypatch.setattr(polish_module, "step_floor", lambda *a, **k: None)
    assert make_plan(cluster, model) == plan
    assert dropping < len(scored), (dropping, len(scored))


def test_the_collector_is_paused_only_while_drover_searches(monkeypatch):
    cluster, model = make_cluster("one-straggler"), make_model("gpt-1b")
    during = []
    search = search_module.search
    monkeypatch.setattr(search_module, "search", lambda *a: during.append(gc.isenabled()) or search(*a))
    make_plan(cluster, model)
    assert during == [False] and gc.isenabled()
    monkeypatch.setattr(search_module, "search", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        make_plan(cluster, model)
    assert gc.isenabled()
    gc.disable()  # a caller that keeps the collector off keeps it off
    try:
        make_plan(cluster, model, "uniform")
        monkeypatch.setattr(search_module, "search", search)
        make_plan(cluster, model)
        assert not gc.isenabled()
    finally:
        gc.enable()
