"""The report page on its own, drawn in headless Chromium from made-up data: a long run is
thinned, odd values do not break it, and an empty job still draws a page."""

from __future__ import annotations

import math

from drover.cli.report import MAX_POINTS, render, thin

from support import rendered

DEVICES = ["n0/0", "n0/1", "n1/0", "n1/1"]


def job_data(steps: int, events: list[dict], plans: list[dict]) -> dict:
    history = [
        {
            "step": s,
            "time": float(s),
            "loss": 5.0 - s / steps,
            "lr": 0.003,
            "samples_per_s": 100.0,
            "plan_version": 1,
            "rates": {d: (3.0 if d == "n1/0" and s == steps // 2 else 1.0) for d in DEVICES},
        }
        for s in range(steps)
    ]
    job = {"id": "job-1", "model_name": "tiny", "state": "JOB_STATE_COMPLETED", "steps": steps, "step": steps - 1}
    return {"job": job, "events": events, "plans": plans, "history": history, "marked": {"plan_pushed": "#000"}}


def test_a_long_run_is_thinned_and_a_one_step_straggle_still_shows(tmp_path, chromium):
    steps = 100_000
    plan = {
        "version": 1,
        "committed": True,
        "plan": {
            "pipelines": [{"micro_batches": 8, "stages": [{"devices": DEVICES, "layers": [0, 4]}]}],
            "removed": [],
        },
    }
    events = [{"step": 70_000, "kind": "plan_pushed", "plan_version": 2, "gain": math.nan}]  # NaN in details
    page = tmp_path / "report.html"
    page.write_text(render(job_data(steps, events, [plan])))
    elements, console = rendered(chromium, page)
    assert console == [] and ("body", {"data-drawn": "true"}) in elements
    series = [int(a["data-points"]) for _, a in elements if a.get("class") == "series"]
    assert series and max(series) <= MAX_POINTS
    cells = [a for _, a in elements if a.get("class") == "cell" and a["data-device"] == "n1/0"]
    assert max(float(a["data-rate"]) for a in cells) == 3.0  # the worst of its run
    right = max(float(a["x"]) + float(a["width"]) for _, a in elements if a.get("class") == "cell")
    assert right <= 900  # the whole run inside the chart's width
    assert [(a["data-kind"], a["data-step"]) for _, a in elements if a.get("class") == "marker"] == [
        ("plan_pushed", "70000")
    ]


def test_a_job_with_nothing_yet_draws_a_page_saying_so(tmp_path, chromium):
    page = tmp_path / "report.html"
    page.write_text(render({**job_data(0, [], []), "history": []}))
    elements, console = rendered(chromium, page)
    assert console == [] and ("body", {"data-drawn": "true"}) in elements
    assert [a for t, a in elements if t == "svg"] == []
    assert len([a for t, a in elements if t == "p" and a.get("class") == "empty"]) == 4


def test_thin_keeps_short_runs_whole_and_means_long_ones():
    short = job_data(10, [], [])["history"]
    assert thin(short, 20) == short
    long = thin(job_data(1000, [], [])["history"], 100)
    assert len(long) == 100 and long[-1]["step"] == 990 and long[0]["samples_per_s"] == 100.0
