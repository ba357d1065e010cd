"""Two planner versions side by side in one process: the working tree's planner
against another git revision's. Prints one JSON document.

    python bench/planner_versus.py                      # against HEAD
    python bench/planner_versus.py --against main~3 --gpus 64 --rounds 4

For a change meant to make planning faster: planning time on the shapes
bench/planner.py judges it on, each version's total per size and model, the
two taking turns plan by plan (which goes first alternates by round), so a
machine whose speed drifts from minute to minute (it does here, by up to 1.6x)
drifts for both alike. Two processes timed one after the other cannot show
a change of a few percent; this can. And for a change meant to keep every
plan: how many plans of generated scenarios (bench/scenarios.py) are the same
device for device, and where not, the new step time over the old.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
# Both versions as Python: the other revision's copy never loads the working tree's compiled
# modules (planner/compiled.py), so compiling only one side would time the compiler, not the change.
os.environ["DROVER_PLANNER_PURE"] = "1"

from scenarios import generate  # noqa: E402

import drover.planner  # noqa: E402
from planner import MODELS, SEQS_PER_GPU, cluster_dict, timing_shapes  # noqa: E402

MODEL_FILES = {name: ROOT / "examples" / "models" / f"{name}.yaml" for name in MODELS}


def planner_at(revision: str, into: Path):
    """The planner package of a git revision, imported under a name of its own."""
    archive = subprocess.run(["git", "archive", revision, "planner"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    name = "planner_" + "".join(c if c.isalnum() else "_" for c in revision)
    spec = importlib.util.spec_from_file_location(
        name, into / "planner" / "__init__.py", submodule_search_locations=[str(into / "planner")]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


class Version:
    """One planner: its own cluster and model types, so neither sees the other's."""

    def __init__(self, package) -> None:
        name = package.__name__
        self.search = importlib.import_module(f"{name}.search")
        self.cluster = importlib.import_module(f"{name}.cluster")
        self.model = importlib.import_module(f"{name}.model")

    def plan(self, cluster_data: dict, model) -> tuple[float, object]:
        """(seconds, plan) on a cluster built afresh: no memo carried over from earlier plans."""
        cluster = self.cluster.cluster_from_dict(cluster_data, "versus")
        start = time.perf_counter()
        plan = self.search.make_plan(cluster, model)
        return time.perf_counter() - start, plan


def layout(plan) -> tuple:
    return tuple((p.micro_batches, tuple((s.devices, s.layers) for s in p.stages)) for p in plan.pipelines), tuple(
        sorted(plan.removed)
    )


def timing(versions: dict[str, Version], sizes: list[int], models: list[str], rounds: int) -> list[dict]:
    rows = []
    for gpus in sizes:
        for name in models:
            batch = SEQS_PER_GPU[name] * gpus
            specs = {k: replace(v.model.load_model(MODEL_FILES[name]), global_batch=batch) for k, v in versions.items()}
            total = dict.fromkeys(versions, 0.0)
            for r in range(rounds):
                for shape in timing_shapes(gpus).values():
                    for k in list(versions)[:: 1 if r % 2 == 0 else -1]:
                        total[k] += versions[k].plan(cluster_dict(gpus, *shape), specs[k])[0]
            base, new = total.values()
            seconds = {k: round(v, 3) for k, v in total.items()}
            rows.append({"gpus": gpus, "model": name, "seconds": seconds, "new_over_base": round(new / base, 4)})
    return rows


def plans(versions: dict[str, Version], count: int, seed: int) -> dict:
    identical, ratios = 0, []
    for s in generate(count, seed):
        found = [v.plan(s.cluster_dict, v.model.model_from_dict(s.model_dict))[1] for v in versions.values()]
        if layout(found[0]) == layout(found[1]):
            identical += 1
        else:
            ratios.append((found[1].predicted.step_time_s / found[0].predicted.step_time_s, s.id))
    return {
        "scenarios": count,
        "seed": seed,
        "identical": identical,
        "faster": sum(r < 1 for r, _ in ratios),
        "slower": sum(r > 1 for r, _ in ratios),
        "step_time_new_over_base": {f"{seed}/{i}": round(r, 4) for r, i in sorted(ratios)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision of the other planner (default HEAD)")
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 1024], help="cluster sizes timed")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models timed")
    parser.add_argument(
        "--rounds", type=int, default=2, help="times each shape is planned by each version (0: compare plans only)"
    )
    parser.add_argument("--scenarios", type=int, default=60, help="generated scenarios whose plans are compared")
    parser.add_argument("--seed", type=int, default=2, help="seed of the generated scenarios")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        versions = {args.against: Version(planner_at(args.against, Path(tmp))), "working tree": Version(drover.planner)}
        report = {
            "against": args.against,
            "planning_time": timing(versions, args.gpus, args.models, args.rounds) if args.rounds else [],
            "plans": plans(versions, args.scenarios, args.seed),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
