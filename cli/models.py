"""Model files as the CLI reads them. A custom model's code (family custom,
docs/models.md) is imported from the model file's folder, here on the user's
machine, and its parameters are counted from its built parts: the control
plane and the planner never import user code."""

from __future__ import annotations

import sys
from pathlib import Path

from drover.planner.model import ModelSpec, model_from_dict
from drover.planner.spec_io import load_mapping


class ModelReader:
    """Completes each model the CLI reads (jobfile's `complete` hook) and remembers what a
    local cluster's agents need to build the custom ones: folders to import from, modules."""

    def __init__(self):
        self.folders: list[str] = []
        self.modules: list[str] = []

    def __call__(self, model_data: dict, path: Path) -> dict:
        if not isinstance(model_data, dict) or model_data.get("family") != "custom":
            return model_data
        from drover.agent.runtime.custom import with_counts  # torch loads only for custom models

        folder = str(path.parent.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
            self.folders.append(folder)
        module = str(model_data.get("entry_point", "")).partition(":")[0]
        if module and module not in self.modules:
            self.modules.append(module)
        return with_counts(model_data, str(path))


def read_model(path: str | Path, reader: ModelReader | None = None) -> ModelSpec:
    """A model file, a custom one with its counts."""
    path = Path(path)
    return model_from_dict((reader or ModelReader())(load_mapping(path, "model"), path), str(path))
