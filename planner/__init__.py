"""The contract below the control plane and the agent: the planner (pure
functions over dataclasses, no I/O beyond reading spec files, no asyncio),
the cluster, model and plan types, and their wire conversions
(`drover.planner.wire`). Both processes import this package, never each other.

    from drover.planner import load_cluster, load_model, make_plan, evaluate
    plan = make_plan(load_cluster("c.yaml"), load_model("m.yaml"))
"""

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
