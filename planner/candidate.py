"""A candidate plan inside the search: stages resolved to costs, scored once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .assignment import assign_micro_batches
from .cluster import Cluster
from .cost import StageCost, dp_sync_s, pipeline_terms, stage_sync_bws, with_prediction
from .grouping import Group
from .model import ModelSpec
from .orchestration import Partition, network_crossings, network_runs, networks_in_one_order, partition_layers
from .plan import Pipeline, Plan, Stage

# Splitting a layout again by its stages' sync bandwidths moves its step by a few percent: a split
# further behind the fastest than this is not split again. In the 64-GPU generated scenarios on two
# networks (seed 0), a split behind the fastest overtook the fastest's own re-split in 24 of 1,999
# layouts, 2.4% behind at the median and 4.5% at the 90th percentile; with 5%, no plan of the 81
# scenarios on two networks changed, and planning took 5% less time.
RESPLIT_BAND = 1.05


@dataclass
class Candidate:
    devices: list[list[tuple[str, ...]]]  # per pipeline, per stage: the TP group
    costs: list[list[StageCost]]
    micro_batches: list[int]
    removed: list[str]
    step_time_s: float

    def to_plan(self, strategy: str, cluster: Cluster, model: ModelSpec) -> Plan:
        pipelines = tuple(
            Pipeline(m, tuple(Stage(ids, (c.start, c.end)) for ids, c in zip(row_ids, row)))
            for row_ids, row, m in zip(self.devices, self.costs, self.micro_batches)
        )
        plan = Plan(strategy, model.global_batch, model.micro_batch, pipelines, tuple(sorted(self.removed)))
        return with_prediction(plan, cluster, model)


def score(
    devices,
    costs,
    removed,
    model: ModelSpec,
    cluster: Cluster,
    micro_batches: list[int] | None = None,
    bound: float = math.inf,
) -> Candidate | None:
    """Assign micro-batches (unless given) and compute the step time of the cost model; None if
    the pipelines alone take longer than `bound` (the data-parallel sync is not worked out)."""
    terms = costs.terms if isinstance(costs, Partition) else [pipeline_terms(row, model, cluster) for row in costs]
    if micro_batches is None:
        micro_batches = assign_micro_batches([f for f, _ in terms], [e for _, e in terms], model.micro_batches)
        if micro_batches is None:
            return None
    slowest = max(f + (m - 1) * e for (f, e), m in zip(terms, micro_batches))
    if slowest > bound:
        return None
    step = slowest + dp_sync_s(costs, model, cluster)
    return Candidate(devices, costs, micro_batches, list(removed), step)


def best_partition(
    pipelines: list[list[Group]],
    costs: list[list[StageCost]],
    removed,
    model: ModelSpec,
    cluster: Cluster,
    every_crossing: bool = True,
    bound: float = math.inf,
    realign: bool = True,
) -> Candidate | None:
    """The layout scored as partitioned, and split again at each common network crossing
    (network_crossings; the median one alone unless `every_crossing`): the fastest. Pipelines
    of unlike depths are split again too, each stage weighing its gradient sync at the bandwidth
    its blocks' holders sync at (stages of one index hold unlike blocks), on clusters of more
    than one network: the splits within RESPLIT_BAND of the fastest. None if nothing fits, or
    if every split's pipelines alone take longer than `bound`."""
    devices = [[g.devices for g in pipe] for pipe in pipelines]
    scored = []
    for crossing in [None] + network_crossings(costs, cluster, every_crossing):
        split = costs if crossing is None else partition_layers(pipelines, model, cluster, crossings=crossing)
        if split is not None:
            scored.append((score(devices, split, removed, model, cluster, bound=bound), crossing, split))
    fitting = [found for found, _, _ in scored if found is not None]
    best = min(fitting, key=lambda found: found.step_time_s) if fitting else None
    # On one network the holders of a stage index sync at about one bandwidth whatever blocks
    # they hold: splitting again there changed one plan of 120 generated scenarios, by 0.06%.
    if len(cluster.nic_order) < 2:
        return best
    if best is not None and len({len(row) for row in costs}) > 1:
        near = best.step_time_s * RESPLIT_BAND
        for found, crossing, split in scored:
            if found is None or found.step_time_s > near:
                continue
            sync_bws = stage_sync_bws(split, cluster)
            again = partition_layers(pipelines, model, cluster, crossings=crossing, sync_bws=sync_bws)
            if again is not None and again != split:
                other = score(devices, again, removed, model, cluster, bound=bound)
                if other is not None and other.step_time_s < best.step_time_s:
                    best = other
    return _realigned(best, pipelines, removed, model, cluster, every_crossing, bound) if realign else best


def _realigned(best, pipelines, removed, model, cluster, every_crossing, bound) -> Candidate | None:
    """best, or the layout with its pipelines' stages grouped by network in one order for all
    (networks_in_one_order) if that scores better, where they pass through the networks in
    unlike orders."""
    orders = {tuple([cls for cls, _ in network_runs(tuple([g.node for g in pipe]), cluster)]) for pipe in pipelines}
    if len(orders) < 2:
        return best
    aligned = networks_in_one_order(pipelines, cluster)
    costs = None if aligned is None else partition_layers(aligned, model, cluster)
    if costs is None:
        return best
    other = best_partition(aligned, costs, removed, model, cluster, every_crossing, bound, realign=False)
    if other is not None and (best is None or other.step_time_s < best.step_time_s):
        return other
    return best
