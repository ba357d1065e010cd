"""The benchmark's reference search (bench/reference_search.py): its plans are
valid, never slower than where it starts, the same for the same seed, and its
reach is never below the planner's own plan."""

from __future__ import annotations

import sys
from pathlib import Path

from drover.planner.cost import evaluate, validate
from drover.planner.search import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import reference_search as rs  # noqa: E402
from test_walk import IB, MODEL, STRAGGLERS, cluster  # noqa: E402


def test_improves_uniform_baseline_validly_and_deterministically():
    c = cluster([IB] * 4, STRAGGLERS)
    start = make_plan(c, MODEL, "uniform")
    runs = [rs.reference_search(c, MODEL, evals=400, seed=3, starts={"uniform": start}) for _ in range(2)]
    plan = runs[0].plan
    validate(plan, c, MODEL)
    assert plan.predicted.samples_per_s == evaluate(plan, c, MODEL).samples_per_s
    assert plan.predicted.samples_per_s > start.predicted.samples_per_s
    assert runs[0].start == "uniform" and runs[0].evals == 400
    assert plan.to_dict() == runs[1].plan.to_dict()
    assert "n0/0" not in plan.devices + list(plan.removed)


def test_never_worse_than_drovers_plan():
    c = cluster([IB] * 4, STRAGGLERS)
    drover = make_plan(c, MODEL)
    result = rs.reference_search(c, MODEL, evals=300, seed=0, starts=rs.start_plans(c, MODEL, drover))
    assert result.plan.predicted.samples_per_s >= drover.predicted.samples_per_s * (1 - 1e-12)
