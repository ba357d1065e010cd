"""Planner benchmark: plan quality against the baselines, straggler and NIC
retention, and planning time. Prints one JSON document.

    python bench/planner.py            # 64 and 256 GPUs, timing up to 1024
    python bench/planner.py --quick    # 64 GPUs only

Straggler retention E = (thr / ideal) on the cluster with its rates, divided
by the same ratio for Drover's plan on the same cluster with every rate 1.0.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import validate
from drover.planner.errors import PlanError
from drover.planner.model import load_model
from drover.planner.search import make_plan

ROOT = Path(__file__).resolve().parents[1]

A100 = {"name": "A100-80G", "tflops": 312, "memory_gib": 80}
NICS = {
    "infiniband": [{"type": "infiniband", "gbps": 200, "count": 8}],
    "roce": [{"type": "roce", "gbps": 200, "count": 8}],
    "ethernet": [],
}
MODELS = {name: load_model(ROOT / "examples" / "models" / f"{name}.yaml") for name in ("gpt-3.6b", "gpt-7b", "gpt-70b")}
SEQS_PER_GPU = {"gpt-3.6b": 8, "gpt-7b": 8, "gpt-70b": 16}  # weak scaling of the global batch


def make_cluster(gpus: int, rates: dict | None = None, second_nic: str | None = None) -> object:
    """Nodes of 8 A100-80G on InfiniBand; with second_nic, every other node uses that instead."""
    nodes = []
    for i in range(gpus // 8):
        kind = second_nic if (second_nic and i % 2) else "infiniband"
        nodes.append({"name": f"n{i}", "nics": NICS[kind]})
    data = {
        "name": f"a100-{gpus}",
        "nodes": nodes,
        "rates": rates or {},
        "defaults": {"gpus": 8, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": NICS["infiniband"]},
    }
    return cluster_from_dict(data, f"bench-{gpus}")


def model_for(name: str, gpus: int):
    return replace(MODELS[name], global_batch=SEQS_PER_GPU[name] * gpus)


def straggler_shapes(gpus: int) -> dict[str, dict]:
    nodes = gpus // 8
    spread = [f"n{(i * nodes) // 8}/{i % 8}" for i in range(8)]
    return {
        "one-1.5x": {"n1/3": 1.5},
        "one-3x": {"n1/3": 3.0},
        "one-12x": {"n1/3": 12.0},
        "two-4x-same-node": {"n2/1": 4.0, "n2/6": 4.0},
        "four-mixed": {"n0/1": 1.5, "n1/2": 3.0, "n2/3": 6.0, "n3/4": 12.0},
        "eight-mixed": {d: r for d, r in zip(spread, (1.5, 2, 3, 4, 5, 6, 8, 12))},
        "failed-gpu": {"n1/5": "inf"},
        "slow-node-2x": {f"n{nodes - 1}/{j}": 2.0 for j in range(8)},
    }


def quality(plan) -> float:
    return plan.predicted.samples_per_s / plan.predicted.ideal_samples_per_s


def baseline_samples_per_s(cluster, model, strategy) -> float:
    """0 when the baseline has no plan (drop, when every node holds a straggler)."""
    try:
        return make_plan(cluster, model, strategy).predicted.samples_per_s
    except PlanError:
        return 0.0


def timed_plan(cluster, model, strategy="drover"):
    start = time.perf_counter()
    plan = make_plan(cluster, model, strategy)
    elapsed = time.perf_counter() - start
    validate(plan, cluster, model)
    return plan, elapsed


def straggler_bench(sizes: list[int]) -> dict:
    rows = []
    for gpus in sizes:
        for model_name in MODELS:
            model = model_for(model_name, gpus)
            healthy_plan, _ = timed_plan(make_cluster(gpus), model)
            for shape, rates in straggler_shapes(gpus).items():
                cluster = make_cluster(gpus, rates)
                plan, seconds = timed_plan(cluster, model)
                thr = plan.predicted.samples_per_s
                uni = baseline_samples_per_s(cluster, model, "uniform")
                drp = baseline_samples_per_s(cluster, model, "drop")
                rows.append(
                    {
                        "gpus": gpus,
                        "model": model_name,
                        "shape": shape,
                        "E": round(quality(plan) / quality(healthy_plan), 4),
                        "samples_per_s": round(thr, 3),
                        "uniform": round(uni, 3),
                        "drop": round(drp, 3),
                        "vs_uniform": round(thr / uni, 3) if uni else None,
                        "vs_drop": round(thr / drp, 3) if drp else None,
                        "plan_seconds": round(seconds, 3),
                        "pipelines": len(plan.pipelines),
                        "removed": len(plan.removed),
                    }
                )
    return {
        "scenarios": rows,
        "min_E": min(r["E"] for r in rows),
        "never_worse_than_baselines": all(
            r["samples_per_s"] >= max(r["uniform"], r["drop"]) * (1 - 1e-9) for r in rows
        ),
    }


def nic_bench(sizes: list[int]) -> list[dict]:
    rows = []
    for gpus in sizes:
        for model_name in MODELS:
            model = model_for(model_name, gpus)
            all_ib, _ = timed_plan(make_cluster(gpus), model)
            for second in ("roce", "ethernet"):
                cluster = make_cluster(gpus, second_nic=second)
                plan, seconds = timed_plan(cluster, model)
                uni = baseline_samples_per_s(cluster, model, "uniform")
                rows.append(
                    {
                        "gpus": gpus,
                        "model": model_name,
                        "mix": f"infiniband+{second}",
                        "retention_vs_all_ib": round(plan.predicted.samples_per_s / all_ib.predicted.samples_per_s, 4),
                        "vs_uniform": round(plan.predicted.samples_per_s / uni, 3),
                        "plan_seconds": round(seconds, 3),
                    }
                )
    return rows


def timing_bench(sizes: list[int]) -> list[dict]:
    rows = []
    for gpus in sizes:
        for model_name in MODELS:
            model = model_for(model_name, gpus)
            shapes = {"healthy": {}, **straggler_shapes(gpus)}
            worst = max((timed_plan(make_cluster(gpus, r), model)[1], s) for s, r in shapes.items())
            mixed = timed_plan(make_cluster(gpus, second_nic="roce"), model)[1]
            rows.append(
                {
                    "gpus": gpus,
                    "model": model_name,
                    "worst_seconds": round(max(worst[0], mixed), 3),
                    "worst_shape": worst[1] if worst[0] >= mixed else "infiniband+roce",
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 GPUs only")
    args = parser.parse_args()
    sizes = [64] if args.quick else [64, 256]
    timing_sizes = [64] if args.quick else [64, 1024]
    stragglers = straggler_bench(sizes)
    nic = nic_bench(sizes)
    timing = timing_bench(timing_sizes)
    limits = {64: 1.0, 1024: 10.0}
    report = {
        "straggler_retention": stragglers,
        "nic_retention": nic,
        "min_ib_roce_retention": min(r["retention_vs_all_ib"] for r in nic if r["mix"] == "infiniband+roce"),
        "planning_time": timing,
        "planning_time_within_limits": all(r["worst_seconds"] <= limits[r["gpus"]] for r in timing),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
