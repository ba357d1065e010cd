"""The plan: pipelines of stages, each stage a tensor-parallel group holding a
contiguous block range (section 3 of the cost model), and its JSON form."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError
from .spec_io import MAX_INTEGER, Fields, load_mapping


@dataclass(frozen=True)
class Stage:
    devices: tuple[str, ...]
    layers: tuple[int, int]  # half-open [start, end)

    @property
    def n(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class Pipeline:
    micro_batches: int
    stages: tuple[Stage, ...]


@dataclass(frozen=True)
class Predicted:
    step_time_s: float
    samples_per_s: float
    ideal_samples_per_s: float


@dataclass(frozen=True)
class Plan:
    strategy: str
    global_batch: int
    micro_batch: int
    pipelines: tuple[Pipeline, ...]
    removed: tuple[str, ...] = ()
    predicted: Predicted | None = field(default=None, compare=False)

    @property
    def devices(self) -> list[str]:
        return [d for p in self.pipelines for s in p.stages for d in s.devices]

    def to_dict(self) -> dict:
        out = {
            "strategy": self.strategy,
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "pipelines": [
                {
                    "micro_batches": p.micro_batches,
                    "stages": [{"devices": list(s.devices), "layers": list(s.layers)} for s in p.stages],
                }
                for p in self.pipelines
            ],
            "removed": list(self.removed),
        }
        if self.predicted is not None:
            out["predicted"] = {
                "step_time_s": self.predicted.step_time_s,
                "samples_per_s": self.predicted.samples_per_s,
                "ideal_samples_per_s": self.predicted.ideal_samples_per_s,
            }
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plan_from_dict(data: dict, source: str = "plan") -> Plan:
    """Parse the JSON form. Structure errors raise SpecError; the rules of a
    valid plan are checked by `cost.validate`, which needs the cluster."""
    f = Fields(data, source)
    f.reject_unknown({"strategy", "global_batch", "micro_batch", "pipelines", "removed", "predicted"})
    pipelines = []
    raw_pipelines = f.items("pipelines")
    if not raw_pipelines:
        raise f.error("pipelines", raw_pipelines, "a non-empty list of pipelines")
    for i, raw in enumerate(raw_pipelines):
        p = Fields(raw, source, f"pipelines[{i}]")
        p.reject_unknown({"micro_batches", "stages"})
        stages = []
        raw_stages = p.items("stages")
        if not raw_stages:
            raise p.error("stages", raw_stages, "a non-empty list of stages")
        for j, raw_stage in enumerate(raw_stages):
            s = Fields(raw_stage, source, f"pipelines[{i}].stages[{j}]")
            s.reject_unknown({"devices", "layers"})
            devices = s.items("devices")
            if not devices or not all(isinstance(d, str) for d in devices):
                raise s.error("devices", devices, "a non-empty list of device ids NODE/INDEX")
            layers = s.items("layers")
            if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
                raise s.error("layers", layers, "[start, end], two integers (half-open block range)")
            stages.append(Stage(tuple(devices), (layers[0], layers[1])))
        micro = p.get("micro_batches")
        # Any integer parses (validate names rule 4 for one below 1); anything else is no count.
        if isinstance(micro, bool) or not isinstance(micro, int) or abs(micro) > MAX_INTEGER:
            raise p.error("micro_batches", micro, "an integer >= 1 (rule 4: each pipeline's share of M)")
        pipelines.append(Pipeline(micro, tuple(stages)))
    removed = f.items("removed", [])
    if not all(isinstance(d, str) for d in removed):
        raise f.error("removed", removed, "a list of device ids NODE/INDEX")
    predicted = None
    if "predicted" in data:
        pr = f.mapping("predicted")
        predicted = Predicted(pr.number("step_time_s"), pr.number("samples_per_s"), pr.number("ideal_samples_per_s"))
    return Plan(
        strategy=f.string("strategy", "unnamed"),
        global_batch=f.integer("global_batch"),
        micro_batch=f.integer("micro_batch"),
        pipelines=tuple(pipelines),
        removed=tuple(removed),
        predicted=predicted,
    )


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(load_mapping(path, "plan"), str(path))


__all__ = ["Stage", "Pipeline", "Plan", "Predicted", "plan_from_dict", "load_plan", "SpecError"]
