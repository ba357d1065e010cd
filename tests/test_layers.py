"""The import contract: each layer imports only the layers below it, and the
two processes (control plane, agent) never import each other.

import-linter cannot see this layout: the `drover` namespace's packages live
in separate top-level folders (see pyproject's package-dir), and grimp only
scans the root package's own folder. So the graph is read here, from the
source with `ast`, with the same strength: every import of every module,
absolute or relative, at any depth (imports inside functions included).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, parse_python

# package -> its folder
FOLDERS = {
    "drover.v1": ROOT / "protos" / "drover" / "v1",
    "drover.planner": ROOT / "planner",
    "drover.storage": ROOT / "storage",
    "drover.metrics": ROOT / "metrics",
    "drover.client": ROOT / "client",
    "drover.control_plane": ROOT / "control_plane",
    "drover.agent": ROOT / "agent",
    "drover.cli": ROOT / "cli",
}
# package -> the drover packages it may import (besides itself)
ALLOWED = {
    "drover.v1": set(),
    "drover.planner": {"drover.v1"},
    "drover.storage": set(),
    "drover.metrics": set(),
    # reads a job file as the CLI does (control_plane.jobfile: parsing, no server)
    "drover.client": {"drover.v1", "drover.planner", "drover.control_plane"},
    "drover.control_plane": {"drover.v1", "drover.planner", "drover.storage", "drover.metrics"},
    "drover.agent": {"drover.v1", "drover.planner", "drover.metrics"},
    "drover.cli": {
        *("drover.v1", "drover.planner", "drover.storage", "drover.metrics", "drover.control_plane"),
        *("drover.agent", "drover.client"),
    },
}
# package -> third-party modules it must not import: the planner stays pure, the control
# plane never loads torch, the agent never opens the database.
FORBIDDEN_EXTERNAL = {
    "drover.planner": {"torch", "grpc", "sqlalchemy", "asyncio"},
    "drover.storage": {"torch", "grpc"},
    "drover.metrics": {"torch", "grpc", "sqlalchemy"},
    "drover.client": {"torch", "sqlalchemy"},
    "drover.control_plane": {"torch"},
    "drover.agent": {"sqlalchemy"},
}


def imports_of(package: str, folder: Path) -> list[tuple[str, str]]:
    """(module file, imported module name) for every import under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        relative = path.relative_to(folder).with_suffix("")
        parts = package.split(".") + [p for p in relative.parts if p != "__init__"]
        is_package = path.name == "__init__.py"
        for node in ast.walk(parse_python(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts if is_package else parts[:-1]
                    base = base[: len(base) - node.level + 1]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module
                found.append((str(path.relative_to(ROOT)), name))
    return found


def layer_of(module: str) -> str | None:
    return next((p for p in FOLDERS if module == p or module.startswith(p + ".")), None)


@pytest.mark.parametrize("package", FOLDERS)
def test_layer_imports_only_what_lies_below(package):
    wrong = []
    for where, name in imports_of(package, FOLDERS[package]):
        target = layer_of(name)
        top = name.split(".")[0]
        if target is not None and target != package and target not in ALLOWED[package]:
            wrong.append(f"{where} imports {name}")
        elif target is None and top in ("control_plane", "agent", "storage", "planner", "cli"):
            wrong.append(f"{where} imports {name} outside the drover namespace")
        elif top in FORBIDDEN_EXTERNAL.get(package, ()):
            wrong.append(f"{where} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_contract_reads_relative_imports():
    """A guard on the guard: the reader resolves `from ..x import y` to the right package."""
    names = {name for _, name in imports_of("drover.agent", FOLDERS["drover.agent"])}
    assert "drover.agent.runtime.model" in names or "drover.agent.runtime" in names
    assert any(n.startswith("drover.planner") for n in names)


def modules_after_importing(modules: str) -> set[str]:
    """sys.modules of a fresh interpreter once it has imported `modules` (comma-separated)."""
    check = f"import json, sys, {modules}; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return set(json.loads(run.stdout))


def test_the_daemons_start_without_torch():
    """The agent starts, feeds and watches workers; torch (seconds to import, hundreds of MB)
    is loaded by its worker launcher, and the control plane never needs it."""
    loaded = modules_after_importing(
        "drover.cli, drover.agent.daemon, drover.agent.supervisor, drover.control_plane.server"
    )
    assert sorted(m for m in loaded if m.split(".")[0] == "torch")[:3] == []


def test_the_worker_launcher_imports_only_what_every_job_uses():
    """Every agent's launcher imports the workers' code once; a checkpoint's libraries (DCP,
    DTensor) load where a checkpoint is written or read, and the meta-device build of the parts
    runs no initialiser (on meta, torch._refs would import torch._dynamo): seconds a cluster
    start paid per node."""
    loaded = modules_after_importing("drover.agent.runtime.worker, drover.agent.runtime.preload")
    assert loaded.isdisjoint({"torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor"})


def test_the_client_library_starts_without_the_search():
    """A scheduler that imports drover.client (and reads a plan's wire form or an error) does
    not load the planner's search or numpy: drover.planner exports its names lazily."""
    loaded = modules_after_importing("drover.client, drover.planner.errors, drover.planner.wire")
    assert loaded.isdisjoint({"drover.planner.search", "drover.planner.walk", "numpy"})
