"""bench/planner.py's planning-time section: the times as measured, and scaled to the speed of
the machine the targets were set on."""

from __future__ import annotations

import importlib.util

from support import ROOT


def bench_planner():
    spec = importlib.util.spec_from_file_location("bench_planner", ROOT / "bench" / "planner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_planning_times_are_judged_as_measured_and_at_the_targets_machine_speed():
    bench = bench_planner()
    rows = [
        {"gpus": 64, "model": "gpt-7b", "worst_seconds": 0.6, "worst_shape": "four-mixed"},
        {"gpus": 1024, "model": "gpt-3.6b", "worst_seconds": 6.0, "worst_shape": "four-mixed"},
    ]
    # A machine three times slower than the targets' at the loop: 0.6 s there is 0.2 s at theirs.
    report = bench.timing_report(rows, loop_s=3 * bench.TARGETS_LOOP_S)
    assert [r["worst_seconds_at_targets_speed"] for r in report["planning_time"]] == [0.2, 2.0]
    assert not report["planning_time_targets_met"]
    assert report["planning_time_targets_met_at_targets_speed"]
    # Only twice as slow: 0.3 s at the targets' speed, past 0.2 s.
    report = bench.timing_report(rows, loop_s=2 * bench.TARGETS_LOOP_S)
    assert not report["planning_time_targets_met_at_targets_speed"]
    assert "worst_seconds_at_targets_speed" not in rows[0]  # the measured rows are left as they were
