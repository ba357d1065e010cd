"""Live plan switch against checkpoint-and-restart, measured side by side.

A model of about 60M parameters trains on 4 local workers under a
2-pipeline x 2-stage plan; then the plan changes so that half the blocks
change owner. Live: workers agree on the switch, send those blocks with
their AdamW state peer to peer, rebuild groups and go on. Checkpoint and
restart: every worker saves its state to disk, all stop, new workers start
on the new plan and load. Prints one JSON document.

    python bench/migration.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drover.agent.runtime.launch import train_workers
from drover.agent.runtime.model import Decoder, config_of
from drover.planner.model import load_model
from drover.planner.plan import plan_from_dict
from drover.planner.ports import free_port
from drover.planner.training import Checkpointing, Training

ROOT = Path(__file__).resolve().parents[1]

SPEC = load_model(ROOT / "examples" / "models" / "bench-60m.yaml")
SWITCH_STEP, STEPS, SEED = 2, 3, 0


def two_by_two(first_split: int, second_split: int):
    """Pipeline 0 on local/0 -> local/1, pipeline 1 on local/2 -> local/3."""
    return plan_from_dict(
        {
            "strategy": "bench",
            "global_batch": SPEC.global_batch,
            "micro_batch": SPEC.micro_batch,
            "removed": [],
            "pipelines": [
                {
                    "micro_batches": 2,
                    "stages": [
                        {"devices": ["local/0"], "layers": [0, first_split]},
                        {"devices": ["local/1"], "layers": [first_split, SPEC.layers]},
                    ],
                },
                {
                    "micro_batches": 2,
                    "stages": [
                        {"devices": ["local/2"], "layers": [0, second_split]},
                        {"devices": ["local/3"], "layers": [second_split, SPEC.layers]},
                    ],
                },
            ],
        }
    )


BEFORE = two_by_two(8, 8)
AFTER = two_by_two(12, 4)  # blocks 8-11 move local/1 -> local/0, blocks 4-7 move local/2 -> local/3


def changed_owner_bytes() -> tuple[int, int]:
    """(blocks that change owner, bytes of those blocks with AdamW state: weights + 2 moments, fp32)."""
    block = Decoder(config_of(SPEC), SEED).blocks[0]
    per_block = 3 * 4 * sum(p.numel() for p in block.parameters())
    moved = [b for b in range(SPEC.layers) if _owners(BEFORE, b) != _owners(AFTER, b)]
    return len(moved), len(moved) * per_block


def _owners(plan, block: int) -> set[str]:
    return {d for p in plan.pipelines for s in p.stages if s.layers[0] <= block < s.layers[1] for d in s.devices}


def _loopback_worker(rank: int, init: str, size: int, result) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    buf = torch.ones(size) if rank == 0 else torch.empty(size)
    for trial in range(4):
        dist.barrier()
        start = time.perf_counter()
        dist.send(buf, 1) if rank == 0 else dist.recv(buf, 0)
        if rank == 1 and trial > 0:  # the first message also opens the connection
            result.put(buf.numel() * 4 / (time.perf_counter() - start))
    dist.destroy_process_group()


def loopback_bandwidth(size_bytes: int) -> float:
    """Bytes/s of one gloo send of `size_bytes` between two local processes (median of 3)."""
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_loopback_worker, args=(r, init, size_bytes // 4, result)) for r in range(2)]
    for p in procs:
        p.start()
    samples = sorted(result.get(timeout=120) for _ in range(3))
    for p in procs:
        p.join()
    return samples[1]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    blocks, expected_bytes = changed_owner_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_workers(SPEC, 4, [(0, BEFORE), (SWITCH_STEP, AFTER)], tmp / "live", Training(STEPS, SEED))
        live = read_jsonl(tmp / "live" / "migrations.jsonl")[0]
        live_trace = read_jsonl(tmp / "live" / "trace.jsonl")

        saving = Training(SWITCH_STEP, SEED, checkpoint=Checkpointing("ckpt"))
        train_workers(SPEC, 4, [(0, BEFORE)], tmp / "stop", saving, data_root=tmp)
        train_workers(SPEC, 4, [(0, AFTER)], tmp / "restart", Training(STEPS, SEED, resume="ckpt"), data_root=tmp)
        stopped = read_jsonl(tmp / "stop" / "trace.jsonl")[-1]
        restarted = read_jsonl(tmp / "restart" / "trace.jsonl")[0]
        # From the end of the last step under the old plan to the start of the first under the new.
        restart_s = restarted["wall_start"] - stopped["wall_end"]
        same_model = all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-6)
            for a, b in zip(
                torch.load(tmp / "live" / "model.pt").values(), torch.load(tmp / "restart" / "model.pt").values()
            )
        )
    loopback = loopback_bandwidth(expected_bytes // blocks * 2)
    params = sum(p.numel() for p in Decoder(config_of(SPEC), SEED).parameters())
    report = {
        "model_parameters": params,
        "blocks": SPEC.layers,
        "blocks_changing_owner": blocks,
        "live_switch_s": live["seconds"],
        "checkpoint_restart_s": restart_s,
        "live_over_restart": live["seconds"] / restart_s,
        "target_live_over_restart_at_most": 0.2,
        "bytes_moved": live["bytes_moved"],
        "bytes_of_blocks_changing_owner": expected_bytes,
        "bytes_match": live["bytes_moved"] == expected_bytes,
        "blocks_moved": live["blocks_moved"],
        "migration_bandwidth_bytes_per_s": live["bytes_moved"] / live["seconds"],
        "loopback_bandwidth_bytes_per_s": loopback,
        "migration_over_loopback": live["bytes_moved"] / live["seconds"] / loopback,
        "step_time_s_before_switch": live_trace[SWITCH_STEP - 1]["step_time_s"],
        "live_and_restart_models_equal": same_model,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
