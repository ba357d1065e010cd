"""A planning budget cuts Drover's search short with the best plan found by then: a valid plan,
never better than the full search's, after far fewer layouts."""

from __future__ import annotations

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
