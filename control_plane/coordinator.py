"""When to commit, announce and replan: one pure decision, tested by tables.

`decide(state, observation, settings) -> actions`, as a Kubernetes
controller's sync handler: no I/O, no asyncio, no clock. The controller runs
it from one reconcile task per job, so two telemetry messages arriving
together cannot both start a rollout.

The planner is pure but slow (seconds at 1,024 GPUs), so it never runs
inside `decide`: when a new plan is worth considering, `decide` returns
`ProposePlan`; the controller plans off the event loop and calls `decide`
again with the same state and the `Proposal` in the observation, and gets
back `PushPlan` or `SkipPlan` with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .detector import DetectorSettings


@dataclass(frozen=True)
class JobState:
    """What the controller knows of a running job, as plain values."""

    version: int  # the desired generation: the newest plan pushed
    committed: int  # the observed generation: the newest plan every node runs
    node_versions: Mapping[str, int]  # node -> plan version its workers all run
    step: int  # newest step reported
    steps: int  # the job's length
    committed_at: int = -1  # first step run under the newest committed plan (its switch step)
    planned_rates: Mapping[str, float] = field(default_factory=dict)  # what the current plan assumed
    announced: frozenset = frozenset()  # (device, rate) and (device, "link") already announced
    detection_paused: bool = False
    planned_links: Mapping[str, float] = field(default_factory=dict)  # "node:nic" -> Gbps the plan assumed


@dataclass(frozen=True)
class Proposal:
    """A plan for `rates`, with the figures the decision weighs (reference cost model)."""

    rates: Mapping[str, float]
    plan: Any
    current_step_s: float  # the running plan's step time at these rates
    proposed_step_s: float
    migration_s: float  # predicted cost of switching to it
    links: Mapping[str, float] = field(default_factory=dict)  # the NICs' bandwidths it was planned with


@dataclass(frozen=True)
class Observation:
    rates: Mapping[str, float]  # the detector's rates now (devices with a full window)
    slow_links: tuple[str, ...] = ()
    links: Mapping[str, float] = field(default_factory=dict)  # "node:nic" -> measured Gbps now
    forced: str = ""  # a replan asked for by request, with its reason
    proposal: Proposal | None = None


# -- actions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    version: int


@dataclass(frozen=True)
class AnnounceStraggler:
    device: str
    rate: float


@dataclass(frozen=True)
class AnnounceSlowLink:
    device: str


@dataclass(frozen=True)
class ProposePlan:
    rates: Mapping[str, float]  # plan for these (devices idle now keep their last known rate)


@dataclass(frozen=True)
class PushPlan:
    plan: Any
    rates: Mapping[str, float]
    reason: str
    links: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SkipPlan:
    """Settle on the current plan for these rates; replan only when they move again."""

    rates: Mapping[str, float]
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)
    links: Mapping[str, float] = field(default_factory=dict)


def links_moved(planned: Mapping[str, float], current: Mapping[str, float], delta: float) -> dict[str, float]:
    """NICs whose measured bandwidth moved by the fraction `delta` or more from what the plan assumed."""
    # A zero is a failed probe or a NIC of unknown speed: no figure to compare.
    return {k: g for k, g in current.items() if g > 0 < planned.get(k, 0) and abs(g - planned[k]) >= delta * planned[k]}


def moved(planned: Mapping[str, float], current: Mapping[str, float], delta: float) -> dict[str, float]:
    """Devices whose rate moved by `delta` or more from what the plan assumed."""
    return {d: r for d, r in current.items() if abs(r - planned.get(d, 1.0)) >= delta}


def decide(state: JobState, observation: Observation, settings: DetectorSettings = DetectorSettings()) -> list:
    if observation.proposal is not None:
        return [_judge(state, observation, settings)]
    observed = min(state.node_versions.values(), default=0)
    if observed >= state.version > state.committed:
        return [Commit(state.version)]  # the new plan is judged once it has run a while
    if observation.forced:
        # Devices idle in the current plan count as healthy again: the way back for a removed
        # straggler that has recovered.
        return [ProposePlan(dict(observation.rates))]
    if state.detection_paused or state.committed < state.version:
        return []  # one rollout at a time
    if state.step < state.committed_at + settings.cooldown_steps:
        return []  # let the new plan run before judging it
    actions: list = [AnnounceSlowLink(d) for d in observation.slow_links if (d, "link") not in state.announced]
    changed = moved(state.planned_rates, observation.rates, settings.replan_delta)
    if not changed and not links_moved(state.planned_links, observation.links, settings.link_delta):
        return actions
    actions += [
        AnnounceStraggler(d, r) for d, r in sorted(changed.items()) if r > 1.0 and (d, r) not in state.announced
    ]
    # Devices without a window now (idle in this plan) keep the rate they were last known by.
    actions.append(ProposePlan({**state.planned_rates, **observation.rates}))
    return actions


def _judge(state: JobState, observation: Observation, settings: DetectorSettings):
    p = observation.proposal
    if observation.forced:
        return PushPlan(p.plan, p.rates, observation.forced, p.links)
    changed = moved(state.planned_rates, p.rates, settings.replan_delta)
    links = links_moved(state.planned_links, p.links, settings.link_delta)
    shown = {k: round(g, 4) for k, g in links.items()}
    what = f"rates {changed}" + (f" and links {shown} Gbps" if links else "")
    reasons = [f"rates moved: {changed}"] if changed or not links else []
    why = "; ".join(reasons + ([f"links measured: {shown} Gbps"] if links else []))
    remaining = max(0, state.steps - state.step - 1)
    per_step = p.current_step_s - p.proposed_step_s
    details = {
        "rates": changed,
        "links": links,
        "current_step_s": p.current_step_s,
        "proposed_step_s": p.proposed_step_s,
        "gain_s": per_step * remaining,
        "migration_s": p.migration_s,
        "steps_left": remaining,
    }
    if per_step < settings.min_gain * p.current_step_s:
        return SkipPlan(
            p.rates,
            f"the best plan for {what} predicts {p.proposed_step_s:.3g} s a step "
            f"against {p.current_step_s:.3g} s now: less than the {settings.min_gain:.0%} "
            f"minimum gain",
            details,
            p.links,
        )
    if per_step * remaining <= p.migration_s:
        return SkipPlan(
            p.rates,
            f"a new plan for {what} would save {per_step * remaining:.3g} s over "
            f"the {remaining} steps left, not more than its {p.migration_s:.3g} s migration",
            details,
            p.links,
        )
    return PushPlan(
        p.plan,
        p.rates,
        f"{why}; predicted gain {per_step * remaining:.3g} s over {remaining} steps > migration {p.migration_s:.3g} s",
        p.links,
    )
