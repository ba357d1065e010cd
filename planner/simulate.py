"""A training run under changing device rates, replayed for three strategies.

An events file says when devices slow down, recover or fail and when nodes
join. `simulate` replays N training steps for each strategy:

- uniform: plans once as if every GPU were healthy and keeps that plan; only a
  failed GPU in its plan forces a checkpoint-and-restart onto the original nodes.
- drop: restarts without the nodes holding a straggler or failed GPU whenever
  that set of nodes changes or a node joins, seeing every change at once.
- drover: learns of a slowdown `detect_steps` steps late (of a failure or a
  join at once), replans on what it knows, and switches plans only when the
  time saved over the remaining steps beats the cost of moving model state.

The cluster changes only at event steps, so each strategy's step time is
evaluated once per change, never per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import RATES_ALLOWED, Cluster, Node, node_from_dict, parse_rate, valid_rate
from .cost import BYTES_PER_PARAM, evaluate
from .errors import NO_PLAN_RULES, PlanError, SpecError
from .model import ModelSpec
from .plan import Plan
from .search import make_plan
from .spec_io import Fields, load_mapping

DEFAULT_RESTART_S = 300.0
DEFAULT_DETECT_STEPS = 3
STRATEGIES = ("drover", "uniform", "drop")


@dataclass(frozen=True)
class RateChange:
    step: int
    device: str
    rate: float  # >= 1; inf for a failure

    def describe(self) -> str:
        if math.isinf(self.rate):
            return f"{self.device} fails"
        if self.rate == 1.0:
            return f"{self.device} recovers"
        return f"{self.device} slows to {self.rate:g}x"


@dataclass(frozen=True)
class NodeJoin:
    step: int
    node: Node

    def describe(self) -> str:
        return f"{self.node.name} joins ({self.node.gpus} GPUs)"


Event = RateChange | NodeJoin


@dataclass(frozen=True)
class Events:
    events: tuple[Event, ...]  # sorted by step; ties keep file order
    restart_s: float = DEFAULT_RESTART_S
    detect_steps: int = DEFAULT_DETECT_STEPS


def events_from_dict(data: dict, cluster: Cluster, source: str = "events") -> Events:
    """Parse an events mapping; device ids are checked against `cluster` and the nodes joined before."""
    f = Fields(data, source)
    f.reject_unknown({"restart_s", "detect_steps", "events"})
    restart_s = f.number("restart_s", DEFAULT_RESTART_S, exclusive=False)
    detect_steps = f.integer("detect_steps", DEFAULT_DETECT_STEPS, minimum=0)
    entries = []
    for i, raw in enumerate(f.items("events")):
        e = Fields(raw, source, f"events[{i}]")
        e.reject_unknown({"step", "device", "rate", "join"})
        entries.append((e.integer("step", minimum=0), i, e))
    entries.sort(key=lambda entry: entry[:2])  # stable: a node may join, then slow, at one step

    devices = set(cluster.device_by_id)
    node_names = set(cluster.node_index)
    events: list[Event] = []
    for step, _, e in entries:
        if "join" in e.data:
            if "device" in e.data or "rate" in e.data:
                raise e.error("join", e.data["join"], "either {device, rate} or join, not both")
            node = _parse_joining_node(e, cluster, source)
            if node.name in node_names or "/" in node.name:
                raise SpecError(
                    source, f"{e.path('join')}.name", node.name, "a node name without '/' not already in the cluster"
                )
            node_names.add(node.name)
            devices.update(f"{node.name}/{j}" for j in range(node.gpus))
            events.append(NodeJoin(step, node))
            continue
        device = e.string("device")
        if device not in devices:
            raise e.error("device", device, "a device id NODE/INDEX of the cluster or of a node joined earlier")
        rate = parse_rate(e.get("rate"))
        if not valid_rate(rate):
            raise e.error("rate", rate, f"{RATES_ALLOWED} (1.0 recovers)")
        events.append(RateChange(step, device, float(rate)))
    return Events(tuple(events), restart_s, detect_steps)


def _parse_joining_node(e: Fields, cluster: Cluster, source: str) -> Node:
    data = e.mapping("join").data  # its error already names events[i].join
    try:
        return node_from_dict(data, cluster, source)
    except SpecError as err:  # name the field where it is in the events file
        field_path = e.path("join") + err.field.removeprefix("node")
        raise SpecError(source, field_path, err.value, err.allowed) from None


def load_events(path: str | Path, cluster: Cluster) -> Events:
    return events_from_dict(load_mapping(path, "events"), cluster, str(path))


@dataclass(frozen=True)
class TimelineEntry:
    step: int
    event: str
    step_time_s: float | None  # of the steps that follow, until the next entry; None: the run stopped

    def to_dict(self) -> dict:
        return {"step": self.step, "event": self.event, "step_time_s": self.step_time_s}


@dataclass
class StrategyRun:
    strategy: str
    steps: int
    global_batch: int
    total_s: float = 0.0
    replans: int = 0  # a restart counts as a replan
    migration_s: float = 0.0  # spent moving state or restarting
    timeline: list[TimelineEntry] = field(default_factory=list)
    trained_steps: int = 0
    stopped_at: int | None = None  # the step from which no plan of this strategy fits, if any

    @property
    def samples_per_s(self) -> float:
        """Of the steps trained (all of them unless the run stopped)."""
        return self.trained_steps * self.global_batch / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "steps": self.steps,
            "trained_steps": self.trained_steps,
            "stopped_at": self.stopped_at,
            "total_s": self.total_s,
            "samples_per_s": self.samples_per_s,
            "replans": self.replans,
            "migration_s": self.migration_s,
            "timeline": [t.to_dict() for t in self.timeline],
        }

    def switch(self, seconds: float) -> None:
        self.replans += 1
        self.migration_s += seconds
        self.total_s += seconds

    def train(self, step: int, end: int, event: str, plan: Plan, truth: Cluster, model: ModelSpec) -> None:
        """Run steps [step, end) with `plan` on the true cluster."""
        step_time = evaluate(plan, truth, model).step_time_s
        self.timeline.append(TimelineEntry(step, event, step_time))
        self.total_s += (end - step) * step_time
        self.trained_steps += end - step

    def stop(self, step: int, event: str, err: PlanError) -> None:
        """No plan of this strategy fits from `step` on: the run ends there. Any other PlanError
        is raised again."""
        if err.rule not in NO_PLAN_RULES:
            raise err
        self.stopped_at = step
        self.timeline.append(TimelineEntry(step, f"{event}; no plan fits, the run stops: {err.detail}", None))


class _World:
    """The true cluster at each step, and what a strategy with detection delay knows of it."""

    def __init__(self, cluster: Cluster, model: ModelSpec, events: Events, steps: int):
        self.initial, self.model, self.steps = cluster, model, steps
        self.restart_s, self.detect_steps = events.restart_s, events.detect_steps
        self.events = [e for e in events.events if e.step < steps]
        self._clusters: dict[tuple[str, int], Cluster] = {}

    def delay(self, event: Event) -> int:
        """A failed step or a new node is noticed at once; a slower step takes a while to tell apart."""
        if isinstance(event, NodeJoin) or math.isinf(event.rate):
            return 0
        return self.detect_steps

    def truth(self, step: int) -> Cluster:
        return self._cluster_at("truth", step, lambda e: e.step <= step)

    def known(self, step: int) -> Cluster:
        return self._cluster_at("known", step, lambda e: e.step + self.delay(e) <= step)

    def _cluster_at(self, view: str, step: int, seen) -> Cluster:
        key = (view, step)
        if key not in self._clusters:
            cluster, rates = self.initial, dict(self.initial.rates)
            for e in filter(seen, self.events):
                if isinstance(e, NodeJoin):
                    cluster = cluster.with_node(e.node)
                elif e.rate == 1.0:
                    rates.pop(e.device, None)
                else:
                    rates[e.device] = e.rate
            self._clusters[key] = cluster.with_rates(rates)
        return self._clusters[key]

    def happened_at(self, step: int) -> list[Event]:
        return [e for e in self.events if e.step == step]

    def detected_at(self, step: int) -> list[Event]:
        return [e for e in self.events if e.step + self.delay(e) == step]

    def segments(self, starts) -> list[tuple[int, int]]:
        """[start, end) step ranges between the given steps (and 0), inside the run."""
        bounds = sorted({0, *(s for s in starts if s < self.steps)})
        return list(zip(bounds, bounds[1:] + [self.steps]))


def _describe(events: list[Event]) -> str:
    return ", ".join(e.describe() for e in events)


def _uses_failed(plan: Plan, cluster: Cluster) -> bool:
    return any(cluster.device_by_id[d].failed for d in plan.devices)


def _run_uniform(world: _World) -> StrategyRun:
    model, original = world.model, set(world.initial.node_index)
    run = StrategyRun("uniform", world.steps, model.global_batch)
    plan = None
    for step, end in world.segments(e.step for e in world.events):
        truth = world.truth(step)
        event = _describe(world.happened_at(step)) or "start"
        if plan is None or _uses_failed(plan, truth):
            try:  # a static job (re)starts on the nodes it was launched with
                new = make_plan(_only_nodes(truth, original), model, "uniform")
            except PlanError as err:
                run.stop(step, event, err)
                break
            if plan is not None:
                run.switch(world.restart_s)
                event += f"; restart ({world.restart_s:g} s) without the failed pipeline"
            plan = new
        run.train(step, end, event, plan, truth, model)
    return run


def _only_nodes(cluster: Cluster, names: set[str]) -> Cluster:
    nodes = tuple(n for n in cluster.nodes if n.name in names)
    rates = {d: r for d, r in cluster.rates.items() if d.rsplit("/", 1)[0] in names}
    return Cluster(cluster.name, nodes, rates, cluster.defaults)


def _run_drop(world: _World) -> StrategyRun:
    model = world.model
    run = StrategyRun("drop", world.steps, model.global_batch)
    plan, layout = None, None
    for step, end in world.segments(e.step for e in world.events):
        truth = world.truth(step)
        event = _describe(world.happened_at(step)) or "start"
        if plan is None or _drop_layout(truth) != layout or _uses_failed(plan, truth):
            try:
                new, kept = _drop_plan(truth, model)
            except PlanError as err:
                run.stop(step, event, err)
                break
            layout = _drop_layout(truth)
            if plan is not None and new != plan:  # the same plan again needs no restart
                run.switch(world.restart_s)
                event += f"; restart ({world.restart_s:g} s), {kept}"
            elif plan is None and step == 0 and layout[0]:
                event += f"; {kept}"
            plan = new
        run.train(step, end, event, plan, truth, model)
    return run


def _drop_layout(cluster: Cluster) -> tuple[frozenset[str], frozenset[str]]:
    """(nodes holding a straggler or failed GPU, all nodes): drop restarts when this changes."""
    bad = frozenset(cluster.nodes[d.node].name for d in cluster.devices if d.rate != 1.0)
    return bad, frozenset(cluster.node_index)


def _drop_plan(cluster: Cluster, model: ModelSpec) -> tuple[Plan, str]:
    """(drop's plan, what it did with the nodes holding a straggler or failed GPU)."""
    dropped = ", ".join(sorted(_drop_layout(cluster)[0])) or "none"
    try:
        return make_plan(cluster, model, "drop"), f"nodes dropped: {dropped}"
    except PlanError as err:
        if err.rule != "no-feasible-plan":
            raise
    # Every node holds a straggler or a failed GPU, or those left cannot hold the model: drop
    # keeps every node, as the uniform plan of the GPUs that have not failed.
    try:
        plan = make_plan(cluster, model, "uniform")
    except PlanError as err:
        raise PlanError(
            err.rule,
            f"strategy 'drop' finds no plan that fits for model {model.name!r} on cluster {cluster.name!r}, "
            "with or without the nodes that straggle",
        ) from None
    return plan, f"nothing left to drop to ({dropped} straggle): every node kept"


def _run_drover(world: _World) -> StrategyRun:
    model = world.model
    run = StrategyRun("drover", world.steps, model.global_batch)
    plan = None
    detections = {e.step + world.delay(e) for e in world.events}
    for step, end in world.segments({e.step for e in world.events} | detections):
        truth, known = world.truth(step), world.known(step)
        happened = [e for e in world.happened_at(step) if world.delay(e) > 0]
        notes = [f"{e.describe()} ({_detection_note(e.step + world.delay(e), world.steps)})" for e in happened]
        detected = _describe(world.detected_at(step)) if plan is None or step in detections else ""
        try:
            if plan is None:  # planned on what it knows at the start: nothing to migrate from
                plan = make_plan(known, model, "drover")
                notes.append(detected)
            elif step in detections:
                plan, decision = _reconsider(plan, known, world, remaining=world.steps - step, run=run)
                notes.append(f"{detected}: {decision}")
        except PlanError as err:  # what was detected, not "start": a failure can leave no plan
            run.stop(step, "; ".join([n for n in notes + [detected] if n]) or "start", err)
            break
        run.train(step, end, "; ".join([n for n in notes if n]) or "start", plan, truth, model)
    return run


def _detection_note(detected: int, steps: int) -> str:
    return f"detected at step {detected}" if detected < steps else "not detected before the run ends"


def _reconsider(plan: Plan, known: Cluster, world: _World, remaining: int, run: StrategyRun) -> tuple[Plan, str]:
    """Replan on the known cluster; switch if forced or if the time saved beats the migration."""
    model = world.model
    candidate = make_plan(known, model, "drover")
    migration = migration_seconds(plan, candidate, known, model, world.restart_s)
    if _uses_failed(plan, known):
        run.switch(migration)
        return candidate, f"replanned around the failure ({migration:.3g} s to move state)"
    old_s = evaluate(plan, known, model).step_time_s
    new_s = evaluate(candidate, known, model).step_time_s
    gain = (old_s - new_s) * remaining
    if gain > migration:
        run.switch(migration)
        return candidate, f"replanned, saving {gain:.3g} s for {migration:.3g} s of migration"
    if gain <= 0:
        return plan, "kept plan: no faster plan for what is known"
    return plan, f"kept plan: saving {gain:.3g} s over {remaining} steps < {migration:.3g} s of migration"


def migration_seconds(old: Plan, new: Plan, cluster: Cluster, model: ModelSpec, restart_s: float) -> float:
    """Time to move model state from the devices of `old` to those of `new`.

    Each device of a new stage fetches its TP shard of the stage's blocks (and
    the embedding on a first stage, the LM head on a last stage) from the best
    linked holder (a device of an old stage none of whose GPUs failed), unless
    it held exactly that stage before.
    Transfers run in parallel, so the slowest receiver sets the time. State no
    surviving device holds comes from a checkpoint: a restart.
    """
    devices = cluster.device_by_id
    block_holders = [set() for _ in range(model.layers)]  # nodes of surviving holders
    embedding_holders, head_holders = set(), set()
    held: dict[str, tuple[tuple[int, int], int, int]] = {}  # device -> (layers, t, TP rank)
    for pipeline in old.pipelines:
        last = len(pipeline.stages) - 1
        for k, stage in enumerate(pipeline.stages):
            # Each device holds a TP shard: a group that lost one no longer has the whole state.
            intact = not any(devices[d].failed for d in stage.devices)
            nodes = {devices[d].node for d in stage.devices} if intact else set()
            for block in range(*stage.layers):
                block_holders[block] |= nodes
            if k == 0:
                embedding_holders |= nodes
            if k == last:
                head_holders |= nodes
            held.update((d, (stage.layers, len(stage.devices), r)) for r, d in enumerate(stage.devices))

    slowest = 0.0
    for pipeline in new.pipelines:
        last = len(pipeline.stages) - 1
        for k, stage in enumerate(pipeline.stages):
            pieces = [(model.block_params, block_holders[b]) for b in range(*stage.layers)]
            if k == 0:
                pieces.append((model.embedding_params, embedding_holders))
            if k == last:
                pieces.append((model.head_params, head_holders))
            if any(not holders for _, holders in pieces):
                return restart_s
            t = len(stage.devices)
            for r, d in enumerate(stage.devices):
                if held.get(d) == (stage.layers, t, r):  # the same shard: TP rank r of the same blocks
                    continue
                node = devices[d].node
                seconds = sum(
                    BYTES_PER_PARAM * params / t / max(cluster.link_bw(node, h) for h in holders)
                    for params, holders in pieces
                )
                slowest = max(slowest, seconds)
    return slowest


def simulate(cluster: Cluster, model: ModelSpec, events: Events, steps: int) -> list[StrategyRun]:
    """Replay `steps` training steps under `events` for drover, uniform and drop, in that order."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SpecError("simulate", "steps", steps, "an integer >= 1")
    world = _World(cluster, model, events, steps)
    runners = {"drover": _run_drover, "uniform": _run_uniform, "drop": _run_drop}
    runs = [runners[name](world) for name in STRATEGIES]
    if runs[0].stopped_at == 0:  # drover's search holds the baselines too: no strategy has a plan
        make_plan(world.known(0), model, "drover")  # raises its error
    return runs
