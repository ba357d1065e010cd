"""bench/planner_versus.py end to end: another revision's planner imported beside the working
tree's, both timed on the same shapes and their plans compared."""

from __future__ import annotations

from support import run_bench


def test_planner_versus_times_and_compares_two_versions():
    report = run_bench(
        "planner_versus.py", "--against", "HEAD", "--gpus", "64", "--models", "gpt-70b",
        "--rounds", "1", "--scenarios", "2", "--seed", "3",  # seed 3 begins with 64 and 126 GPUs
    )  # fmt: skip
    (row,) = report["planning_time"]
    assert (row["gpus"], row["model"]) == (64, "gpt-70b")
    assert set(row["seconds"]) == {"HEAD", "working tree"} and min(row["seconds"].values()) > 0
    plans = report["plans"]
    differ = len(plans["step_time_new_over_base"])
    assert (plans["scenarios"], plans["seed"]) == (2, 3) and plans["identical"] + differ == 2
    assert plans["faster"] + plans["slower"] <= differ
