"""Compile the planner's search to C extension modules with Cython, unchanged.

    .venv/bin/python scripts/build_planner_ext.py

The modules the search spends its time in (planner/compiled.py, COMPILED) are
compiled as they are written: no Cython types, so the Python source stays the
one truth and plans are the same device for device (tests/test_planner_compiled.py).
Measured side by side (bench/planner_versus.py): 64-GPU planning about 0.7 of the
pure-Python time, 1,024-GPU about 0.8.

The extension modules go into <venv>/drover-planner-ext/ with a manifest of each
source's SHA-256; drover.planner loads one only while its source is unchanged,
so an edit never runs stale code (it runs as Python until this runs again). Up
to date, this does nothing. Without Cython or a C compiler it says so and exits
0: the planner then runs as pure Python, only slower. The Makefile runs it
before `make run` and `make test`.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "planner"))

from compiled import COMPILED, ext_dir, manifest_entry  # noqa: E402  (planner/compiled.py, no package)


def up_to_date(out: Path) -> bool:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return all(manifest.get(name) == manifest_entry(ROOT / "planner", name) for name in COMPILED)


def build(out: Path) -> None:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    extensions = [
        # -O1: a third of -O2's compile time, and the same speed (the time is in CPython's calls).
        Extension(f"drover.planner.{name}", [str(ROOT / "planner" / f"{name}.py")], extra_compile_args=["-O1"])
        for name in COMPILED
    ]
    with tempfile.TemporaryDirectory() as scratch:
        modules = cythonize(
            extensions,
            build_dir=scratch,
            nthreads=2,
            quiet=True,
            language_level=3,
            # Annotations stay hints, as in Python (a list passed where a tuple is annotated).
            compiler_directives={"annotation_typing": False, "binding": False},
        )
        dist = Distribution({"ext_modules": modules})
        command = dist.get_command_obj("build_ext")
        command.build_lib, command.build_temp, command.parallel = scratch + "/lib", scratch + "/tmp", 2
        command.ensure_finalized()
        command.run()
        built = Path(scratch) / "lib" / "drover" / "planner"
        staging = out.with_name(out.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        manifest = {}
        for name in COMPILED:
            (library,) = built.glob(f"{name}.*")
            shutil.copy2(library, staging / library.name)
            manifest[name] = manifest_entry(ROOT / "planner", name)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def main() -> int:
    out = ext_dir()
    if up_to_date(out):
        return 0
    started = time.monotonic()
    try:
        build(out)
    except Exception as exc:  # no Cython, no compiler: the planner runs as Python
        shutil.rmtree(out, ignore_errors=True)
        print(f"planner not compiled ({type(exc).__name__}: {exc}); it runs as pure Python", file=sys.stderr)
        return 0
    print(f"planner compiled into {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
