"""`drover report JOB --out FILE.html`: a run's story as one self-contained page.

What the control plane keeps of the job (its events, every plan version,
and its history: progress and each device's straggling rate at each
progress report) is fetched once, embedded in the page as JSON, and drawn
by a small script in the page as SVG: samples/s over steps with the
detections, pushes, commits and migrations marked; each device's rate over
steps as a heat map; the loss curve; the plans side by side, each device's
role per version. Nothing is loaded from elsewhere, so the file can be
mailed or attached to a ticket.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import click

from .client import connect, to_dict
from .options import control_plane_option

# Events drawn on the throughput chart, with their colours.
MARKED = {
    "straggler_detected": "#d62728",
    "slow_link_suspected": "#ff7f0e",
    "plan_pushed": "#9467bd",
    "plan_committed": "#2ca02c",
    "migration_done": "#1f77b4",
    "node_lost": "#000000",
    "recovered": "#17becf",
    "node_joined": "#8c564b",
}


def gather(client, job_id: str) -> dict:
    """Everything the page shows, as plain data (`client`: a drover.client.Client)."""
    job = to_dict(client.get(job_id))
    events = [{"step": e.step, "time": e.time, "kind": e.kind, **e.details} for e in client.events(job_id)]
    plans = [to_dict(p) for p in client.plans(job_id)]
    history = [to_dict(p) for p in client.history(job_id)]
    return {"job": job, "events": events, "plans": plans, "history": history, "marked": MARKED}


MAX_POINTS = 2000  # history points drawn; a longer run is thinned to about this many


def thin(history: list[dict], limit: int = MAX_POINTS) -> list[dict]:
    """At most about `limit` points: one per run of consecutive ones, at the run's first step,
    with its mean samples/s and loss and each device's worst rate (a short straggle still shows)."""
    size = -(-len(history) // limit) if history else 1
    if size <= 1:
        return history
    out = []
    for start in range(0, len(history), size):
        run = history[start : start + size]
        point = dict(run[-1], step=run[0]["step"])  # drawn from where its run starts
        for key in ("samples_per_s", "loss"):
            values = [p[key] for p in run if isinstance(p.get(key), (int, float))]
            if values:
                point[key] = sum(values) / len(values)
        rates: dict[str, float] = {}
        for p in run:
            for device, rate in p.get("rates", {}).items():
                rates[device] = max(rate, rates.get(device, rate))
        point["rates"] = rates
        out.append(point)
    return out


def finite(value):
    """The data with every NaN or infinity as null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def render(data: dict) -> str:
    """The page: the data as JSON in a script element, drawn by DRAW."""
    job = data["job"]
    shown = finite({**data, "history": thin(data["history"])})
    embedded = json.dumps(shown, allow_nan=False).replace("</", "<\\/")  # nothing can close the script element
    title = f"Drover report: {job['id']}"
    facts = [
        ("model", job.get("model_name", "")),
        ("state", str(job.get("state", "")).removeprefix("JOB_STATE_").lower()),
        ("steps", f"{job.get('step', -1) + 1} of {job.get('steps', 0)}"),
        ("plan versions", str(len(data["plans"]))),
        ("detail", job.get("detail", "") or "-"),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    legend = "".join(
        f'<span class="key"><i style="background:{colour}"></i>{html.escape(kind)}</span>'
        for kind, colour in MARKED.items()
    )
    return PAGE.format(title=html.escape(title), facts=rows, legend=legend, data=embedded, style=STYLE, draw=DRAW)


def write_report(client, job_id: str, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(gather(client, job_id)))
    return path


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>
<body>
<h1>{title}</h1>
<table class="facts">{facts}</table>
<h2>Samples per second</h2><div class="legend">{legend}</div><div id="throughput"></div>
<h2>Straggling rate per device</h2><div id="heatmap"></div>
<h2>Loss</h2><div id="loss"></div>
<h2>Plans</h2><div id="plans"></div>
<script id="data" type="application/json">{data}</script>
<script>{draw}</script>
</body></html>
"""

HERE = Path(__file__).parent
STYLE = (HERE / "report.css").read_text()
DRAW = (HERE / "report.js").read_text()


@click.command("report")
@click.argument("job_id")
@click.option("--out", "out", default="report.html", show_default=True, help="The HTML file to write.")
@control_plane_option
def report(job_id: str, out: str, address) -> None:
    """Write a job's report as one self-contained HTML page: samples/s over steps with the
    detections, plan pushes, commits and migrations marked, each device's straggling rate as a
    heat map, the loss curve, and the plans side by side."""
    click.echo(write_report(connect(address), job_id, out))
