"""Readable tables for the terminal."""

from __future__ import annotations

from drover.planner.cluster import Cluster
from drover.planner.cost import evaluate
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan


def compact_devices(ids: list[str] | tuple[str, ...]) -> str:
    """node-0/0 node-0/1 node-0/2 -> node-0/0-2 (devices of a stage share a node)."""
    by_node: dict[str, list[int]] = {}
    for d in ids:
        node, index = d.rsplit("/", 1)
        by_node.setdefault(node, []).append(int(index))
    parts = []
    for node, indices in by_node.items():
        indices.sort()
        runs, start = [], indices[0]
        for prev, cur in zip(indices, indices[1:] + [None], strict=True):
            if cur != prev + 1:
                runs.append(str(start) if start == prev else f"{start}-{prev}")
                start = cur
        parts.append(f"{node}/{','.join(runs)}")
    return " ".join(parts)


def progress_line(progress, steps: int) -> str:
    """step 12/30  loss 4.1234  lr 3.00e-03  1,234 tok/s  val 4.5678@10 (a Progress message)."""
    line = (
        f"step {progress.step + 1}/{steps}  loss {progress.loss:.4f}  lr {progress.lr:.2e}  "
        f"{progress.tokens_per_s:,.0f} tok/s"
    )
    if progress.HasField("val_loss"):
        line += f"  val {progress.val_loss:.4f}@{progress.val_step}"
    return line


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def render_plan(plan: Plan, cluster: Cluster, model: ModelSpec) -> str:
    breakdown = evaluate(plan, cluster, model)
    devices = cluster.device_by_id
    rows = []
    for i, (p, t_p) in enumerate(zip(plan.pipelines, breakdown.pipeline_times_s, strict=True)):
        for k, s in enumerate(p.stages):
            slowest = max(devices[d].rate for d in s.devices)
            rows.append(
                [
                    i if k == 0 else "",
                    p.micro_batches if k == 0 else "",
                    k,
                    compact_devices(s.devices),
                    len(s.devices),
                    f"{s.layers[0]}-{s.layers[1]}",
                    s.n,
                    f"{slowest:g}" if slowest != 1.0 else "",
                    f"{t_p:.4g}" if k == 0 else "",
                ]
            )
    pred = plan.predicted
    lines = [
        f"plan: strategy {plan.strategy}, cluster {cluster.name}, model {model.name} "
        f"(L={model.layers}, B={model.global_batch}, M={model.micro_batches})",
        "",
        table(["pipeline", "micro", "stage", "devices", "tp", "blocks", "n", "rate", "T_p (s)"], rows),
        "",
        f"removed: {compact_devices(plan.removed) if plan.removed else 'none'}",
        # Four significant figures: a small model's steps take milliseconds.
        f"step time: {breakdown.step_time_s:.4g} s (slowest pipeline {max(breakdown.pipeline_times_s):.4g} s "
        f"+ gradient sync {breakdown.dp_sync_time_s:.4g} s)",
    ]
    if pred is not None:
        lines.append(
            f"predicted: {pred.samples_per_s:.2f} samples/s; ideal {pred.ideal_samples_per_s:.2f} "
            f"samples/s ({pred.samples_per_s / pred.ideal_samples_per_s:.1%} of ideal)"
        )
    return "\n".join(lines)


def render_simulation(runs) -> str:
    rows = [
        [r.strategy, f"{r.trained_steps}/{r.steps}", f"{r.total_s:.1f}", f"{r.samples_per_s:.2f}", r.replans]
        + [f"{r.migration_s:.1f}"]
        for r in runs
    ]
    lines = [table(["strategy", "steps", "total (s)", "samples/s", "replans", "migrating (s)"], rows)]
    for r in runs:
        lines += ["", f"{r.strategy}:"]
        lines += [f"  step {e.step:>6}  {_seconds_per_step(e.step_time_s)}  {e.event}" for e in r.timeline]
    return "\n".join(lines)


def _seconds_per_step(seconds: float | None) -> str:
    return f"{'stopped':>15}" if seconds is None else f"{seconds:>8.4g} s/step"
