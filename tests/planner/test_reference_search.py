"""The benchmark's reference search (bench/reference_search.py): its plans are
valid, never slower than where it starts, the same for the same seed, and its
incremental scores are the cost model's."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import evaluate, validate
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import reference_search as rs  # noqa: E402

A100 = {"name": "A100-80G", "tflops": 312, "memory_gib": 80}
IB = [{"type": "infiniband", "gbps": 200, "count": 8}]
ROCE = [{"type": "roce", "gbps": 200, "count": 8}]


def cluster(nics: list[list], rates: dict):
    return cluster_from_dict(
        {
            "name": "ref-test",
            "defaults": {"gpus": 8, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": IB},
            "nodes": [{"name": f"n{i}", "nics": n} for i, n in enumerate(nics)],
            "rates": rates,
        }
    )


MODEL = model_from_dict(
    {
        "name": "gpt-1b-24h",  # 24 heads: TP 1, 2, 3, 4, 6 and 8 are valid
        "layers": 16,
        "hidden": 1536,
        "heads": 24,
        "seq_len": 2048,
        "vocab": 32000,
        "global_batch": 128,
        "micro_batch": 1,
    }
)
STRAGGLERS = {"n1/3": 3.0, "n2/5": 1.4, "n0/0": "inf"}


def test_improves_uniform_baseline_validly_and_deterministically():
    c = cluster([IB] * 4, STRAGGLERS)
    start = make_plan(c, MODEL, "uniform")
    runs = [rs.reference_search(c, MODEL, evals=400, seed=3, starts={"uniform": start}) for _ in range(2)]
    plan = runs[0].plan
    validate(plan, c, MODEL)
    assert plan.predicted.samples_per_s == evaluate(plan, c, MODEL).samples_per_s
    assert plan.predicted.samples_per_s > start.predicted.samples_per_s
    assert runs[0].start == "uniform" and runs[0].evals == 400
    assert plan.to_dict() == runs[1].plan.to_dict()
    assert "n0/0" not in plan.devices + list(plan.removed)


def test_never_worse_than_drovers_plan():
    c = cluster([IB] * 4, STRAGGLERS)
    drover = make_plan(c, MODEL)
    result = rs.reference_search(c, MODEL, evals=300, seed=0, starts=rs.start_plans(c, MODEL, drover))
    assert result.plan.predicted.samples_per_s >= drover.predicted.samples_per_s * (1 - 1e-12)


@pytest.mark.parametrize("nics", [[IB] * 4, [IB, ROCE, [], IB]], ids=["infiniband", "ib-roce-ethernet"])
def test_incremental_score_is_the_cost_model(nics):
    """A random walk of every kind of move: each state's step time is evaluate's, and valid."""
    c = cluster(nics, STRAGGLERS)
    sp = rs.Space(c, MODEL)
    st = rs.state_from_plan(sp, make_plan(c, MODEL))
    moves = rs.Moves(sp, random.Random(7))
    kinds = set()
    for _ in range(400):
        change = moves.propose(st)
        if change is None or st.evaluate(change) is None:
            continue
        st.evaluate(change, commit=True)
        kinds.add(change.kind)
        plan = st.to_plan(MODEL)
        validate(plan, c, MODEL)
        assert st.step == pytest.approx(evaluate(plan, c, MODEL).step_time_s, rel=1e-9)
    assert len(kinds) >= 8, kinds


def test_partition_is_optimal_for_its_pipeline():
    """The exact block split: no other split of a small pipeline is faster."""
    import itertools

    c = cluster([IB] * 4, STRAGGLERS)
    sp = rs.Space(c, MODEL)
    groups = (sp.group(["n1/0", "n1/1"]), sp.group(["n1/3"]), sp.group(["n2/0", "n2/1", "n2/2", "n2/3"]))
    m = 20
    best = sp.partition(groups, m)

    def time_of(bounds):
        first, each, cap = sp.info(rs.Pipe(groups, bounds))
        return first + (m - 1) * each if m <= cap else float("inf")

    L = MODEL.layers
    every = [(0, a, b, L) for a, b in itertools.combinations(range(1, L), 2)]
    assert time_of(best) <= min(time_of(b) for b in every) * (1 + 1e-9)
