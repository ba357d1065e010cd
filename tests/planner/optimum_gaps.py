"""Off-line hunt for where Drover's plan falls short of the exact optimum (not a test).

    python tests/planner/optimum_gaps.py --cases 600 --out tests/planner/optimum_gaps.json
    python tests/planner/optimum_gaps.py --first-seed 1000 --cases 800 --out /tmp/gaps.json  # unseen cases

Draws seeded random cases (tests/planner/cases.py), compares Drover with the oracle
(exhaustive.py), tells which freedom the gap comes from by re-solving with the
oracle restricted to Drover's own design space (power-of-two TP sizes, healthy GPUs
never removed), shrinks a few failures per kind to a minimal case, and writes them
as JSON for regression tests.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from exhaustive import optimum  # noqa: E402
from optimum_cases import random_case  # noqa: E402

from drover.planner.cluster import cluster_from_dict  # noqa: E402
from drover.planner.errors import PlanError, SpecError  # noqa: E402
from drover.planner.model import model_from_dict  # noqa: E402
from drover.planner.search import make_plan  # noqa: E402

POW2 = (1, 2, 4, 8)
TOLERANCE = 0.99


def judge(cd: dict, md: dict) -> dict | None:
    """The gap of one case and where it comes from; None when Drover is within 1%.

    Causes: "tp-3-or-6" when the best plan with power-of-two TP sizes is worse,
    "remove-healthy" when the best plan that keeps every rate-1 GPU is worse, and
    "heuristic" when Drover misses a plan inside both restrictions (its own space)."""
    cluster, model = cluster_from_dict(cd), model_from_dict(md)
    best_plan, best = optimum(cluster, model)
    try:
        plan = make_plan(cluster, model)
        drover = plan.predicted.samples_per_s
    except PlanError:
        plan, drover = None, 0.0
    if (best == 0) == (drover == 0) and drover >= TOLERANCE * best:
        return None
    if best == 0:
        return {"kind": "drover-plans-where-none-fits", "drover": drover, "optimum": 0.0}
    inside_plan, inside = optimum(cluster, model, tp_sizes=POW2, keep_healthy=True)
    _, pow2 = optimum(cluster, model, tp_sizes=POW2)
    _, keep = optimum(cluster, model, keep_healthy=True)
    causes = [name for name, value in (("tp-3-or-6", pow2), ("remove-healthy", keep)) if value < TOLERANCE * best]
    if drover < TOLERANCE * inside:
        causes.append("heuristic")
    kind = "+".join(causes) or "combination"
    return {
        "kind": ("no-plan: " if drover == 0 else "") + kind,
        "drover": drover,
        "optimum": best,
        "ratio": drover / best,
        "optimum_pow2_tp": pow2,
        "optimum_keeping_healthy": keep,
        "optimum_pow2_tp_keeping_healthy": inside,
        "optimum_plan": describe(best_plan, cluster),
        "optimum_plan_pow2_tp_keeping_healthy": describe(inside_plan, cluster) if inside_plan else None,
        "drover_plan": describe(plan, cluster) if plan else None,
    }


def describe(plan, cluster) -> dict:
    rates = {d.id: d.rate for d in cluster.devices}
    return {
        "pipelines": [
            {
                "micro_batches": p.micro_batches,
                "stages": [f"{'+'.join(s.devices)} {list(s.layers)}" for s in p.stages],
            }
            for p in plan.pipelines
        ],
        "removed": [f"{d} (rate {rates[d]})" for d in plan.removed],
    }


def smaller(cd: dict, md: dict):
    """Candidate simplifications of a case, most drastic first."""
    nodes = cd["nodes"]
    for i in range(len(nodes)):
        if len(nodes) > 1:
            c = copy.deepcopy(cd)
            name = c["nodes"].pop(i)["name"]
            c["rates"] = {d: r for d, r in c["rates"].items() if not d.startswith(name + "/")}
            yield c, md
    for i, n in enumerate(nodes):
        for g in (1, 2, 3, 4):
            if g < n["gpus"]:
                c = copy.deepcopy(cd)
                c["nodes"][i]["gpus"] = g
                c["rates"] = {
                    d: r
                    for d, r in c["rates"].items()
                    if not (d.startswith(n["name"] + "/") and int(d.split("/")[1]) >= g)
                }
                yield c, md
    for d in cd["rates"]:
        c = copy.deepcopy(cd)
        del c["rates"][d]
        yield c, md
    for key, values in (("layers", [1, 2, 3, 4]), ("global_batch", [1, 2, 3, 4]), ("micro_batch", [1]),
                        ("vocab", [1000]), ("seq_len", [512])):  # fmt: skip
        for v in values:
            if v < md[key]:
                m = dict(md, **{key: v})
                if key == "micro_batch":
                    m["global_batch"] = md["global_batch"] // md["micro_batch"]
                elif key == "global_batch":
                    m["global_batch"] = v * md["micro_batch"]
                yield cd, m
    if md.get("family") == "llama":
        m = {k: v for k, v in md.items() if k != "kv_heads"}
        yield cd, dict(m, family="gpt")


def shrink(cd: dict, md: dict, kind: str, budget: int = 120) -> tuple[dict, dict, dict]:
    """Greedily simplify while the same kind of gap remains."""
    verdict = judge(cd, md)
    progress = True
    while progress and budget > 0:
        progress = False
        for c, m in smaller(cd, md):
            budget -= 1
            try:
                v = judge(c, m)
            except (SpecError, ValueError):
                continue
            if v is not None and v["kind"] == kind:
                cd, md, verdict, progress = c, m, v, True
                break
            if budget <= 0:
                break
    return cd, md, verdict


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--first-seed", type=int, default=0, help="draw seeds FIRST to FIRST + CASES - 1")
    parser.add_argument("--max-gpus", type=int, default=8, help="GPUs of a case at most (the oracle slows past 8)")
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).with_name("optimum_gaps.json")))
    args = parser.parse_args()
    kinds: dict[str, list] = {}
    worst: dict[str, float] = {}
    failed = 0
    for seed in range(args.first_seed, args.first_seed + args.cases):
        cd, md = random_case(random.Random(seed).choice, args.max_gpus)
        v = judge(cd, md)
        if v is None:
            continue
        failed += 1
        kinds.setdefault(v["kind"], []).append((seed, cd, md))
        worst[v["kind"]] = min(worst.get(v["kind"], 1.0), v.get("ratio", 0.0))
        print(f"seed {seed}: {v['kind']} ratio {v.get('ratio', 0):.3f}", flush=True)
    print(f"{failed} of {args.cases} cases below {TOLERANCE} x optimum")
    out = []
    for kind, found in kinds.items():
        print(f"{kind}: {len(found)} cases, worst ratio {worst[kind]:.3f}; seeds {[s for s, *_ in found][:30]}")
        for seed, cd, md in found[: args.per_kind]:
            cd, md, v = shrink(cd, md, kind)
            out.append({"seed": seed, "cluster": cd, "model": md, **v})
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
