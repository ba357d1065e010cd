"""The run simulator: how uniform, drop and drover fare as devices slow, fail and join."""

import time
from dataclasses import replace

import pytest

from drover.planner import simulate as sim
from drover.planner.cluster import cluster_from_dict, load_cluster
from drover.planner.cost import evaluate
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import load_model, model_from_dict
from drover.planner.search import make_plan
from drover.planner.simulate import Events, NodeJoin, RateChange, events_from_dict, load_events, simulate

from support import ROOT

STEPS = 200
RESTART_S = 300.0


def small_cluster(nics=({"type": "infiniband", "gbps": 200, "count": 8},), ethernet_gbps=100, nodes=4, gpus=8, gib=80):
    return cluster_from_dict(
        {
            "name": f"test-{nodes * gpus}",
            "defaults": {
                "gpus": gpus,
                "gpu": {"name": f"A100-{gib}G", "tflops": 312, "memory_gib": gib},
                "intra_gbps": 2400,
                "ethernet_gbps": ethernet_gbps,
                "nics": list(nics),
            },
            "nodes": [{"name": f"node-{i}"} for i in range(nodes)],
        }
    )


@pytest.fixture(scope="module")
def cluster():
    return small_cluster()


@pytest.fixture(scope="module")
def model():
    return model_from_dict(
        {
            "name": "gpt-7b-like",
            "layers": 32,
            "hidden": 4096,
            "ffn_hidden": 16384,
            "heads": 32,
            "seq_len": 4096,
            "vocab": 32000,
            "global_batch": 128,
            "micro_batch": 1,
        }
    )


def events(*changes, detect_steps=3):
    return Events(tuple(changes), RESTART_S, detect_steps)


def by_strategy(runs):
    return {run.strategy: run for run in runs}


def step_time(plan, cluster, model):
    return evaluate(plan, cluster, model).step_time_s


def test_no_events_every_strategy_runs_its_first_plan(cluster, model):
    runs = by_strategy(simulate(cluster, model, events(), STEPS))
    assert list(runs) == ["drover", "uniform", "drop"]
    for name, run in runs.items():
        expected = STEPS * make_plan(cluster, model, name).predicted.step_time_s
        assert run.total_s == pytest.approx(expected, rel=1e-12)
        assert (run.replans, run.migration_s) == (0, 0.0)
        assert run.samples_per_s == pytest.approx(STEPS * model.global_batch / run.total_s)
    # On a healthy homogeneous cluster all three pick equally fast plans.
    assert len({round(run.total_s, 6) for run in runs.values()}) == 1


def test_events_after_the_run_have_no_effect(cluster, model):
    late = events(RateChange(STEPS, "node-1/2", 4.0), RateChange(STEPS + 5, "node-2/0", float("inf")))
    assert [r.to_dict() for r in simulate(cluster, model, late, STEPS)] == [
        r.to_dict() for r in simulate(cluster, model, events(), STEPS)
    ]


def test_straggler_drover_replans_once_after_detection_delay(cluster, model):
    slow_at, rate = 50, 4.0
    runs = by_strategy(simulate(cluster, model, events(RateChange(slow_at, "node-1/2", rate)), STEPS))
    drover = runs["drover"]
    assert drover.replans == 1
    assert 0 < drover.migration_s < RESTART_S
    assert drover.total_s < runs["uniform"].total_s

    # The detect_steps steps after the slowdown run the old plan at the slow, true rate.
    slow = cluster.with_rates({"node-1/2": rate})
    first, second = make_plan(cluster, model, "drover"), make_plan(slow, model, "drover")
    migration = sim.migration_seconds(first, second, slow, model, RESTART_S)
    assert migration == pytest.approx(drover.migration_s)
    expected = (
        slow_at * step_time(first, cluster, model)
        + 3 * step_time(first, slow, model)
        + migration
        + (STEPS - slow_at - 3) * step_time(second, slow, model)
    )
    assert drover.total_s == pytest.approx(expected, rel=1e-12)
    assert [entry.step for entry in drover.timeline] == [0, slow_at, slow_at + 3]


def test_failure_forces_restarts_but_drover_moves_state(cluster, model):
    runs = by_strategy(simulate(cluster, model, events(RateChange(50, "node-1/2", float("inf"))), STEPS))
    for name in ("uniform", "drop"):
        assert runs[name].replans == 1
        assert runs[name].migration_s >= RESTART_S
    drover = runs["drover"]
    assert drover.replans == 1
    assert drover.migration_s < RESTART_S  # the failed GPU's blocks have replicas elsewhere
    assert drover.total_s < min(runs["uniform"].total_s, runs["drop"].total_s)
    assert "failure" in drover.timeline[-1].event


def test_failure_of_the_only_replica_costs_a_restart(cluster, model):
    failed = cluster.with_rates({"node-0/0": float("inf")})
    single = make_plan(cluster.with_rates({}), model, "uniform")
    # Keep only the pipeline holding node-0/0: its blocks then live nowhere else.
    only = replace(
        single, pipelines=tuple(p for p in single.pipelines if any("node-0/0" in s.devices for s in p.stages))
    )
    after = make_plan(failed, model, "drover")
    assert sim.migration_seconds(only, after, failed, model, RESTART_S) == RESTART_S


def test_straggler_near_the_end_is_not_worth_a_migration(model):
    # On 10 Gbps Ethernet moving state is slow enough to outweigh a few faster steps.
    ethernet = small_cluster(nics=(), ethernet_gbps=10)
    late = events(RateChange(STEPS - 4, "node-1/2", 4.0))  # detected with one step left
    drover = by_strategy(simulate(ethernet, model, late, STEPS))["drover"]
    assert (drover.replans, drover.migration_s) == (0, 0.0)
    assert "kept plan" in drover.timeline[-1].event

    slow = ethernet.with_rates({"node-1/2": 4.0})
    first, better = make_plan(ethernet, model, "drover"), make_plan(slow, model, "drover")
    gain_per_step = step_time(first, slow, model) - step_time(better, slow, model)
    migration = sim.migration_seconds(first, better, slow, model, RESTART_S)
    assert gain_per_step * 1 < migration < gain_per_step * 10

    # The same straggler with many steps left is worth it.
    early = by_strategy(simulate(ethernet, model, events(RateChange(50, "node-1/2", 4.0)), STEPS))
    assert early["drover"].replans == 1


def test_node_join_drop_restarts_uniform_ignores_drover_replans(cluster, model):
    data = {"events": [{"step": 20, "join": {"name": "node-4"}}]}
    joined = by_strategy(simulate(cluster, model, events_from_dict(data, cluster), STEPS))
    quiet = by_strategy(simulate(cluster, model, events(), STEPS))
    assert joined["uniform"].total_s == pytest.approx(quiet["uniform"].total_s)
    assert joined["uniform"].replans == 0
    assert (joined["drop"].replans, joined["drop"].migration_s) == (1, RESTART_S)
    assert joined["drover"].replans == 1
    assert joined["drover"].total_s < quiet["drover"].total_s


def test_example_events_file_parses_and_simulates_quickly(monkeypatch):
    cluster = load_cluster(ROOT / "examples/clusters/a100-64-stragglers.yaml")
    model = load_model(ROOT / "examples/models/gpt-7b.yaml")
    loaded = load_events(ROOT / "examples/events/straggler-then-failure.yaml", cluster)
    assert (loaded.restart_s, loaded.detect_steps) == (300.0, 3)
    kinds = [type(e) for e in loaded.events]
    assert kinds == [RateChange, RateChange, RateChange, NodeJoin]
    assert loaded.events[2].rate == float("inf")

    planning = []  # seconds inside the planner, which the speed bound leaves out

    def timed_make_plan(*args):
        start = time.perf_counter()
        plan = make_plan(*args)
        planning.append(time.perf_counter() - start)
        return plan

    monkeypatch.setattr(sim, "make_plan", timed_make_plan)
    start = time.perf_counter()
    runs = simulate(cluster, model, loaded, 10_000)
    assert time.perf_counter() - start - sum(planning) < 1.0
    assert all(run.to_dict()["total_s"] > 0 for run in runs)


@pytest.mark.parametrize(
    "entry, field, fragment",
    [
        ({"step": 1, "device": "node-9/0", "rate": 2.0}, "events[0].device", "device id"),
        ({"step": 1, "device": "node-1/8", "rate": 2.0}, "events[0].device", "device id"),
        ({"step": 1, "device": "node-1/0", "rate": 0.5}, "events[0].rate", ">= 1.0"),
        ({"step": 1, "device": "node-1/0", "rate": "fast"}, "events[0].rate", ">= 1.0"),
        ({"step": -1, "device": "node-1/0", "rate": 2.0}, "events[0].step", ">= 0"),
        ({"device": "node-1/0", "rate": 2.0}, "events[0].step", "required"),
        ({"step": 1, "device": "node-1/0", "speed": 2.0}, "events[0].speed", "known field"),
        ({"step": 1, "join": {"name": "node-0"}}, "events[0].join.name", "not already"),
        ({"step": 1, "join": {"name": "node-4", "gpus": 0}}, "events[0].join.gpus", ">= 1"),
        ({"step": 1, "join": "node-4"}, "events[0].join", "mapping"),
    ],
)
def test_bad_event_names_the_field(cluster, entry, field, fragment):
    with pytest.raises(SpecError) as err:
        events_from_dict({"events": [entry]}, cluster, "ev.yaml")
    assert err.value.field == field
    assert fragment in err.value.allowed
    assert field in str(err.value) and "ev.yaml" in str(err.value)


def test_missing_events_and_bad_settings_are_spec_errors(cluster):
    with pytest.raises(SpecError, match="'events'"):
        events_from_dict({"restart_s": 10}, cluster)
    with pytest.raises(SpecError, match="'detect_steps'"):
        events_from_dict({"detect_steps": -1, "events": []}, cluster)
    with pytest.raises(SpecError, match="'restart_s'"):
        events_from_dict({"restart_s": "soon", "events": []}, cluster)


def test_rates_accept_inf_spellings_and_joined_devices(cluster):
    parsed = events_from_dict(
        {
            "events": [
                {"step": 9, "device": "node-4/3", "rate": "inf"},
                {"step": 5, "join": {"name": "node-4", "gpus": 4}},
                {"step": 7, "device": "node-0/1", "rate": float("inf")},
                {"step": 8, "device": "node-0/1", "rate": 1},
            ]
        },
        cluster,
    )
    assert [e.step for e in parsed.events] == [5, 7, 8, 9]  # sorted by step
    assert parsed.events[0].node.gpus == 4
    assert parsed.events[0].node.gpu.name == "A100-80G"  # from the cluster's defaults
    assert parsed.events[1].rate == parsed.events[3].rate == float("inf")
    with pytest.raises(SpecError, match="events\\[0\\].device"):  # the node has not joined yet
        events_from_dict(
            {"events": [{"step": 1, "device": "node-4/0", "rate": 2}, {"step": 5, "join": {"name": "node-4"}}]}, cluster
        )


def two_gpus():  # node-0/0 and node-1/0, 40 GB each, over Ethernet
    return small_cluster(nics=(), ethernet_gbps=10, nodes=2, gpus=1, gib=40)


def needs_both(model):  # too big for one 40 GB GPU, fits on two
    return replace(model, name="needs-both", layers=24, hidden=3072, ffn_hidden=12288, heads=24, global_batch=16)


def test_a_strategy_left_without_a_plan_stops_and_the_others_go_on(model):
    two, big = two_gpus(), needs_both(model)
    runs = by_strategy(simulate(two, big, events(RateChange(5, "node-1/0", float("inf"))), 20))
    for name in ("uniform", "drop"):  # one GPU cannot hold the model, and they do not move state
        run = runs[name]
        assert (run.stopped_at, run.trained_steps, run.replans) == (5, 5, 0)
        assert run.timeline[-1].step_time_s is None and "no plan fits" in run.timeline[-1].event
        assert f"strategy '{name}'" in run.timeline[-1].event
        assert run.to_dict()["stopped_at"] == 5
    # Drover cannot plan around the failure either: it stops at the same step, and says which
    # failure stopped it (its timeline said "start").
    assert (runs["drover"].stopped_at, runs["drover"].trained_steps) == (5, 5)
    assert runs["drover"].timeline[-1].event.startswith("node-1/0 fails; no plan fits")


def test_a_replan_with_nothing_to_gain_says_so(model):
    # It read "saving 0 s over 87 steps < 0 s of migration".
    both_slow = events(RateChange(5, "node-0/0", 2.0), RateChange(5, "node-1/0", 2.0))
    runs = by_strategy(simulate(two_gpus(), needs_both(model), both_slow, 20))
    decisions = [e.event for e in runs["drover"].timeline if "kept plan" in e.event]
    assert decisions and all("no faster plan" in d for d in decisions)


def test_with_no_plan_at_all_simulate_raises_the_planners_error(model):
    two, big = two_gpus(), needs_both(model)
    with pytest.raises(PlanError, match="no-feasible-plan"):
        simulate(two, big, events(RateChange(0, "node-0/0", float("inf"))), 20)


def test_drop_with_every_node_straggling_keeps_them_and_says_so(model):
    two, big = two_gpus(), needs_both(model)
    runs = by_strategy(simulate(two.with_rates({"node-1/0": 1.9}), big, events(RateChange(10, "node-0/0", 3.0)), 40))
    drop = runs["drop"]
    assert "nodes dropped: node-1" not in drop.timeline[0].event  # node-0 alone cannot hold it: kept
    assert "every node kept" in drop.timeline[0].event
    # Both straggle at step 10: the same plan goes on, with no restart charged for it.
    assert (drop.replans, drop.migration_s, drop.trained_steps) == (0, 0.0, 40)


def test_events_at_step_zero_are_the_start_not_a_change(cluster, model):
    at_start = events(RateChange(0, "node-1/2", float("inf")), RateChange(0, "node-2/0", 4.0))
    runs = by_strategy(simulate(cluster, model, at_start, STEPS))
    assert runs["uniform"].replans == runs["drop"].replans == 0  # they start on the cluster as it is
    failed = cluster.with_rates({"node-1/2": float("inf")})
    assert runs["drover"].timeline[0].step_time_s == pytest.approx(
        step_time(
            make_plan(failed, model, "drover"), cluster.with_rates({"node-1/2": float("inf"), "node-2/0": 4.0}), model
        )
    )


def test_steps_must_be_positive(cluster, model):
    with pytest.raises(SpecError, match="steps"):
        simulate(cluster, model, events(), 0)
