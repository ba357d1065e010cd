"""A candidate plan inside the search: stages resolved to costs, scored once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .assignment import assign_micro_batches
from .cluster import Cluster
from .cost import StageCost, dp_sync_s, pipeline_terms, stage_sync_bws, with_prediction
from .grouping import Group
from .model import ModelSpec
from .orchestration import Partition, network_crossings, partition_layers
from .plan import Pipeline, Plan, Stage


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
) -> Candidate | None:
    """The layout scored as partitioned, and split again at each common network crossing
    (network_crossings; the median one alone unless `every_crossing`): the fastest. Pipelines
    of unlike depths are split again too, each stage weighing its gradient sync at the bandwidth
    its blocks' holders sync at (stages of one index hold unlike blocks), on clusters of more
    than one network. None if nothing fits, or if every split's pipelines alone take longer
    than `bound`."""
    devices = [[g.devices for g in pipe] for pipe in pipelines]
    # On one network the holders of a stage index sync at about one bandwidth whatever blocks
    # they hold: splitting again there changed one plan of 120 generated scenarios, by 0.06%.
    unlike = len(cluster.nic_order) > 1 and len({len(row) for row in costs}) > 1
    best = None
    for crossing in [None, *network_crossings(costs, cluster, every_crossing)]:
        split = costs if crossing is None else partition_layers(pipelines, model, cluster, crossings=crossing)
        if split is None:
            continue
        splits = [split]
        if unlike:
            again = partition_layers(
                pipelines, model, cluster, crossings=crossing, sync_bws=stage_sync_bws(split, cluster)
            )
            if again is not None and again != split:
                splits.append(again)
        for split in splits:
            found = score(devices, split, removed, model, cluster, bound=bound)
            if found is not None and (best is None or found.step_time_s < best.step_time_s):
                best = found
    return best
