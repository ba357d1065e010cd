"""bench/refine_budget.py end to end on one saved gap case: each budget plans, the ratio is to the
saved reference plan, and the planner's own budget is what it was afterwards."""

from __future__ import annotations

from drover.planner.search import REFINE_EVALS

from support import run_bench


def test_refine_budget_plans_a_gap_case_at_each_budget():
    report = run_bench("refine_budget.py", "--evals", "0,300", "--below", "0.975")  # case 89 alone
    (case,) = report["cases"]
    assert case["id"] == 89 and set(case["by_evals"]) == {"0", "300"}
    assert all(0.5 < b["ratio"] < 1.5 and b["seconds"] > 0 for b in case["by_evals"].values())
    assert report["default_evals"] == list(REFINE_EVALS) != [300, 300]  # restored after the runs
