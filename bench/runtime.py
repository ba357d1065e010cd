"""Adapting pays, on paced devices: 4 emulated GPUs, one made 3x slow,
measured side by side with the cost model's prediction; and the runtime's own
overhead against plain torch.

Paced devices (docs/architecture.md, "Paced devices") take the time their
emulated GPU would: each piece of work lasts its FLOPs / (tflops x mfu / rate),
the real computation padded by a sleep. The emulated GPU here is slow enough
that the real computation is a small part of each step, so four workers on
two cores no longer compete for the cores and the timings follow the
emulated cluster, not this machine.

Runs, one after another: the uniform plan with local/1 3x slow, the
planner's plan given that rate with local/1 3x slow, and the uniform plan
with no slow device. Reports samples/s of each (median step after a warm-up
step), the cost model's prediction for the same plan on the same cluster,
and the ratios against the targets. Then a Llama of the same size on one
unpaced worker: Drover's step (one worker process following a one-device
plan) against a plain torch loop of the same model on the same data and
micro-batches (torch.optim.AdamW, gradient accumulation, one thread like a
worker), alternated run by run. Prints JSON.

    python bench/runtime.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from drover.agent.runtime.launch import local_cluster, train_workers
from drover.planner import Cluster, Gpu, Node, evaluate
from drover.planner.cost import ideal_samples_per_s
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan
from drover.planner.training import Training

ROOT = Path(__file__).resolve().parents[1]

SPEC_FIELDS = {
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
SPEC = model_from_dict(SPEC_FIELDS)
# Paced: a small model, many micro-batches (room to balance a 3x straggler), and an
# emulated GPU slow enough that this machine's real computation is a small part of it.
PACED_SPEC = model_from_dict(
    {
        "name": "bench-runtime-paced",
        "layers": 4,
        "hidden": 64,
        "ffn_hidden": 256,
        "heads": 4,
        "seq_len": 32,
        "vocab": 128,
        "global_batch": 64,
        "micro_batch": 1,
    }
)
PACED_GPU = Gpu("paced-gpu", tflops=0.002, memory_gib=80.0)
WORKERS, SLOW_DEVICE, RATE = 4, "local/1", 3.0


def paced_cluster(rates: dict[str, float]) -> Cluster:
    """Four paced devices on one node, as local_cluster names them."""
    return Cluster("local", (Node("local", WORKERS, PACED_GPU, intra_gbps=0.3, ethernet_gbps=1.0),), rates)


def samples_per_s(plan, slow: bool, steps: int, spec=SPEC, workers: int = WORKERS, paced=None) -> float:
    with tempfile.TemporaryDirectory() as out:
        slowdown = {SLOW_DEVICE: (RATE, 0)} if slow else None
        train_workers(spec, workers, [(0, plan)], out, Training(steps), slowdown, paced=paced)
        trace = [json.loads(line) for line in (Path(out) / "trace.jsonl").read_text().splitlines()]
    return statistics.median(t["samples_per_s"] for t in trace[1:])


def plain_torch_samples_per_s(spec, steps: int) -> float:
    """The same model, data and micro-batches in the loop a torch user writes."""
    import time

    import torch

    from drover.agent.runtime.data import Synthetic
    from drover.agent.runtime.model import Decoder, config_of, loss_sum

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs
    try:
        model = Decoder(config_of(spec), seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
        source = Synthetic(0, spec.seq_len, spec.vocab)
        rates = []
        for step in range(steps):
            started = time.perf_counter()
            for first in range(0, spec.global_batch, spec.micro_batch):
                inputs, targets = source.batch(step, first, spec.micro_batch)
                (loss_sum(model(inputs), targets) / spec.global_batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rates.append(spec.global_batch / (time.perf_counter() - started))
    finally:
        torch.set_num_threads(threads)
    return statistics.median(rates[1:])


def runtime_overhead(steps: int, rounds: int = 3) -> dict:
    llama = model_from_dict({**SPEC_FIELDS, "name": "bench-runtime-llama", "family": "llama", "kv_heads": 4})
    one = make_plan(local_cluster(1), llama, "drover")
    drover, plain = [], []
    for _ in range(rounds):  # alternated, so drift on the machine hits both alike
        drover.append(samples_per_s(one, False, steps, llama, workers=1))
        plain.append(plain_torch_samples_per_s(llama, steps))
    return {
        "model": {k: getattr(llama, k) for k in ("family", "layers", "hidden", "heads", "kv_heads", "ffn_hidden")},
        "drover_samples_per_s": statistics.median(drover),
        "plain_torch_samples_per_s": statistics.median(plain),
        "drover_over_plain_torch": statistics.median(drover) / statistics.median(plain),
        "target_drover_over_plain_torch_at_least": 0.95,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--overhead-only", action="store_true", help="Only Drover's step against plain torch.")
    args = parser.parse_args()
    if args.overhead_only:
        print(json.dumps({"cores": os.cpu_count(), "runtime_overhead": runtime_overhead(args.steps)}, indent=1))
        return
    healthy, slow = paced_cluster({}), paced_cluster({SLOW_DEVICE: RATE})
    uniform = make_plan(healthy, PACED_SPEC, "uniform")
    adapted = make_plan(slow, PACED_SPEC, "drover")
    runs = {
        "uniform_slow": (uniform, True, slow),
        "planner_slow": (adapted, True, slow),
        "uniform_healthy": (uniform, False, healthy),
    }
    measured, predicted = {}, {}
    for name, (plan, is_slow, cluster) in runs.items():
        measured[name] = samples_per_s(plan, is_slow, args.steps, PACED_SPEC, paced=healthy)
        predicted[name] = evaluate(plan, cluster, PACED_SPEC).samples_per_s
    ideal = ideal_samples_per_s(slow, PACED_SPEC)
    print(
        json.dumps(
            {
                "cores": os.cpu_count(),
                "workers": WORKERS,
                "paced_gpu": {"tflops": PACED_GPU.tflops, "mfu": PACED_SPEC.mfu},
                "slow_device": SLOW_DEVICE,
                "rate": RATE,
                "uniform_plan": uniform.to_dict()["pipelines"],
                "planner_plan": adapted.to_dict()["pipelines"],
                "samples_per_s": measured,
                "predicted_samples_per_s": predicted,
                "measured_over_predicted": {k: measured[k] / predicted[k] for k in runs},
                "target_measured_over_predicted_within": 0.10,
                "ideal_slow_samples_per_s": ideal,
                "planner_over_uniform": measured["planner_slow"] / measured["uniform_slow"],
                "target_planner_over_uniform_at_least": 2.0,
                "planner_over_ideal": measured["planner_slow"] / ideal,
                "target_planner_over_ideal": "at least 0.9, at most 1",
                "runtime_overhead": runtime_overhead(args.steps),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
