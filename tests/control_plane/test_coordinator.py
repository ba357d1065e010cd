"""`coordinator.decide` by tables: no gRPC, no SQLite, no planner."""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.control_plane.coordinator import (
    AnnounceSlowLink,
    AnnounceStraggler,
    Commit,
    JobState,
    Observation,
    Proposal,
    ProposePlan,
    PushPlan,
    SkipPlan,
    decide,
)
from drover.control_plane.detector import DetectorSettings

SETTINGS = DetectorSettings(cooldown_steps=4, replan_delta=0.3, min_gain=0.05)
# A job of 100 steps at step 20, plan v1 committed at step 0 on both nodes.
STEADY = JobState(version=1, committed=1, node_versions={"n0": 1, "n1": 1}, step=20, steps=100, committed_at=0)
HEALTHY = {"n0/0": 1.0, "n0/1": 1.0, "n1/0": 1.0, "n1/1": 1.0}
SLOW = {**HEALTHY, "n1/0": 3.0}


def proposal(current=1.0, proposed=0.6, migration=2.0, rates=SLOW):
    return Proposal(rates, plan="PLAN", current_step_s=current, proposed_step_s=proposed, migration_s=migration)


@pytest.mark.parametrize(
    "name, state, observation, expected",
    [
        ("healthy: nothing to do", STEADY, Observation(HEALTHY), []),
        ("no data yet", STEADY, Observation({}), []),
        (
            "a straggler: announce it and ask for a plan",
            STEADY,
            Observation(SLOW),
            [AnnounceStraggler("n1/0", 3.0), ProposePlan(SLOW)],
        ),
        (
            "already announced at this rate: only the plan",
            replace(STEADY, announced=frozenset({("n1/0", 3.0)})),
            Observation(SLOW),
            [ProposePlan(SLOW)],
        ),
        ("the plan assumed this rate already", replace(STEADY, planned_rates={"n1/0": 3.0}), Observation(SLOW), []),
        ("a move below replan_delta is no move", replace(STEADY, planned_rates={"n1/0": 2.8}), Observation(SLOW), []),
        (
            "recovered: plan it back in",
            replace(STEADY, planned_rates={"n1/0": 3.0}),
            Observation(HEALTHY),
            [ProposePlan(HEALTHY)],
        ),
        (
            "an idle device keeps its last known rate",
            replace(STEADY, planned_rates={"n1/0": 3.0, "n0/1": 2.0}),
            Observation({"n0/0": 1.0, "n0/1": 1.0, "n1/1": 1.0}),
            [ProposePlan({"n1/0": 3.0, "n0/1": 1.0, "n0/0": 1.0, "n1/1": 1.0})],
        ),
        (
            "every node runs v2: commit",
            replace(STEADY, version=2, node_versions={"n0": 2, "n1": 2}),
            Observation(SLOW),
            [Commit(2)],
        ),
        (
            "one node still on v1: wait, one rollout at a time",
            replace(STEADY, version=2, node_versions={"n0": 2, "n1": 1}),
            Observation(SLOW),
            [],
        ),
        ("just committed: cool down", replace(STEADY, committed_at=18), Observation(SLOW), []),
        ("paused", replace(STEADY, detection_paused=True), Observation(SLOW), []),
        ("slow link, announced once", STEADY, Observation(HEALTHY, slow_links=("n0/1",)), [AnnounceSlowLink("n0/1")]),
        (
            "slow link already announced",
            replace(STEADY, announced=frozenset({("n0/1", "link")})),
            Observation(HEALTHY, slow_links=("n0/1",)),
            [],
        ),
        (
            "a link measured 4x slower than planned: ask for a plan",
            replace(STEADY, planned_links={"n0:ib": 200.0, "n1:ib": 200.0}),
            Observation(HEALTHY, links={"n0:ib": 50.0, "n1:ib": 190.0}),
            [ProposePlan(HEALTHY)],
        ),
        (
            "a link within link_delta of the plan is no move",
            replace(STEADY, planned_links={"n0:ib": 200.0}),
            Observation(HEALTHY, links={"n0:ib": 170.0}),
            [],
        ),
        (
            "a failed probe (0) or a NIC of unknown speed is no figure to compare",
            replace(STEADY, planned_links={"n0:ib": 200.0, "n1:ib": 0.0}),
            Observation(HEALTHY, links={"n0:ib": 0.0, "n1:ib": 50.0}),
            [],
        ),
        (
            "a link the plan knew nothing of is not a move",
            STEADY,
            Observation(HEALTHY, links={"n9:eth": 1.0}),
            [],
        ),
        (
            "forced: plan for what is measured, even mid-rollout",
            replace(STEADY, version=2, node_versions={"n0": 1}),
            Observation(SLOW, forced="operator"),
            [ProposePlan(SLOW)],
        ),
    ],
)
def test_decide(name, state, observation, expected):
    assert decide(state, observation, SETTINGS) == expected, name


@pytest.mark.parametrize(
    "name, offer, kind, fragment",
    [
        ("worth it", proposal(), PushPlan, "predicted gain"),
        ("gain below the minimum", proposal(proposed=0.97), SkipPlan, "minimum gain"),
        ("too few steps left to pay the migration", proposal(migration=40.0), SkipPlan, "migration"),
        ("a worse plan is never pushed", proposal(proposed=1.2), SkipPlan, "minimum gain"),
    ],
)
def test_judging_a_proposal(name, offer, kind, fragment):
    [action] = decide(STEADY, Observation(SLOW, proposal=offer), SETTINGS)
    assert isinstance(action, kind), name
    assert fragment in action.reason
    assert action.rates == SLOW


def test_forced_proposal_is_pushed_whatever_it_gains():
    [action] = decide(STEADY, Observation(SLOW, forced="operator", proposal=proposal(proposed=1.0)), SETTINGS)
    assert action == PushPlan("PLAN", SLOW, "operator")


def test_skip_reports_its_figures():
    [action] = decide(STEADY, Observation(SLOW, proposal=proposal(migration=40.0)), SETTINGS)
    assert action.details["steps_left"] == 79 and action.details["gain_s"] == pytest.approx(0.4 * 79)
    assert action.details["rates"] == {"n1/0": 3.0}


def test_a_job_takes_whole_nodes_within_its_device_budget():
    from drover.control_plane.running import whole_nodes_within

    nodes = [("a", [1] * 8, []), ("b", [1] * 8, []), ("c", [1] * 8, [])]
    assert [n for n, _, _ in whole_nodes_within(16, nodes)] == ["a", "b"]
    assert [n for n, _, _ in whole_nodes_within(15, nodes)] == ["a"]


def test_a_slow_link_is_judged_by_the_same_gain_rule():
    state = replace(STEADY, planned_links={"n0:ib": 200.0})
    offer = replace(proposal(rates=HEALTHY), links={"n0:ib": 50.0})
    [action] = decide(state, Observation(HEALTHY, links={"n0:ib": 50.0}, proposal=offer), SETTINGS)
    assert isinstance(action, PushPlan) and action.links == {"n0:ib": 50.0}
    assert "links measured: {'n0:ib': 50.0} Gbps" in action.reason and "rates moved" not in action.reason
    costly = replace(offer, migration_s=100.0)
    [action] = decide(state, Observation(HEALTHY, links={"n0:ib": 50.0}, proposal=costly), SETTINGS)
    assert isinstance(action, SkipPlan) and "links {'n0:ib': 50.0} Gbps" in action.reason
    assert action.details["links"] == {"n0:ib": 50.0} and action.links == {"n0:ib": 50.0}
