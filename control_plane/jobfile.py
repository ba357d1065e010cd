"""Job files: the model (inline, or a path relative to the job file), and how
it trains (steps, seed, optimizer, schedule, data, init, checkpoint, eval,
precision: drover.planner.training, which imports no torch).

Over the network a job is a drover.v1.JobSpec, whose fields are the job
file's keys with the model inline: the CLI reads the files where the user
runs it (`read_job_file`) and the server never opens a path it was sent
(`job_from_spec`). The deprecated YAML form (`job_from_wire`, also how a
stored job is read back) may not use aliases, so a few hundred bytes cannot
expand into gigabytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec, model_from_dict
from drover.planner.spec_io import Fields, SpecLoader, load_mapping, one_line_error
from drover.planner.training import TRAINING_KEYS, Training, training_from_job
from drover.planner.wire import message_to_fields
from drover.v1 import jobspec_pb2

MAX_JOB_BYTES = 64 * 1024  # a job with its model inline is a few hundred bytes


@dataclass(frozen=True)
class Resources:
    """What a job asks for: whole nodes, or a number of devices; neither: every free device."""

    nodes: int = 0
    devices: int = 0

    def to_dict(self) -> dict:
        return {k: v for k, v in (("nodes", self.nodes), ("devices", self.devices)) if v}


@dataclass(frozen=True)
class Recoveries:
    """How many losses a job survives: at most `max` recoveries within `within_steps` steps;
    one more fails it (something is wrong beyond a failing device)."""

    max: int = 3
    within_steps: int = 1000


@dataclass(frozen=True)
class JobSpec:
    model: ModelSpec
    model_data: dict
    training: Training
    resources: Resources = Resources()
    recoveries: Recoveries = Recoveries()
    name: str = ""

    @property
    def steps(self) -> int:
        return self.training.steps

    @property
    def seed(self) -> int:
        return self.training.seed

    def wire_dict(self) -> dict:
        """The job as job_from_wire reads it back: the model inline, everything else as given."""
        resources = {"resources": self.resources.to_dict()} if self.resources.to_dict() else {}
        recoveries = {"recoveries": {"max": self.recoveries.max, "within_steps": self.recoveries.within_steps}}
        name = {"name": self.name} if self.name else {}
        return name | {"model": self.model_data} | self.training.to_dict() | resources | recoveries

    def full_dict(self) -> dict:
        """wire_dict with the model's defaults filled in too: the job as it runs."""
        model = {k: v for k, v in asdict(self.model).items() if v not in ("", None)}
        return self.wire_dict() | {"model": model}

    def workers_json(self) -> str:
        """What StartJob.model_yaml carries to the agents (agent/supervisor.py's worker_job reads it)."""
        return json.dumps({"model": self.model_data} | self.training.to_dict())


class _NoAliasLoader(SpecLoader):
    """Safe YAML without aliases (the billion-laughs expansion)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)


def job_from_wire(text: str, source: str = "job_yaml") -> JobSpec:
    """A job sent over the network: bounded, alias-free, the model inline."""
    if len(text.encode()) > MAX_JOB_BYTES:
        raise SpecError(source, "(file)", f"{len(text.encode())} bytes", f"at most {MAX_JOB_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # nesting too deep, numbers too long
        raise SpecError(source, "(file)", source, f"plain YAML without aliases ({one_line_error(exc)[:200]})") from None
    return _job(data, source, base_dir=None)


def job_from_stored(text: str, source: str) -> JobSpec:
    """A job as the control plane stored it: its checked mapping as JSON (job_from_wire
    reads the rows of older versions, stored as YAML)."""
    try:
        data = json.loads(text)
    except ValueError:
        return job_from_wire(text, source)
    return _job(data, source, base_dir=None)


def job_from_spec(message: jobspec_pb2.JobSpec, source: str = "spec") -> JobSpec:
    """A job sent as a JobSpec: checked as a job file with the same fields would be."""
    # proto3 does not carry a zero: steps 0 would read as missing ("= None") rather than as 0.
    return _job({"steps": message.steps} | message_to_fields(message), source, base_dir=None)


# A model's fields, completed where the files are read (the CLI counts a custom model's
# parameters from its built parts: cli/models.py); given the path the model came from.
Complete = Callable[[dict, Path], dict]


def _as_given(model_data: dict, path: Path) -> dict:
    return model_data


def _job(data, source: str, base_dir: Path | None, complete: Complete = _as_given) -> JobSpec:
    f = Fields(data, source)
    f.reject_unknown({"name", "model", "resources", "recoveries"} | TRAINING_KEYS)
    name = f.get("name", "")
    if not isinstance(name, (str, int, float)) or isinstance(name, bool):
        raise f.error("name", name, "a name of at most 128 printable characters")
    name = f.name("name", str(name))  # before the model's, which an inline model takes from it
    raw_model = f.get("model")
    if isinstance(raw_model, str) and base_dir is not None:
        model_path = base_dir / raw_model
        model_data = complete(load_mapping(model_path, "model"), model_path)
        model = model_from_dict(model_data, str(model_path))
    elif isinstance(raw_model, dict):
        raw_model = {"name": name or "model"} | raw_model  # an inline model is named by its job
        model_data = complete(raw_model, Path(source)) if base_dir is not None else raw_model
        model = model_from_dict(model_data, f"{source}: model")
    elif base_dir is None:
        raise f.error("model", raw_model, "the model inline: the server opens no paths (the CLI inlines model files)")
    else:
        raise f.error("model", raw_model, "a model file path (relative to the job file) or the model inline")
    resources = Resources()
    if "resources" in f.data:
        r = f.mapping("resources")
        r.reject_unknown({"nodes", "devices"})
        if len(r.data) > 1:
            raise f.error("resources", r.data, "one of {nodes: N} or {devices: N} (neither: every free device)")
        nodes = r.integer("nodes", maximum=65536) if "nodes" in r.data else 0
        resources = Resources(nodes, r.integer("devices", maximum=1 << 20) if "devices" in r.data else 0)
    recoveries = Recoveries()
    if "recoveries" in f.data:
        r = f.mapping("recoveries")
        r.reject_unknown({"max", "within_steps"})
        recoveries = Recoveries(r.integer("max", 3, minimum=0, maximum=1000), r.integer("within_steps", 1000))
    return JobSpec(model, model_data, training_from_job(f), resources, recoveries, name)


def load_job(path: str | Path, complete: Complete = _as_given) -> JobSpec:
    """A job file on this machine; its model path is relative to the file."""
    path = Path(path)
    return _job(load_mapping(path, "job"), str(path), path.parent, complete)


def read_job_file(path: str | Path, resume: str | None = None, complete: Complete = _as_given) -> dict:
    """A job file as the server takes it: its mapping with the model inline (read here), and
    `resume` (a checkpoint directory under the agents' data root) if given; what
    drover.client.job_spec turns into a JobSpec."""
    path = Path(path)
    data = load_mapping(path, "job")
    if resume:
        data["resume"] = resume
    job = _job(dict(data), str(path), path.parent, complete)  # checked here: a bad file fails where the user can fix it
    return job.wire_dict()
