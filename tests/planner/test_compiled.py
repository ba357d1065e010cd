"""The planner's search compiled by Cython (planner/compiled.py): the same plans as the
Python source, and a module whose source changed since its build runs as that source."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from drover.planner import COMPILED_MODULES
from drover.planner.compiled import COMPILED, PURE_ENV, UNAVAILABLE, ext_dir, load_compiled, manifest_entry

from support import ROOT

SOURCES = ROOT / "planner"

# Plans of the random small cases of test_planner_random and of the bench's slowest 64-GPU shapes
# (two networks: crossings and re-splits), printed as JSON.
PLANS = """
import json, random, sys
sys.path[:0] = ["tests/planner", "bench"]
import drover.planner as planner
from drover.planner.search import make_plan
from planner import make_cluster, model_for, timing_shapes
from test_planner_random import random_case
plans = []
for seed in range(12):
    try:
        plans.append(make_plan(*random_case(random.Random(seed))).to_dict())
    except planner.PlanError as err:
        plans.append(err.rule)
for shape in ("infiniband+ethernet four-mixed", "infiniband+roce four-mixed"):
    plans.append(make_plan(make_cluster(64, *timing_shapes(64)[shape]), model_for("gpt-7b", 64)).to_dict())
print(json.dumps({"compiled": list(planner.COMPILED_MODULES), "plans": plans}))
"""


def plans(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV} | ({PURE_ENV: "1"} if pure else {})
    run = subprocess.run(
        [sys.executable, "-c", PLANS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(run.stdout)


def test_compiled_planner_plans_as_the_python_source():
    unavailable = ext_dir() / UNAVAILABLE
    if unavailable.is_file():  # the build found no Cython, compiler or headers here
        pytest.skip(f"planner not compiled here: {json.loads(unavailable.read_text())['reason']}")
    # Otherwise `make test` has just built every module: a build older than its source, or none
    # at all (pytest run without make), fails here rather than leaving the planner slower unnoticed.
    assert COMPILED_MODULES == COMPILED, "run drover compile-planner (make planner-ext)"
    compiled, pure = plans(pure=False), plans(pure=True)
    assert compiled["compiled"] == list(COMPILED) and pure["compiled"] == []
    assert compiled["plans"] == pure["plans"]


# As the logs print one (logging formats exc_info with the traceback module); then uncaught.
TRACEBACK = """
import traceback
import drover.planner.search as s
try:
    s.make_plan(None, None)
except AttributeError:
    traceback.print_exc()
s.make_plan(None, None)
"""


def test_a_traceback_through_compiled_code_shows_the_source_lines_from_anywhere(tmp_path):
    if COMPILED_MODULES != COMPILED:
        pytest.skip("planner not compiled here")
    (tmp_path / "planner").mkdir()  # another checkout's planner/ where the traceback is read
    (tmp_path / "planner" / "search.py").write_text("# another file\n" * 600)
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    run = subprocess.run(
        [sys.executable, "-c", TRACEBACK],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "drover.planner.search.search" in run.stderr and "if not cluster.usable:" in run.stderr
    assert "another file" not in run.stderr


def built_for(where: Path, names: tuple[str, ...], edited: str | None = None) -> None:
    """A build's manifest in `where`: `names` as built from today's sources, `edited` from another."""
    manifest = {name: manifest_entry(SOURCES, name) for name in names}
    if edited:
        manifest[edited] = manifest_entry(SOURCES, edited) | {"sha256": "0" * 64}
    for name in manifest:
        (where / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"")
    (where / "manifest.json").write_text(json.dumps(manifest))


def test_a_module_edited_since_its_build_loads_as_python(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder it installs goes after
    monkeypatch.delenv(PURE_ENV, raising=False)
    built_for(tmp_path, ("cost", "search"), edited="orchestration")
    assert load_compiled("drover.planner", SOURCES, tmp_path) == ("cost", "search")
    finder = sys.meta_path[0]
    assert finder.find_spec("drover.planner.orchestration") is None  # the file system's: the .py
    assert finder.find_spec("drover.planner.cost").origin == str(
        tmp_path / f"cost{sysconfig.get_config_var('EXT_SUFFIX')}"
    )


def test_no_build_another_copy_or_pure_loads_nothing_compiled(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(PURE_ENV, raising=False)
    assert load_compiled("drover.planner", SOURCES, tmp_path) == ()  # never built
    built_for(tmp_path, COMPILED)
    assert load_compiled("planner_HEAD", SOURCES, tmp_path) == ()  # bench/planner_versus's other revision
    monkeypatch.setenv(PURE_ENV, "1")
    assert load_compiled("drover.planner", SOURCES, tmp_path) == ()
    monkeypatch.setenv(PURE_ENV, "0")
    assert load_compiled("drover.planner", SOURCES, tmp_path) == COMPILED
    (tmp_path / "manifest.json").write_text("{not json")
    monkeypatch.delenv(PURE_ENV)
    assert load_compiled("drover.planner", SOURCES, tmp_path) == ()


def test_the_build_lives_in_the_environment_not_the_source_tree():
    assert ext_dir() == Path(sys.prefix) / "drover-planner-ext"
    assert not list(SOURCES.glob("*.so"))  # a build beside the source would shadow an edit
    assert not list(SOURCES.glob("*.c"))  # nor is Cython's C written there (it once was, via a link)


def a_build(monkeypatch, tmp_path, modules: tuple[str, ...]):
    """drover compile-planner's build, of `modules` of a copy of planner/ (as --source names),
    into tmp_path/ext: its main(source) to call."""
    from drover.cli import compile_planner as script

    shutil.copytree(SOURCES, tmp_path / "planner")
    monkeypatch.setattr(script, "COMPILED", modules)
    monkeypatch.setattr(script, "ext_dir", lambda: tmp_path / "ext")
    return functools.partial(script.main, tmp_path / "planner")


def test_without_a_compiler_the_build_says_why_and_the_planner_runs_as_python(tmp_path, monkeypatch, capsys):
    build = a_build(monkeypatch, tmp_path, ("assignment",))
    monkeypatch.setenv("CC", "no-such-compiler")
    assert build() == 0
    assert json.loads((tmp_path / "ext" / UNAVAILABLE).read_text()) == {"reason": "no C compiler (no-such-compiler)"}
    assert "runs as pure Python" in capsys.readouterr().err
    assert load_compiled("drover.planner", SOURCES, tmp_path / "ext") == ()


@pytest.mark.skipif((ext_dir() / UNAVAILABLE).is_file(), reason="no Cython, compiler or headers here")
def test_a_module_cython_refuses_fails_the_build_and_says_what_to_do(tmp_path, monkeypatch, capsys):
    build = a_build(monkeypatch, tmp_path, ("assignment",))
    source = tmp_path / "planner" / "assignment.py"
    starred = "\n\ndef starred(a, b):\n    return max([a, *b])\n"  # Python takes it, Cython does not
    source.write_text(source.read_text() + starred)
    assert build() == 1
    assert "Keep assignment within the Python Cython compiles" in capsys.readouterr().err
    assert not (tmp_path / "ext").exists()
