"""The planner's search compiled by Cython (planner/compiled.py): the same plans as the
Python source, and a module whose source changed since its build runs as that source."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from drover.planner import COMPILED_MODULES
from drover.planner.compiled import COMPILED, PURE_ENV, ext_dir, load_compiled, manifest_entry

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


@pytest.mark.skipif(
    importlib.util.find_spec("Cython") is None or shutil.which("cc") is None,
    reason="no Cython or no C compiler here: the planner runs as Python",
)
def test_compiled_planner_plans_as_the_python_source():
    # With both, `make test` has just built every module: one that did not compile, or a build
    # older than its source, fails here rather than leaving the planner slower unnoticed.
    assert COMPILED_MODULES == COMPILED, "run scripts/build_planner_ext.py (make planner-ext) and see its error"
    compiled, pure = plans(pure=False), plans(pure=True)
    assert compiled["compiled"] == list(COMPILED) and pure["compiled"] == []
    assert compiled["plans"] == pure["plans"]


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
    (tmp_path / "manifest.json").write_text("{not json")
    monkeypatch.delenv(PURE_ENV)
    assert load_compiled("drover.planner", SOURCES, tmp_path) == ()


def test_the_build_lives_in_the_environment_not_the_source_tree():
    assert ext_dir() == Path(sys.prefix) / "drover-planner-ext"
    assert not list(SOURCES.glob("*.so"))  # a build beside the source would shadow an edit
