"""Recovery from replicas against restart from a checkpoint, on the same job.

Four local workers train a model of bench size with a plan of two pipelines
(every part on two devices) and a checkpoint every CHECKPOINT_EVERY steps.
A worker is SIGKILLed once KILL_AT steps are done. Two ways of going on,
run one after the other:

- replicas: the survivors report the lost peer, are handed a new world of
  three and take the lost parts from their replicas (what Drover does);
- restart: every worker is stopped and a new launcher process (a fresh
  interpreter, as torchrun starts) runs three workers from the newest
  checkpoint under the same three-device plan.

For each: seconds from the kill to the end of the first step that had not
been completed before it (the job making new progress again), and the steps
redone. Both runs must end equal to each other. Prints JSON.

    python bench/recovery.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from drover.agent.runtime.handoff import WorkerArgs, worker_context
from drover.agent.runtime.recovery import World
from drover.agent.runtime.worker import worker_main
from drover.planner.model import model_from_dict
from drover.planner.plan import plan_from_dict
from drover.planner.ports import free_port
from drover.planner.training import Checkpointing, Training

SPEC = model_from_dict(
    {
        "name": "bench-recovery",
        "family": "llama",
        "layers": 8,
        "hidden": 256,
        "ffn_hidden": 768,
        "heads": 8,
        "kv_heads": 4,
        "seq_len": 64,
        "vocab": 1024,
        "global_batch": 16,
        "micro_batch": 2,
    }
)
STEPS, CHECKPOINT_EVERY, KILL_AT, VICTIM = 14, 5, 8, 3


def plan(*pipelines):
    return plan_from_dict(
        {
            "strategy": "bench",
            "global_batch": SPEC.global_batch,
            "micro_batch": SPEC.micro_batch,
            "pipelines": [
                {
                    "micro_batches": m,
                    "stages": [
                        {"devices": [f"local/{d}" for d in devs], "layers": list(span)} for devs, span in stages
                    ],
                }
                for m, stages in pipelines
            ],
        }
    )


BEFORE = plan((4, [([0], (0, 4)), ([1], (4, 8))]), (4, [([2], (0, 4)), ([3], (4, 8))]))
AFTER = plan((5, [([0], (0, 4)), ([1], (4, 8))]), (3, [([2], (0, 8))]))  # local/3 lost
TRAINING = Training(STEPS, 0, checkpoint=Checkpointing("ckpt", every_steps=CHECKPOINT_EVERY, keep=2))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_four(out: Path, inbox: Path):
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = worker_context()
    procs = []
    for rank in range(4):
        args = WorkerArgs(rank, 4, init, SPEC, TRAINING, [(0, BEFORE)], str(out), str(out), inbox=str(inbox))
        procs.append(ctx.Process(target=worker_main, args=(args,), name=f"bench-worker-{rank}"))
        procs[-1].start()
    return procs


def kill_at_step(procs, out: Path) -> float:
    while len(rows(out / "trace.jsonl")) < KILL_AT:
        time.sleep(0.005)
    killed_at = time.time()
    os.kill(procs[VICTIM].pid, signal.SIGKILL)
    return killed_at


def replicas(tmp: Path) -> dict:
    out, inbox = tmp / "replicas", tmp / "replicas" / "inbox"
    inbox.mkdir(parents=True)
    procs = start_four(out, inbox)
    killed_at = kill_at_step(procs, out)
    while not list(inbox.glob("stalled-*.json")):  # what the agent reports, and the control plane acts on
        time.sleep(0.005)
    world = World(1, f"tcp://127.0.0.1:{free_port()}", {f"local/{i}": i for i in range(3)}, 2, AFTER)
    (inbox / ".w").write_text(json.dumps(world.to_dict()))
    os.replace(inbox / ".w", inbox / "world-1.json")
    for proc in procs[:3]:
        proc.join()
    trace = rows(out / "trace.jsonl")
    done = max(r["step"] for r in trace if r["wall_end"] <= killed_at) + 1
    caught_up = next(r for r in trace if r["step"] == done)  # the first step not done before the kill
    record = rows(out / "migrations.jsonl")[-1]
    return {
        "seconds": caught_up["wall_end"] - killed_at,
        "recovery_seconds": record["seconds"],
        "steps_redone": record["steps_redone"],
        "bytes_moved": record["bytes_moved"],
        "out": out,
    }


def restart(tmp: Path) -> dict:
    out, inbox = tmp / "restart", tmp / "restart" / "inbox"
    inbox.mkdir(parents=True)
    procs = start_four(out, inbox)
    killed_at = kill_at_step(procs, out)
    done = len(rows(out / "trace.jsonl"))
    for proc in procs:  # torchrun stops every worker of the group and starts them again
        proc.kill()
        proc.join()
    # What a torchrun user's restart is: a new launcher process (a fresh interpreter that imports
    # torch and starts its workers), resuming from the newest checkpoint.
    resumed = tmp / "restart-2"
    job = tmp / "job.json"
    model_fields = {k: v for k, v in dataclasses.asdict(SPEC).items() if v not in ("", None)}
    job.write_text(json.dumps({"model": model_fields, **replace(TRAINING, resume="restart/ckpt").to_dict()}))
    plan_file = tmp / "after.json"
    plan_file.write_text(json.dumps(AFTER.to_dict()))
    cli = [sys.executable, "-m", "drover.cli", "train", "--job", str(job), "--workers", "3", "--plan", str(plan_file)]
    done_run = subprocess.run(cli + ["--data-root", str(tmp), "--out", str(resumed)], capture_output=True, text=True)
    if done_run.returncode:
        raise SystemExit(f"the restarted launcher failed ({done_run.returncode}):\n{done_run.stderr[-2000:]}")
    trace = rows(resumed / "trace.jsonl")
    caught_up = next(r for r in trace if r["step"] == done)  # the first step not done before the kill
    return {
        "seconds": caught_up["wall_end"] - killed_at,
        "first_step_after_restart": trace[0]["step"],
        "steps_redone": done - trace[0]["step"],
        "out": resumed,
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fast, slow = replicas(tmp), restart(tmp)
        a, b = torch.load(fast.pop("out") / "model.pt"), torch.load(slow.pop("out") / "model.pt")
        # Within the exactness tests' bound: the two ran the last steps under different plans.
        same = all(((a[k] - b[k]).norm() / b[k].norm()).item() < 1e-4 for k in b)
    ratio = fast["seconds"] / slow["seconds"]
    print(
        json.dumps(
            {
                "cores": os.cpu_count(),
                "model": SPEC.name,
                "workers": 4,
                "killed": f"local/{VICTIM} after {KILL_AT} steps",
                "checkpoint_every": CHECKPOINT_EVERY,
                "from_replicas": fast,
                "restart_from_checkpoint": slow,
                "replicas_over_restart_seconds": ratio,
                "target_replicas_over_restart_at_most": 0.2,
                "target_replicas_steps_redone_at_most": 1,
                "models_equal": same,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
