"""The Drover planner: a search over the three phases, judged by the cost model.

Round one tries every tensor-parallel size, a spread of pipeline depths and
both arrangements with stragglers grouped apart and none removed. Round two
takes the best few layouts and tries removing GPUs past each straggling rate
present and grouping without splitting. The baselines are candidates too, so
Drover's plan is never worse than what a Megatron-style job would run.
"""

from __future__ import annotations

import math

from . import baselines
from .candidate import Candidate, score
from .cluster import Cluster
from .errors import PlanError
from .grouping import form_groups, tp_degrees
from .model import ModelSpec
from .orchestration import ARRANGEMENTS, arrange, partition_layers
from .plan import Plan

SPLIT_RATIO = 1.1  # GPUs within 10% of each other share a TP group
FINALISTS = 3


def stage_counts(layers: int, groups: int) -> list[int]:
    """Pipeline depths worth trying: every depth up to 8, then about 25% apart."""
    top = min(layers, groups)
    depths, s = [], 1
    while s <= top:
        depths.append(s)
        s = s + 1 if s < 8 else max(s + 1, round(s * 1.25))
    if top not in depths:
        depths.append(top)
    return depths


def _layout(cluster: Cluster, model: ModelSpec, t: int, S: int, how: str,
            split: float, cut: float) -> Candidate | None:
    groups, removed = form_groups(cluster, model, t, split, cut)
    if not groups:
        return None
    pipelines = arrange(groups, S, how, cluster)
    costs = partition_layers(pipelines, model, cluster)
    if costs is None:
        return None
    devices = [[g.devices for g in pipe] for pipe in pipelines]
    return score(devices, costs, removed, model, cluster)


def search(cluster: Cluster, model: ModelSpec) -> Candidate:
    if not cluster.usable:
        raise PlanError("no-usable-device", f"every device of cluster {cluster.name!r} has failed")
    found: list[tuple[float, tuple, Candidate]] = []

    def consider(key: tuple, candidate: Candidate | None) -> None:
        if candidate is not None:
            found.append((candidate.step_time_s, key, candidate))

    for t in tp_degrees(cluster, model):
        groups = len(form_groups(cluster, model, t, SPLIT_RATIO)[0])
        for S in stage_counts(model.layers, groups):
            for how in ARRANGEMENTS:
                key = (t, S, how, SPLIT_RATIO, math.inf)
                consider(key, _layout(cluster, model, *key))
    rates = sorted({d.rate for d in cluster.usable if d.rate > 1.0})
    finalists = sorted(found, key=lambda f: f[0])[:FINALISTS]
    for _, (t, S, how, _, _), _ in finalists:
        for split in (SPLIT_RATIO, math.inf):
            for cut in rates + [math.inf]:
                if (split, cut) != (SPLIT_RATIO, math.inf):
                    consider((t, S, how, split, cut), _layout(cluster, model, t, S, how, split, cut))
    for name, baseline in (("uniform", baselines.uniform), ("drop", baselines.drop)):
        consider((name,), baseline(cluster, model))
    if not found:
        raise PlanError("no-feasible-plan", f"model {model.name!r} fits in memory under no plan on "
                                            f"cluster {cluster.name!r}")
    return min(found, key=lambda f: f[0])[2]


STRATEGIES = {
    "drover": search,
    "uniform": baselines.uniform,
    "drop": baselines.drop,
}


def make_plan(cluster: Cluster, model: ModelSpec, strategy: str = "drover") -> Plan:
    """The plan of a strategy, with the cost model's predicted figures."""
    if strategy not in STRATEGIES:
        raise PlanError("unknown-strategy", f"strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    candidate = STRATEGIES[strategy](cluster, model)
    if candidate is None:
        raise PlanError("no-feasible-plan", f"strategy {strategy!r} finds no plan that fits for model "
                                            f"{model.name!r} on cluster {cluster.name!r}")
    return candidate.to_plan(strategy, cluster, model)
