"""The contract below the control plane and the agent: the planner (pure
functions over dataclasses, no I/O beyond reading spec files, no asyncio),
the cluster, model and plan types, and their wire conversions
(`drover.planner.wire`). Both processes import this package, never each other.

    from drover.planner import load_cluster, load_model, make_plan, evaluate
    plan = make_plan(load_cluster("c.yaml"), load_model("m.yaml"))
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from .compiled import load_compiled

# The search's modules load compiled where `drover compile-planner` built them (compiled.py).
COMPILED_MODULES = load_compiled(__name__, Path(__file__).resolve().parent)

# Exported names, each imported from its module when first read (PEP 562): a process that only
# needs the errors or the wire conversions (the client library, `drover job list`) does not load
# the search and numpy, about 0.4 s of each command's start.
_MODULE_OF = {
    **dict.fromkeys(("Cluster", "Device", "Gpu", "Nic", "Node", "cluster_from_dict", "load_cluster"), "cluster"),
    **dict.fromkeys(("Breakdown", "evaluate", "validate"), "cost"),
    **dict.fromkeys(("PlanError", "SpecError"), "errors"),
    **dict.fromkeys(("ModelSpec", "load_model", "model_from_dict"), "model"),
    **dict.fromkeys(("Pipeline", "Plan", "Predicted", "Stage", "load_plan", "plan_from_dict"), "plan"),
    **dict.fromkeys(("STRATEGIES", "make_plan"), "search"),
    **dict.fromkeys(("Events", "load_events", "migration_seconds"), "simulate"),
}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from .cluster import Cluster, Device, Gpu, Nic, Node, cluster_from_dict, load_cluster
    from .cost import Breakdown, evaluate, validate
    from .errors import PlanError, SpecError
    from .model import ModelSpec, load_model, model_from_dict
    from .plan import Pipeline, Plan, Predicted, Stage, load_plan, plan_from_dict
    from .search import STRATEGIES, make_plan
    from .simulate import Events, load_events, migration_seconds

__all__ = [
    "Breakdown",
    "Cluster",
    "Device",
    "Events",
    "Gpu",
    "ModelSpec",
    "Nic",
    "Node",
    "Pipeline",
    "Plan",
    "PlanError",
    "Predicted",
    "STRATEGIES",
    "SpecError",
    "Stage",
    "cluster_from_dict",
    "evaluate",
    "load_cluster",
    "load_events",
    "load_model",
    "load_plan",
    "make_plan",
    "migration_seconds",
    "model_from_dict",
    "plan_from_dict",
    "validate",
]
