"""Planning time: a budget cuts Drover's search short with the best plan found by then (a valid
plan, never better than the full search's, after far fewer layouts); the work the search skips
to go faster changes no plan."""

from __future__ import annotations

import gc

import pytest

from drover.planner import candidate as candidate_module
from drover.planner import search as search_module
from drover.planner.cost import evaluate, validate
from drover.planner.search import make_plan

from support import make_cluster, make_model


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


@pytest.mark.parametrize(
    "variant, rates",
    [
        ("one-straggler", {"n0_2": 1.5, "n2_6": 6.0, "n3_1": 2.5}),
        ("ib-roce", {"n1_0": 4.0, "n1_1": 4.0, "n2_3": "inf"}),
        ("one-ethernet", {"n4_4": 1.3}),
    ],
)
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
