"""Adapting pays: 4 local workers, one made 3x slow, measured side by side.

Runs, one after another on this machine: the uniform plan with local/1 3x
slow, the planner's plan given that rate with local/1 3x slow, and the
uniform plan with no slow worker. Reports samples/s of each (median step
after a warm-up step) and the ratios against the targets. Prints JSON.

    python bench/runtime.py

On a machine with fewer cores than workers the emulated straggler's waits
free a core for the others, which flatters the slow runs a little; the
report gives the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from drover.agent.runtime.launch import local_cluster, train_workers
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan
from drover.planner.training import Training

ROOT = Path(__file__).resolve().parents[1]

SPEC = model_from_dict(
    {
        "name": "bench-runtime",
        "layers": 8,
        "hidden": 256,
        "ffn_hidden": 1024,
        "heads": 8,
        "seq_len": 64,
        "vocab": 1024,
        "global_batch": 24,
        "micro_batch": 2,
    }
)
WORKERS, SLOW_DEVICE, RATE = 4, "local/1", 3.0


def samples_per_s(plan, slow: bool, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        train_workers(SPEC, WORKERS, [(0, plan)], out, Training(steps), {SLOW_DEVICE: (RATE, 0)} if slow else None)
        trace = [json.loads(line) for line in (Path(out) / "trace.jsonl").read_text().splitlines()]
    return statistics.median(t["samples_per_s"] for t in trace[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    healthy = local_cluster(WORKERS)
    uniform = make_plan(healthy, SPEC, "uniform")
    adapted = make_plan(healthy.with_rates({SLOW_DEVICE: RATE}), SPEC, "drover")
    uniform_slow = samples_per_s(uniform, True, args.steps)
    adapted_slow = samples_per_s(adapted, True, args.steps)
    uniform_healthy = samples_per_s(uniform, False, args.steps)
    ideal = uniform_healthy * (WORKERS - 1 + 1 / RATE) / WORKERS
    print(
        json.dumps(
            {
                "cores": os.cpu_count(),
                "workers": WORKERS,
                "slow_device": SLOW_DEVICE,
                "rate": RATE,
                "uniform_plan": uniform.to_dict()["pipelines"],
                "planner_plan": adapted.to_dict()["pipelines"],
                "samples_per_s": {
                    "uniform_slow": uniform_slow,
                    "planner_slow": adapted_slow,
                    "uniform_healthy": uniform_healthy,
                    "ideal_slow": ideal,
                },
                "planner_over_uniform": adapted_slow / uniform_slow,
                "target_planner_over_uniform_at_least": 1.5,
                "planner_over_ideal": adapted_slow / ideal,
                "target_planner_over_ideal_at_least": 0.8,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
