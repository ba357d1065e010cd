"""`drover compile-planner`: the planner's search compiled to C extension modules by Cython, unchanged.

The modules the search spends its time in (planner/compiled.py, COMPILED) are
compiled as they are written: no Cython types, so the Python source stays the
one truth and plans are the same device for device (tests/planner/test_compiled.py).
Measured side by side (bench/planner_versus.py): 64-GPU planning about 0.7 of the
pure-Python time, 1,024-GPU about 0.8.

The extension modules go into <venv>/drover-planner-ext/ with a manifest of each
source's SHA-256 and of this build's settings; drover.planner loads one only while
its source is unchanged, so an edit never runs stale code (it runs as Python until
this runs again). Up to date, this does nothing. The Makefile runs it (through
scripts/build_planner_ext.py) before `make run`, `make test` and `make bench`; an
install from a wheel runs `drover compile-planner` once. With --source, it compiles
another copy of the planner's sources.

Without Cython, a C compiler or Python's headers it says so, records why
(unavailable.json) and exits 0: the planner then runs as pure Python, only
slower. A module Cython or the compiler rejects is an error (exit 1): these
modules must stay within the Python Cython compiles (no starred item in a list
display, for one), and a planner left slower unnoticed is a regression.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import click

from drover import planner
from drover.planner.compiled import COMPILED, UNAVAILABLE, ext_dir, manifest_entry

# The sources drover.planner loads from: this checkout's planner/, or an installed drover's.
SOURCE = Path(planner.__file__).resolve().parent

# -O1: a third of -O2's compile time, and the same speed (the time is in CPython's calls).
COMPILE_ARGS = ["-O1"]
# Annotations stay hints, as in Python (a list passed where a tuple is annotated).
DIRECTIVES = {"annotation_typing": False, "binding": False}


def missing_toolchain() -> str | None:
    """What this machine lacks to compile, if anything."""
    try:
        import Cython  # noqa: F401
    except ImportError:
        return "no Cython (pip install -e '.[compiled]')"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]  # as setuptools picks
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h; python3-dev on Debian)"
    return None


def build_settings() -> str:
    """What a build depends on besides the sources and the ABI (each module's manifest_entry):
    Cython's version and this script."""
    import Cython

    return hashlib.sha256(Cython.__version__.encode() + Path(__file__).read_bytes()).hexdigest()


def up_to_date(out: Path, source: Path) -> bool:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("build") != build_settings():
        return False
    return all(manifest.get(name) == manifest_entry(source, name) for name in COMPILED)


def build(out: Path, source: Path) -> None:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    with tempfile.TemporaryDirectory() as scratch:
        # Cython names a source in tracebacks by its path relative to where it ran, and a traceback
        # read elsewhere showed whatever file that path reached from there (another checkout's).
        # Named drover-planner/NAME.py, found nowhere, its lines come from the module's loader
        # (planner/compiled.py), which reads the source the build was made from.
        (Path(scratch) / "drover-planner").symlink_to(source)
        extensions = [
            Extension(f"drover.planner.{name}", [f"drover-planner/{name}.py"], extra_compile_args=COMPILE_ARGS)
            for name in COMPILED
        ]
        with contextlib.chdir(scratch):
            modules = cythonize(  # the C beside "drover-planner" (in c/), not through it into planner/
                extensions, build_dir="c", nthreads=2, quiet=True, language_level=3, compiler_directives=DIRECTIVES
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
        manifest = {"build": build_settings()}
        for name in COMPILED:
            (library,) = built.glob(f"{name}.*")
            shutil.copy2(library, staging / library.name)
            manifest[name] = manifest_entry(source, name)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def main(source: Path = SOURCE) -> int:
    """Build unless up to date (0), or record why this machine cannot (0); 1 if Cython or the
    compiler refused a module."""
    out = ext_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds at once (make -j, two checkouts' make test) take turns
        lacking = missing_toolchain()
        if lacking:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            (out / UNAVAILABLE).write_text(json.dumps({"reason": lacking}) + "\n")
            print(f"planner not compiled: {lacking}; it runs as pure Python, only slower", file=sys.stderr)
            return 0
        if up_to_date(out, source):
            return 0
        started = time.monotonic()
        try:
            build(out, source)
        except Exception as exc:  # noqa: BLE001 - whatever Cython or the compiler refused
            shutil.rmtree(out, ignore_errors=True)
            print(
                f"planner/: Cython or the C compiler refused it ({type(exc).__name__}: {exc}; the lines above say "
                f"where). Keep {', '.join(COMPILED)} within the Python Cython compiles, or run the planner as "
                "Python with DROVER_PLANNER_PURE=1 meanwhile.",
                file=sys.stderr,
            )
            return 1
        print(f"planner compiled into {os.path.relpath(out)} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return 0


@click.command("compile-planner")
@click.option(
    "--source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Another copy of the planner's sources to compile (default: the ones drover.planner loads from).",
)
def compile_planner(source: Path | None) -> None:
    """Compile the planner's search with Cython into this environment (needs Cython, a C
    compiler and Python's headers: pip install 'drover[compiled]'). The same plans in about 0.7
    of the time; until then, and after an edit, the planner runs as Python. Up to date, it
    does nothing."""
    code = main(SOURCE if source is None else source.resolve())
    if code:
        sys.exit(code)
