"""The closing descent's budget against the saved gap cases: would a longer walk.refine close them?

    python bench/refine_budget.py                      # 250, 1000, 2000, 4000 moves
    python bench/refine_budget.py --evals 250,8000 --below 0.995

For each case of bench/gap_cases.json whose saved ratio is below --below, Drover plans with each
budget in turn as search.REFINE_EVALS, at every cluster size (the rest of the planner as it is).
Prints one JSON document: per case and budget, Drover's throughput over the saved reference
plan's, and the planning time (one plan, this machine). The reference plans were found from an
earlier version's plan, so a ratio above 1 means this version beats that search.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from drover.planner import search

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from scenarios import scenario_from_dict  # noqa: E402


def run(cases: list[dict], budgets: list[int]) -> list[dict]:
    rows = []
    default = search.REFINE_EVALS
    try:
        for case in cases:
            scenario = scenario_from_dict(case["scenario"])
            row = {"id": case["id"], "gpus": case["gpus"], "saved_ratio": case["ratio"], "by_evals": {}}
            for evals in budgets:
                search.REFINE_EVALS = (evals, evals)
                cluster, model = scenario.cluster(), scenario.model()
                started = time.perf_counter()
                plan = search.make_plan(cluster, model)
                seconds = time.perf_counter() - started
                ratio = case["reference"]["step_time_s"] / plan.predicted.step_time_s
                row["by_evals"][evals] = {"ratio": round(ratio, 4), "seconds": round(seconds, 3)}
            rows.append(row)
    finally:
        search.REFINE_EVALS = default
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", default="250,1000,2000,4000", help="budgets, comma-separated")
    parser.add_argument("--below", type=float, default=0.99, help="cases whose saved ratio is below this")
    args = parser.parse_args()
    budgets = [int(e) for e in args.evals.split(",")]
    saved = json.loads((ROOT / "bench" / "gap_cases.json").read_text())
    cases = [c for c in saved["cases"] if c["ratio"] < args.below]
    rows = run(cases, budgets)
    reached = {e: sum(r["by_evals"][e]["ratio"] >= 0.99 for r in rows) for e in budgets}
    print(
        json.dumps(
            {
                "saved_with": saved["planner_version"],
                "default_evals": search.REFINE_EVALS,
                "cases": rows,
                "cases_at_0.99_or_more": reached,
                "minimum_ratio": {e: min(r["by_evals"][e]["ratio"] for r in rows) for e in budgets},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
