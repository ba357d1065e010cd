"""The closed loop, measured: `drover up` with a 3x straggler on one of 4
devices. Reports the steps and seconds from the slowdown to detection and to
the committed plan, samples/s before, while slow and after, and the
telemetry overhead: the same first plan run by `drover train` (workers only,
no agents streaming, no control plane) against `drover up` before the
slowdown, side by side. Prints JSON.

    python bench/loop.py [--steps 60] [--slow-at 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DROVER = [sys.executable, "-m", "control_plane"]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def median_rate(trace: list[dict], lo: int, hi: int) -> float:
    return statistics.median(t["samples_per_s"] for t in trace if lo <= t["step"] < hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--slow-at", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        job = tmp / "job.yaml"
        job.write_text(f"model: {ROOT / 'examples' / 'models' / 'tiny.yaml'}\nsteps: {args.steps}\nseed: 0\n")
        out = tmp / "up"
        subprocess.run(DROVER + ["up", "--nodes", "2", "--devices-per-node", "2", "--job", str(job),
                                 "--straggle", f"node-1/0=3@{args.slow_at}", "--out", str(out)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        trace, events = read(out / "trace.jsonl"), read(out / "events.jsonl")
        migrations = read(out / "migrations.jsonl")
        slow_start = next(t["wall_start"] for t in trace if t["step"] == args.slow_at)
        detected = next(e for e in events if e["kind"] == "straggler_detected" and e["step"] >= args.slow_at)
        committed = next(e for e in events if e["kind"] == "plan_committed" and e["version"] > 1
                         and e["step"] >= args.slow_at)
        switch_step = committed["step"]
        before = median_rate(trace, 1, args.slow_at)
        while_slow = median_rate(trace, args.slow_at, switch_step)
        after = median_rate(trace, switch_step + 1, args.steps)

        # The same first plan without agents or a control plane: the telemetry overhead.
        first_plan = next(e["plan"] for e in events if e["kind"] == "plan_committed" and e["version"] == 1)
        ranks = {d: i for i, d in enumerate(sorted({d for p in first_plan["pipelines"] for s in p["stages"]
                                                     for d in s["devices"]} | set(first_plan["removed"])))}
        local = json.loads(json.dumps(first_plan))
        for p in local["pipelines"]:
            for s in p["stages"]:
                s["devices"] = [f"local/{ranks[d]}" for d in s["devices"]]
        local["removed"] = [f"local/{ranks[d]}" for d in local["removed"]]
        (tmp / "plan.json").write_text(json.dumps(local))
        subprocess.run(DROVER + ["train", "--model", str(ROOT / "examples" / "models" / "tiny.yaml"), "--workers",
                                 str(len(ranks)), "--plan", str(tmp / "plan.json"), "--steps", str(args.slow_at),
                                 "--seed", "0", "--out", str(tmp / "bare")], check=True, cwd=ROOT)
        bare = median_rate(read(tmp / "bare" / "trace.jsonl"), 1, args.slow_at)
    print(json.dumps({
        "devices": 4, "straggler": "node-1/0", "rate": 3.0, "slow_from_step": args.slow_at,
        "steps_to_detection": detected["step"] - args.slow_at,
        "steps_to_committed_plan": switch_step - args.slow_at,
        "target_steps_to_committed_plan_at_most": 5,
        "seconds_to_committed_plan": committed["time"] - slow_start,
        "samples_per_s": {"before": before, "while_slow": while_slow, "after": after},
        "after_over_while": after / while_slow,
        "target_after_over_while_at_least": 1.4,
        "migrations": migrations,
        "samples_per_s_without_agents": bare,
        "telemetry_overhead": bare / before - 1,
        "target_telemetry_overhead_below": 0.02,
    }, indent=1))


if __name__ == "__main__":
    main()
