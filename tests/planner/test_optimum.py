"""Drover's plan measured against the exact optimum of the cost model.

On small random clusters and models, an exhaustive oracle (exhaustive.py) finds the
best valid plan; Drover's must reach 99% of its samples/s, and both must agree on
whether any plan fits at all. The oracle itself is checked first: against a
brute force that literally builds every Plan, and with its bounds asserted
rather than used to cut. Cases that failed before are in optimum_gaps.json
(optimum_gaps.py regenerates it).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from exhaustive import optimum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimum_cases import random_case

from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import evaluate, validate
from drover.planner.errors import PlanError
from drover.planner.model import model_from_dict
from drover.planner.plan import Pipeline, Plan, Stage
from drover.planner.search import make_plan

TOLERANCE = 0.99  # the target: within 1% of the optimum
FLOOR = 0.8  # what no case may fall below
RANDOM_CASES = 200
GAPS = Path(__file__).with_name("optimum_gaps.json")


def tiny_case(seed: int, gpus: int, layers: int, micro_batches: int):
    """A seeded random case small enough to check by brute force."""
    cd, md = random_case(random.Random(seed).choice, max_gpus=gpus)
    md["layers"] = min(md["layers"], layers)
    md["global_batch"] = md["micro_batch"] * min(md["global_batch"] // md["micro_batch"], micro_batches)
    return cluster_from_dict(cd), model_from_dict(md)


def set_partitions(items: list):
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[head], *part]
        for i in range(len(part)):
            yield [*part[:i], [head, *part[i]], *part[i + 1 :]]


def splits(total: int, parts: int):
    """Every split of range(total) into `parts` non-empty consecutive ranges."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [(bounds[i], bounds[i + 1]) for i in range(parts)]


def brute_force(cluster, model) -> float:
    """Best samples/s over literally every Plan of the cluster, judged by validate and
    evaluate alone (0.0 if none is valid): no reduction, no bound."""
    usable, L, M = cluster.usable, model.layers, model.micro_batches
    best = 0.0
    for mask in itertools.product([False, True], repeat=len(usable)):
        used = [d.id for d, u in zip(usable, mask) if u]
        removed = tuple(d.id for d, u in zip(usable, mask) if not u)
        for groups in set_partitions(used) if used else []:
            for part in set_partitions(groups):  # pipelines: groups in some order
                for pipes in itertools.product(*(itertools.permutations(p) for p in part)):
                    if len(pipes) > M:
                        continue
                    for layers in itertools.product(*(splits(L, len(p)) for p in pipes)):
                        for micro in splits(M, len(pipes)):
                            pipelines = tuple(
                                Pipeline(hi - lo, tuple(Stage(tuple(g), r) for g, r in zip(p, rs)))
                                for p, rs, (lo, hi) in zip(pipes, layers, micro)
                            )
                            plan = Plan("brute", model.global_batch, model.micro_batch, pipelines, removed)
                            try:
                                validate(plan, cluster, model)
                            except PlanError:
                                continue
                            best = max(best, evaluate(plan, cluster, model).samples_per_s)
    return best


def check_plan(plan, value, cluster, model):
    """The oracle's plan is valid and its figure is evaluate's."""
    if plan is None:
        assert value == 0.0
        return
    validate(plan, cluster, model)
    assert value == evaluate(plan, cluster, model).samples_per_s
    assert value <= plan.predicted.ideal_samples_per_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_oracle_matches_brute_force(seed):
    cluster, model = tiny_case(seed, gpus=4, layers=3, micro_batches=3)
    plan, value = optimum(cluster, model)
    check_plan(plan, value, cluster, model)
    assert value == pytest.approx(brute_force(cluster, model), rel=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_oracle_bounds_never_cut_a_better_plan(seed):
    """With nothing cut, every bound the search uses is below every plan it covers."""
    cluster, model = tiny_case(1000 + seed, gpus=5, layers=4, micro_batches=4)
    checked = optimum(cluster, model, check_bounds=True)
    plan, value = optimum(cluster, model)
    check_plan(plan, value, cluster, model)
    assert value == pytest.approx(checked[1], rel=1e-9)


def test_recorded_gaps_keep_their_optimum():
    """optimum_gaps.json's figures still hold, so its cases stay meaningful as regressions."""
    for case in json.loads(GAPS.read_text()):
        cluster, model = cluster_from_dict(case["cluster"]), model_from_dict(case["model"])
        plan, value = optimum(cluster, model)
        check_plan(plan, value, cluster, model)
        assert value == pytest.approx(case["optimum"], rel=1e-9)


def drover_and_optimum(cd: dict, md: dict) -> tuple[float, float, str]:
    """Drover's samples/s (0.0: no plan) and the optimum's (0.0: none fits), and the case."""
    cluster, model = cluster_from_dict(cd), model_from_dict(md)
    best_plan, best = optimum(cluster, model)
    try:
        drover = make_plan(cluster, model).predicted.samples_per_s
    except PlanError:
        drover = 0.0
    where = f"cluster={json.dumps(cd)} model={json.dumps(md)}"
    if best_plan is not None:
        where += f"; optimum plan {json.dumps(best_plan.to_dict()['pipelines'])} removed {list(best_plan.removed)}"
    return drover, best, where


def test_every_recorded_gap_is_closed():
    """The shrunk cases where Drover once fell short (optimum_gaps.json): within 1% now."""
    for case in json.loads(GAPS.read_text()):
        drover, best, where = drover_and_optimum(case["cluster"], case["model"])
        assert drover >= TOLERANCE * best, f"{case['pattern']}: {drover / best:.3f} of the optimum: {where}"


def test_drover_within_one_percent_of_optimum_on_nearly_every_random_case():
    """Seeded random cases: Drover within 1% of the optimum on at least 97% of them (measured:
    1 miss in 189, at 0.92), and no miss below 0.8. The misses need two or more
    edits of local search at once (see the closing note of issue 15)."""
    ratios = []
    for seed in range(RANDOM_CASES):
        drover, best, where = drover_and_optimum(*random_case(random.Random(seed).choice))
        if best:
            ratios.append((drover / best, seed, where))
    misses = [r for r in ratios if r[0] < TOLERANCE]
    assert len(misses) <= 0.03 * len(ratios), [f"seed {s}: {r:.3f}" for r, s, _ in misses]
    worst = min(ratios)
    assert worst[0] >= FLOOR, f"seed {worst[1]}: {worst[0]:.3f} of the optimum: {worst[2]}"


@st.composite
def small_cases(draw):
    """1-4 nodes of up to 8 GPUs in all, mixed GPU types, NICs and straggling rates."""
    return random_case(lambda options: draw(st.sampled_from(options)))


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(small_cases())
def test_drover_finds_a_plan_exactly_when_one_exists_and_never_far_below_the_optimum(case):
    drover, best, where = drover_and_optimum(*case)
    assert (drover > 0) == (best > 0), f"Drover {drover:.4g}, optimum {best:.4g}: {where}"
    assert drover <= best * (1 + 1e-9), f"Drover beats the exhaustive optimum: {where}"  # the oracle's own check
    assert drover >= FLOOR * best, f"Drover {drover:.4g} samples/s is {drover / best:.3f} of the optimum: {where}"
