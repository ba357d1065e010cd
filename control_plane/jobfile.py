"""Job files: the model (a path relative to the job file, or inline), steps and seed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec, model_from_dict
from drover.planner.spec_io import Fields, load_mapping


@dataclass(frozen=True)
class JobSpec:
    model: ModelSpec
    model_data: dict
    steps: int
    seed: int


def job_from_yaml(text: str, base_dir: str | Path = ".", source: str = "job") -> JobSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(source, "(file)", source, f"valid YAML ({exc})") from None
    f = Fields(data, source)
    f.reject_unknown({"name", "model", "steps", "seed"})
    raw_model = f.get("model")
    if isinstance(raw_model, str):
        model_path = Path(base_dir) / raw_model
        model_data = load_mapping(model_path, "model")
        model = model_from_dict(model_data, str(model_path))
    elif isinstance(raw_model, dict):
        model_data = raw_model
        model = model_from_dict(model_data, f"{source}: model")
    else:
        raise f.error("model", raw_model, "a model file path (relative to the job file) or the model inline")
    if model.family != "gpt":  # the planner plans llama; the workers build gpt blocks only, for now
        raise f.error("model.family", model.family, "gpt (the training runtime builds gpt blocks only)")
    return JobSpec(model, model_data, f.integer("steps"), f.integer("seed", 0, minimum=0))


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), "(file)", str(path), f"a readable job file ({exc.strerror})") from None
    return job_from_yaml(text, path.parent, str(path))
