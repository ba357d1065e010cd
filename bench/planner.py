"""Planner benchmark: plan quality against the baselines, straggler and NIC
retention, planning time, and Drover against a reference search on generated
scenarios. Prints one JSON document.

    python bench/planner.py            # 64 and 256 GPUs, timing up to 1024, 200 generated scenarios
    python bench/planner.py --quick    # 64 GPUs only, 20 generated scenarios
    python bench/planner.py --only-generated --scenarios 50 --evals 20000 --seed 0
    python bench/planner.py --jobs 8       # the generated scenarios 8 at a time: the same figures
    python bench/planner.py --only-generated --evals 1000000000 --budget 4   # 4 s each instead (not replayable)

Straggler retention E = (thr / ideal) on the cluster with its rates, divided
by the same ratio for Drover's plan on the same cluster with every rate 1.0.

Optimum ratio = Drover's throughput / the best throughput the reference search
(bench/reference_search.py: local search from Drover's plan and the baselines,
every candidate scored by the cost model) finds within the budget. E_ref is the
reference's plan's E (same denominator as Drover's E), i.e. what is reachable:
the E targets are read where the reference reaches them (the 5th percentile of E
over the scenarios whose E_ref is at least 0.95; no E below 0.90 where E_ref is
at least 0.90).
The worst cases go to bench/gap_cases.json (scenario, both plans, what differs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from drover.planner import COMPILED_MODULES
from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import validate
from drover.planner.errors import PlanError
from drover.planner.model import load_model
from drover.planner.search import make_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from reference_search import compare, describe, reference_search, start_plans, tally  # noqa: E402
from scenarios import generate, scenario_from_dict  # noqa: E402

GAP_CASES = ROOT / "bench" / "gap_cases.json"

A100 = {"name": "A100-80G", "tflops": 312, "memory_gib": 80}
NICS = {
    "infiniband": [{"type": "infiniband", "gbps": 200, "count": 8}],
    "roce": [{"type": "roce", "gbps": 200, "count": 8}],
    "ethernet": [],
}
MODELS = {name: load_model(ROOT / "examples" / "models" / f"{name}.yaml") for name in ("gpt-3.6b", "gpt-7b", "gpt-70b")}
DEFAULT_EVALS = 20_000  # reference search budget per scenario: about 1-8 s here (2 shared cores)
# Issue 15: the planning times the planner keeps, worst shape and model, on this machine.
PLANNING_TARGET_S = {64: 0.2, 1024: 3.0}
# The planner runs on CPython's objects (compiled by Cython or not), so its times follow the
# machine's speed at a Python loop (machine_loop_s). The loop took 0.41 s on the machine where the
# targets were set; the report also gives the planning times scaled to that speed, for runs on
# slower or busier machines.
TARGETS_LOOP_S = 0.41
# Each shape's planning time is the fastest of this many plans, as the loop's is of five: on 2
# shared cores one plan's time swings by up to 15% with what else runs.
TIMING_REPEATS = 3
SEQS_PER_GPU = {"gpt-3.6b": 8, "gpt-7b": 8, "gpt-70b": 16}  # weak scaling of the global batch


def cluster_dict(gpus: int, rates: dict | None = None, second_nic: str | None = None) -> dict:
    """Nodes of 8 A100-80G on InfiniBand; with second_nic, every other node uses that instead."""
    nodes = []
    for i in range(gpus // 8):
        kind = second_nic if (second_nic and i % 2) else "infiniband"
        nodes.append({"name": f"n{i}", "nics": NICS[kind]})
    return {
        "name": f"a100-{gpus}",
        "nodes": nodes,
        "rates": rates or {},
        "defaults": {"gpus": 8, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": NICS["infiniband"]},
    }


def make_cluster(gpus: int, rates: dict | None = None, second_nic: str | None = None) -> object:
    return cluster_from_dict(cluster_dict(gpus, rates, second_nic), f"bench-{gpus}")


def timing_shapes(gpus: int) -> dict[str, tuple[dict, str | None]]:
    """The shapes planning time is judged on: (rates, second NIC) by name. Mixed networks with
    stragglers are the slowest to plan (more node sets, splits at network crossings)."""
    shapes = {name: (rates, None) for name, rates in {"healthy": {}, **straggler_shapes(gpus)}.items()}
    four = straggler_shapes(gpus)["four-mixed"]
    return shapes | {
        "infiniband+roce": ({}, "roce"),
        "infiniband+roce four-mixed": (four, "roce"),
        "infiniband+ethernet four-mixed": (four, "ethernet"),
    }


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


def fastest_plan_s(gpus: int, shape: tuple, model, repeats: int = TIMING_REPEATS) -> float:
    """The fastest of `repeats` plans of a fresh cluster of this shape (nothing carried over)."""
    return min(timed_plan(make_cluster(gpus, *shape), model)[1] for _ in range(repeats))


def timing_bench(sizes: list[int]) -> list[dict]:
    rows = []
    for gpus in sizes:
        for model_name in MODELS:
            model = model_for(model_name, gpus)
            shapes = timing_shapes(gpus)
            worst = max((fastest_plan_s(gpus, shape, model), s) for s, shape in shapes.items())
            rows.append(
                {"gpus": gpus, "model": model_name, "worst_seconds": round(worst[0], 3), "worst_shape": worst[1]}
            )
    return rows


def machine_loop_s(repeats: int = 5) -> float:
    """The fastest of `repeats` runs of a pure-Python loop (sum(i * i for i in range(10**7))):
    this machine's speed at the kind of work planning is, at its least loaded moment."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sum(i * i for i in range(10**7))
        best = min(best, time.perf_counter() - start)
    return best


def timing_report(rows: list[dict], loop_s: float) -> dict:
    """Planning times against the targets, as measured and scaled to the targets' machine speed."""
    scale = TARGETS_LOOP_S / loop_s
    rows = [row | {"worst_seconds_at_targets_speed": round(row["worst_seconds"] * scale, 3)} for row in rows]
    return {
        "planning_time": rows,
        "planning_time_targets_s": PLANNING_TARGET_S,
        "planning_time_targets_met": all(r["worst_seconds"] <= PLANNING_TARGET_S[r["gpus"]] for r in rows),
        "machine_loop_s": round(loop_s, 3),
        "targets_loop_s": TARGETS_LOOP_S,
        # The search's modules that ran compiled (scripts/build_planner_ext.py; none: pure Python).
        "planner_compiled": list(COMPILED_MODULES),
        "planning_time_targets_met_at_targets_speed": all(
            r["worst_seconds_at_targets_speed"] <= PLANNING_TARGET_S[r["gpus"]] for r in rows
        ),
    }


def distribution(values: list[float]) -> dict:
    x = np.array(values, dtype=float)
    return {
        "min": round(float(x.min()), 4),
        "p5": round(float(np.percentile(x, 5)), 4),
        "median": round(float(np.median(x)), 4),
        "mean": round(float(x.mean()), 4),
    }


def reference(cluster, model, drover_plan, budget: float | None, evals: int, seed: int):
    """The reference search's result for a cluster, starting from Drover's plan and the baselines."""
    starts = start_plans(cluster, model, drover_plan)
    return reference_search(cluster, model, evals=evals, seconds=budget, seed=seed, starts=starts)


def scenario_result(s, seed: int, budget: float | None, evals: int) -> tuple[dict, dict | None]:
    """One generated scenario: its row of the report, and its case for bench/gap_cases.json
    (None where Drover's plan is as fast as the reference's)."""
    cluster, model = s.cluster(), s.model()
    plan, seconds = timed_plan(cluster, model)
    healthy, _ = timed_plan(s.healthy_cluster(), model)
    ref = reference(cluster, model, plan, budget, evals, seed)
    q_healthy = quality(healthy)
    ratio = plan.predicted.samples_per_s / ref.plan.predicted.samples_per_s
    row = {
        "id": s.id,
        "description": s.description,
        "gpus": len(cluster.devices),
        "network": s.network,
        "damage": s.damage,
        "E": round(quality(plan) / q_healthy, 4),
        "E_ref": round(quality(ref.plan) / q_healthy, 4),
        "ratio": round(ratio, 4),
        "plan_seconds": round(seconds, 3),
        "ref_evals": ref.evals,
        "ref_seconds": round(ref.seconds, 2),
        "ref_start": ref.start,
    }
    if ratio >= 1 - 1e-9:
        return row, None
    d, r = describe(plan, cluster, model), describe(ref.plan, cluster, model)
    if ratio < 0.999:
        row["kinds"] = tally(d, r)
    gains = {k: round(v, 4) for k, v in sorted(ref.gains.items(), key=lambda kv: -kv[1]) if v > 1e-6}
    case = {
        **row,
        "moves": gains,
        "kinds": tally(d, r),
        "changes": compare(d, r),
        "drover": d,
        "reference": r,
        "scenario": s.to_dict(),
        "reference_plan": ref.plan.to_dict(),
        "reproduce": {
            "command": f"python bench/planner.py --replay {s.id}",
            "seed": seed,
            "evals": evals,
            "seconds": budget,
        },
    }
    return row, case


def _scenario_result(args: tuple) -> tuple[dict, dict | None]:
    return scenario_result(*args)


def generated_bench(
    count: int, seed: int, budget: float | None, evals: int, worst: int, log=None, jobs: int = 1
) -> dict:
    """Drover's E and Drover / reference on `count` generated scenarios, `jobs` at a time (each
    in a process of its own; the figures are the same, planning times longer)."""
    rows, cases = [], []
    started = time.perf_counter()
    work = [(s, seed, budget, evals) for s in generate(count, seed)]
    with multiprocessing.Pool(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        results = pool.imap(_scenario_result, work) if pool else map(_scenario_result, work)
        for row, case in results:
            rows.append(row)
            if case is not None:
                cases.append(case)
            if log:
                print(
                    f"[{row['id']}] {row['gpus']} GPUs E {row['E']} E_ref {row['E_ref']} ratio {row['ratio']} "
                    f"({row['ref_evals']} evals, {row['ref_seconds']:.1f}s) {row['description']}",
                    file=log,
                    flush=True,
                )
    cases.sort(key=lambda c: c["ratio"])
    kinds: dict[str, dict[str, int]] = {}  # network -> difference -> cases below 0.99
    for c in cases:
        if c["ratio"] < 0.99:
            for net in ("all", c["network"]):
                for kind in c["kinds"]:
                    kinds.setdefault(net, {})[kind] = kinds.setdefault(net, {}).get(kind, 0) + 1
    groups: dict[str, list[dict]] = {}
    for r in rows:
        for key in (f"network={r['network']}", f"damage={r['damage']}", f"gpus={r['gpus']}"):
            groups.setdefault(key, []).append(r)
    breakdown = {
        key: {
            "n": len(g),
            "ratio": distribution([r["ratio"] for r in g]),
            "E": distribution([r["E"] for r in g]),
            "E_ref": distribution([r["E_ref"] for r in g]),
        }
        for key, g in sorted(groups.items())
    }
    by_gpus: dict[int, float] = {}
    for r in rows:
        by_gpus[r["gpus"]] = max(by_gpus.get(r["gpus"], 0.0), r["plan_seconds"])
    moves: dict[str, int] = {}
    for c in cases:
        for kind in c["moves"]:
            kind = kind.removeprefix("kick:")
            moves[kind] = moves.get(kind, 0) + 1
    E = [r["E"] for r in rows]
    E_ref = [r["E_ref"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    reachable_090 = [r["id"] for r in rows if r["E"] < 0.90 <= r["E_ref"]]
    reachable_095 = [r["id"] for r in rows if r["E"] < 0.95 <= r["E_ref"]]
    p5_E, p5_ref = distribution(E)["p5"], distribution(E_ref)["p5"]
    # Where the reference reaches E 0.95, Drover's E: the 5th-percentile target is read on these,
    # as the minimum's is on those where it reaches 0.90. (The reference climbs from Drover's
    # plan, so its E is never lower: over all scenarios Drover's p5 can only match the reference's.)
    reachable = [r["E"] for r in rows if r["E_ref"] >= 0.95]
    reached = distribution(reachable) if reachable else {}
    return {
        "scenarios": len(rows),
        "seed": seed,
        "budget": {"seconds": budget, "evals": evals},
        "seconds": round(time.perf_counter() - started, 1),
        "jobs": jobs,  # past 1, plan_seconds were measured beside other scenarios' searches
        "E": distribution(E),
        "E_ref": distribution(E_ref),
        "drover_over_reference": distribution(ratios),
        "below_0.99": sum(x < 0.99 for x in ratios),
        "below_0.999": sum(x < 0.999 for x in ratios),
        "reachable_E_0.90_missed": reachable_090,
        "reachable_E_0.95_missed": len(reachable_095),
        "E_where_0.95_reachable": {"scenarios": len(reachable), **reached},
        "targets": {
            "ratio_min_ge_0.99": min(ratios) >= 0.99,
            "E_p5_ge_0.95_where_reachable": reached.get("p5", 0.0) >= 0.95,
            "E_p5_ge_reference_p5_overall": p5_E >= min(0.95, p5_ref),
            "E_min_ge_0.90_where_reachable": not reachable_090,
        },
        "improving_moves": dict(sorted(moves.items(), key=lambda kv: -kv[1])),
        "differences_where_below_0.99": {
            net: dict(sorted(k.items(), key=lambda kv: -kv[1])) for net, k in sorted(kinds.items())
        },
        "breakdown": breakdown,
        "plan_seconds_max_by_gpus": dict(sorted(by_gpus.items())),
        "worst": [
            {k: c[k] for k in ("id", "description", "E", "E_ref", "ratio", "moves", "kinds", "changes")}
            for c in cases[:worst]
        ],
        "rows": rows,
        "_cases": saved_cases(cases),
    }


def saved_cases(cases: list[dict]) -> list[dict]:
    """For bench/gap_cases.json: the 20 worst, and the 8 worst on all-InfiniBand clusters."""
    out = cases[:20]
    ib = [c for c in cases[20:] if "all InfiniBand" in c["description"]]
    return out + ib[:8]


def nic_reference_bench(sizes: list[int], budget: float | None, evals: int, seed: int) -> list[dict]:
    """IB+RoCE retention against all-IB for Drover and for the reference search, same pairs."""
    rows = []
    for gpus in sizes:
        for model_name in MODELS:
            model = model_for(model_name, gpus)
            pair = {}
            for label, cluster in (("ib", make_cluster(gpus)), ("mixed", make_cluster(gpus, second_nic="roce"))):
                plan, _ = timed_plan(cluster, model)
                ref = reference(cluster, model, plan, budget, evals, seed)
                pair[label] = (plan.predicted.samples_per_s, ref.plan.predicted.samples_per_s)
            (d_ib, r_ib), (d_mix, r_mix) = pair["ib"], pair["mixed"]
            rows.append(
                {
                    "gpus": gpus,
                    "model": model_name,
                    "drover_retention": round(d_mix / d_ib, 4),
                    "reference_retention": round(r_mix / r_ib, 4),
                    "mixed_drover_over_reference": round(d_mix / r_mix, 4),
                    "ib_drover_over_reference": round(d_ib / r_ib, 4),
                }
            )
    return rows


def planner_version() -> str:
    """The commit the planner was measured at (with '+dirty' for uncommitted changes under planner/)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "planner"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


def replay(case_id: int) -> dict:
    """Drover and the reference search again on a case of bench/gap_cases.json."""
    saved = json.loads(GAP_CASES.read_text())
    case = next(c for c in saved["cases"] if c["id"] == case_id)
    s = scenario_from_dict(case["scenario"])
    cluster, model = s.cluster(), s.model()
    plan, _ = timed_plan(cluster, model)
    how = case["reproduce"]
    ref = reference(cluster, model, plan, how["seconds"], how["evals"], how["seed"])
    d, r = describe(plan, cluster, model), describe(ref.plan, cluster, model)
    return {
        "description": s.description,
        "ratio": round(plan.predicted.samples_per_s / ref.plan.predicted.samples_per_s, 4),
        "saved_ratio": case["ratio"],
        "changes": compare(d, r),
        "moves": {k: round(v, 4) for k, v in ref.gains.items()},
        "drover": d,
        "reference": r,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 GPUs only, 20 generated scenarios")
    parser.add_argument("--scenarios", type=int, default=None, help="generated scenarios (default 200, quick 20)")
    parser.add_argument(
        "--evals",
        type=int,
        default=DEFAULT_EVALS,
        help=f"reference search budget per scenario, in evaluated plans (deterministic; default {DEFAULT_EVALS})",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="also stop each reference search after this many seconds"
    )
    parser.add_argument("--seed", type=int, default=0, help="scenario stream and search seed")
    parser.add_argument("--worst", type=int, default=8, help="worst scenarios listed in the report")
    parser.add_argument("--only-generated", action="store_true", help="skip the hand-picked sections")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/gap_cases.json")
    parser.add_argument("--progress", action="store_true", help="one line per generated scenario on stderr")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="generated scenarios run at once, each in a process (same figures; their planning times longer)",
    )
    parser.add_argument("--replay", type=int, metavar="ID", help="rerun one case of bench/gap_cases.json")
    args = parser.parse_args()
    if args.replay is not None:
        print(json.dumps(replay(args.replay), indent=1))
        return
    count = args.scenarios if args.scenarios is not None else (20 if args.quick else 200)
    budget, evals = args.budget, args.evals
    sizes = [64] if args.quick else [64, 256]
    timing_sizes = [64] if args.quick else [64, 1024]
    report = {"planner_version": planner_version()}
    if not args.only_generated:
        stragglers = straggler_bench(sizes)
        nic = nic_bench(sizes)
        loop_before = machine_loop_s()
        timing = timing_bench(timing_sizes)
        loop_s = min(loop_before, machine_loop_s())  # around the timings: the machine at its fastest
        nic_ref = nic_reference_bench(sizes, budget, evals, args.seed)
        report |= {
            "straggler_retention": stragglers,
            "nic_retention": nic,
            "min_ib_roce_retention": min(r["retention_vs_all_ib"] for r in nic if r["mix"] == "infiniband+roce"),
            "ib_roce_retention_vs_reference": nic_ref,
        } | timing_report(timing, loop_s)
    if count:
        progress = sys.stderr if args.progress else None
        generated = generated_bench(count, args.seed, budget, evals, args.worst, progress, args.jobs)
        cases = generated.pop("_cases")
        if not (args.no_save or args.quick):  # a quick run must not replace the full run's cases
            saved = {"planner_version": report["planner_version"], "budget": generated["budget"], "cases": cases}
            GAP_CASES.write_text(json.dumps(saved, indent=1) + "\n")
        report["generated"] = generated
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
