"""The planner's local search over whole plans (planner/walk*.py): its incremental scores are
the cost model's, its block split is exact, and the planner's closing descent (walk.refine)
returns a valid plan no slower than where it starts, the same each time."""

from __future__ import annotations

import itertools
import random

import pytest

from drover.planner.candidate import Candidate
from drover.planner.cluster import cluster_from_dict
from drover.planner.cost import evaluate, stage_costs, validate
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan
from drover.planner.walk import GIVE_UP, _boundary_shifts, _candidate_of, refine, settle
from drover.planner.walk_moves import Moves
from drover.planner.walk_space import Pipe, Space
from drover.planner.walk_state import State, state_from_plan

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


@pytest.mark.parametrize("nics", [[IB] * 4, [IB, ROCE, [], IB]], ids=["infiniband", "ib-roce-ethernet"])
def test_incremental_score_is_the_cost_model(nics):
    """A random walk of every kind of move: each state's step time is evaluate's, and valid."""
    c = cluster(nics, STRAGGLERS)
    sp = Space(c, MODEL)
    st = state_from_plan(sp, make_plan(c, MODEL))
    moves = Moves(sp, random.Random(7))
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
    c = cluster([IB] * 4, STRAGGLERS)
    sp = Space(c, MODEL)
    groups = (sp.group(["n1/0", "n1/1"]), sp.group(["n1/3"]), sp.group(["n2/0", "n2/1", "n2/2", "n2/3"]))
    m = 20
    best = sp.partition(groups, m)

    def time_of(bounds):
        first, each, cap = sp.info(Pipe(groups, bounds))
        return first + (m - 1) * each if m <= cap else float("inf")

    L = MODEL.layers
    every = [(0, a, b, L) for a, b in itertools.combinations(range(1, L), 2)]
    assert time_of(best) <= min(time_of(b) for b in every) * (1 + 1e-9)


def candidate_of(plan, c) -> Candidate:
    return Candidate(
        [[s.devices for s in p.stages] for p in plan.pipelines],
        stage_costs(plan, c, MODEL),
        [p.micro_batches for p in plan.pipelines],
        list(plan.removed),
        plan.predicted.step_time_s,
    )


def test_refine_speeds_up_a_plan_validly_and_the_same_each_time():
    """From the uniform baseline (every GPU in TP 4 pipelines, the failed GPU's group idle,
    the 3x straggler setting the pace), the descent finds a faster plan; twice the same."""
    c = cluster([IB, ROCE, [], IB], STRAGGLERS)
    start = make_plan(c, MODEL, "uniform")
    candidate = candidate_of(start, c)
    runs = [refine(candidate, c, MODEL, evals=300) for _ in range(2)]
    plan = runs[0].to_plan("drover", c, MODEL)
    validate(plan, c, MODEL)
    assert plan.predicted.step_time_s == pytest.approx(runs[0].step_time_s, rel=1e-9)
    assert plan.predicted.step_time_s < start.predicted.step_time_s * 0.95
    assert plan.to_dict() == runs[1].to_plan("drover", c, MODEL).to_dict()
    assert refine(candidate, c, MODEL, evals=0) is candidate  # REFINE_EVALS = 0: no descent


def test_a_plan_without_neighbours_stops_the_walk_early(monkeypatch):
    """One GPU: no move exists, so the descent gives up after GIVE_UP empty proposals in a
    row instead of drawing on (it drew 100,000) and returns the candidate as it was."""
    one = cluster_from_dict(
        {
            "name": "one",
            "defaults": {"gpus": 1, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": IB},
            "nodes": [{"name": "n0"}],
        }
    )
    start = make_plan(one, MODEL, "uniform")
    candidate = candidate_of(start, one)
    proposed = []
    propose = Moves.propose
    monkeypatch.setattr(Moves, "propose", lambda self, st: proposed.append(1) or propose(self, st))
    assert refine(candidate, one, MODEL, evals=300) is candidate
    assert len(proposed) == GIVE_UP + 1  # each of them empty


def test_settle_takes_boundaries_moved_off_back_to_where_no_shift_helps():
    """Drover's plan with one boundary of every pipeline two blocks off: settle's best-first
    shifts give a valid plan at least as fast as Drover's, from which no single shift helps."""
    c = cluster([IB, ROCE, [], IB], STRAGGLERS)
    plan = make_plan(c, MODEL)
    sp = Space(c, MODEL)
    st = state_from_plan(sp, plan)
    moved = []
    for pipe in st.pipes:
        bounds = list(pipe.bounds)
        i = max(range(1, len(bounds) - 1), key=lambda k: bounds[k + 1] - bounds[k])  # into the fullest stage
        bounds[i] = min(bounds[i] + 2, bounds[i + 1] - 1)
        moved.append(Pipe(pipe.groups, tuple(bounds)))
    off = State(sp, moved, st.removed)
    assert off.step > plan.predicted.step_time_s * 1.01
    candidate = _candidate_of(off, sp)
    settled = settle(candidate, c, MODEL, evals=10_000)
    result = settled.to_plan("drover", c, MODEL)
    validate(result, c, MODEL)
    assert result.predicted.step_time_s == pytest.approx(settled.step_time_s, rel=1e-9)
    assert settled.step_time_s <= plan.predicted.step_time_s * (1 + 1e-9)
    final = state_from_plan(sp, result)
    assert not any(final.better(s) for s in map(final.evaluate, _boundary_shifts(final)) if s is not None)
    assert settle(candidate, c, MODEL, evals=0) is candidate
