"""The search's modules as C extensions, where `drover compile-planner` built them.

Cython compiles the modules below as written (no types added), which plans the
same plans in about 0.7 of the time at 64 GPUs. The build lives outside the
source tree (<venv>/drover-planner-ext/), with each source's SHA-256: a module
loads compiled only while its source is byte for byte the one it was built from,
so an edited module runs as the Python it now says, never as a stale build.
DROVER_PLANNER_PURE=1 runs every module as Python (bench/planner_versus.py
compares versions so; a profiler or debugger sees Python frames then). The
build (cli/compile_planner.py) reads COMPILED and manifest_entry from here.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path

# Where planning spends its time; the rest (specs, wire, simulation) gains nothing compiled.
COMPILED = (
    "assignment",
    "candidate",
    "cluster",
    "cost",
    "grouping",
    "orchestration",
    "polish",
    "search",
    "walk",
    "walk_moves",
    "walk_space",
    "walk_state",
)
PURE_ENV = "DROVER_PLANNER_PURE"
PACKAGE = "drover.planner"
UNAVAILABLE = "unavailable.json"  # in ext_dir(): why nothing was compiled (no compiler, ...)


def ext_dir() -> Path:
    return Path(sys.prefix) / "drover-planner-ext"


def manifest_entry(source_dir: Path, name: str) -> dict:
    """What a module's build is valid for: its source's bytes and this interpreter's ABI."""
    source = (source_dir / f"{name}.py").read_bytes()
    return {"sha256": hashlib.sha256(source).hexdigest(), "abi": sysconfig.get_config_var("EXT_SUFFIX")}


class _Loader(importlib.machinery.ExtensionFileLoader):
    """A compiled module's loader that also gives its Python source: a traceback through compiled
    code names the source as the build saw it (drover-planner/search.py), and reads its lines here."""

    def __init__(self, fullname: str, library: Path, source: Path) -> None:
        super().__init__(fullname, str(library))
        self.source = source

    def get_source(self, fullname: str) -> str:
        return self.source.read_text()


class _Finder:
    """Finds the compiled modules named at install (a meta path finder ahead of the file system's)."""

    def __init__(self, libraries: dict[str, tuple[Path, Path]]) -> None:
        self.libraries = libraries  # module -> (its build, its source)

    def find_spec(self, fullname: str, path=None, target=None):
        library, source = self.libraries.get(fullname, (None, None))
        if library is None or not library.is_file():  # gone since (a rebuild swapping it): the .py
            return None
        return importlib.util.spec_from_file_location(fullname, library, loader=_Loader(fullname, library, source))


def load_compiled(package: str, source_dir: Path, where: Path | None = None) -> tuple[str, ...]:
    """Have the modules of COMPILED whose build matches their source load compiled; the names of
    those that will. Only for drover.planner itself (another copy, say another git revision's
    in bench/planner_versus.py, runs as Python), and not under DROVER_PLANNER_PURE."""
    if package != PACKAGE or os.environ.get(PURE_ENV, "0") != "0":
        return ()
    where = ext_dir() if where is None else where
    try:
        manifest = json.loads((where / "manifest.json").read_text())
    except (OSError, ValueError):  # never built, or no compiler where it was
        return ()
    libraries = {}
    for name in COMPILED:
        library = where / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
        if manifest.get(name) == manifest_entry(source_dir, name) and library.is_file():
            libraries[f"{package}.{name}"] = (library, source_dir / f"{name}.py")
    for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(finder)
    if libraries:
        sys.meta_path.insert(0, _Finder(libraries))
    return tuple(name.rsplit(".", 1)[1] for name in libraries)
