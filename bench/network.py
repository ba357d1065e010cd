"""Heterogeneous networks, measured: real training on an emulated cluster of two
InfiniBand nodes, two RoCE nodes and a slower Ethernet among all four
(examples/clusters/ib-roce-eth.yaml), each node in its own network namespace
with links shaped by tc, paced devices (docs/architecture.md).

Runs, one after another, in one run of this script:
- Drover's NIC-aware plan (data-parallel replicas within one RDMA network,
  only pipeline boundaries crossing between InfiniBand and RoCE);
- the same shapes laid out in file order (the uniform strategy's layout), so
  that data-parallel traffic crosses between NIC types and falls back to
  Ethernet;
- Drover's plan on the same nodes with all four on one InfiniBand network.
Reports samples/s of each (median step after a warm-up step), the cost
model's prediction for the same plan next to it (for fp32 on the wire: the
cost model counts the 2-byte values of GPU training, and CPU workers move
twice the bytes), and the ratios against the targets. Then `drover up --network` with ib-0's InfiniBand link shaped 40x
slower mid-run: the step it is suspected at, the plan the measured link led
to, and samples/s before, while slow and after. Needs root. Prints JSON.

    python bench/network.py
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from drover.agent.runtime.launch import train_workers
from drover.cli.netem import NetworkEmulation
from drover.planner import evaluate, make_plan, plan_from_dict
from drover.planner.cluster import cluster_from_dict
from drover.planner.model import model_from_dict
from drover.planner.network import networks_from_dict
from drover.planner.training import Training

ROOT = Path(__file__).resolve().parents[1]
MIXED = yaml.safe_load((ROOT / "examples" / "clusters" / "ib-roce-eth.yaml").read_text())
# Gradient-heavy, as data parallelism across nodes is: a model whose synchronisation the
# networks decide, with enough micro-batches to keep the pipelines busy.
SPEC = model_from_dict(
    {
        "name": "bench-network",
        "layers": 4,
        "hidden": 128,
        "ffn_hidden": 512,
        "heads": 4,
        "seq_len": 32,
        "vocab": 128,
        "global_batch": 32,
        "micro_batch": 2,
    }
)


def all_infiniband(data: dict) -> dict:
    """The same nodes and rates, every RDMA NIC an InfiniBand one on a single network."""
    data = copy.deepcopy(data)
    data["name"] = "all-ib-eth"
    for node in data["nodes"]:
        node["nics"] = [{**nic, "type": "infiniband"} for nic in node.get("nics", [])]
    data["networks"] = {"ib": {"type": "infiniband", "nodes": "all"}, "eth": {"type": "ethernet", "nodes": "all"}}
    return data


def fp32_wire(data: dict) -> dict:
    """The cluster as the cost model must see it to predict these CPU workers: it counts 2-byte
    activations and gradients (bf16, as on GPUs), and CPU workers move fp32, twice the bytes,
    so every link carries half the values per second."""
    data = copy.deepcopy(data)
    for scope in [data["defaults"], *data["nodes"]]:
        for key in ("intra_gbps", "ethernet_gbps"):
            if key in scope:
                scope[key] /= 2
        for nic in scope.get("nics", []):
            nic["gbps"] /= 2
    return data


def in_file_order(plan, cluster):
    """The plan's shapes with its devices taken in the cluster file's order."""
    ordered = iter(d.id for d in cluster.devices)
    data = plan.to_dict()
    data.pop("predicted", None)
    for pipeline in data["pipelines"]:
        for stage in pipeline["stages"]:
            stage["devices"] = [next(ordered) for _ in stage["devices"]]
    data["strategy"] = "file-order"
    return plan_from_dict(data)


def measure(data: dict, plan, steps: int) -> float:
    cluster = cluster_from_dict(data, data["name"])
    networks = networks_from_dict(data, cluster, data["name"])
    rank0_node = plan.pipelines[0].stages[0].devices[0].split("/")[0]
    with NetworkEmulation(cluster, networks) as network, tempfile.TemporaryDirectory() as out:
        namespaces = network.namespaces(rank0_node)
        workers = len(cluster.devices)
        train_workers(SPEC, workers, [(0, plan)], out, Training(steps), paced=cluster, namespaces=namespaces)
        trace = [json.loads(line) for line in (Path(out) / "trace.jsonl").read_text().splitlines()]
    return statistics.median(t["samples_per_s"] for t in trace[1:])


def slowed_link(steps: int = 80, at: int = 15, gbps: float = 0.005) -> dict:
    """drover up on the emulated cluster (control plane, agents in their namespaces), ib-0's
    InfiniBand link shaped to `gbps` at step `at`: samples/s before, while slow (until the
    replan for the measured link is running) and after, and what the control plane did."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.yaml"
        job.write_text(f"model: {ROOT / 'examples' / 'models' / 'tiny.yaml'}\nsteps: {steps}\nseed: 0\n")
        out = Path(tmp) / "out"
        network = ROOT / "examples" / "clusters" / "ib-roce-eth.yaml"
        command = [sys.executable, "-m", "drover.cli", "up", "--network", str(network), "--job", str(job)]
        command += ["--slow-link", f"ib:ib-0={gbps}@{at}", "--out", str(out)]
        run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
        if run.returncode != 0:
            raise SystemExit(f"drover up failed: {run.stdout[-2000:]}{run.stderr[-2000:]}")
        trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    slowed_at = next(e["step"] for e in events if e["kind"] == "slow_link_suspected")
    pushes = [e for e in events if e["kind"] == "plan_pushed" and "links measured" in e["reason"]]
    commits = [e["step"] for e in events if e["kind"] == "plan_committed" and e["plan_version"] > 1]

    def rate(lo, hi):
        picked = [t["samples_per_s"] for t in trace if lo <= t["step"] < hi]
        return statistics.median(picked) if picked else None

    replanned = commits[0] if commits else None
    return {
        "slowed": f"ib:ib-0 to {gbps} Gbps at step {at}",
        "slow_link_suspected_at_step": slowed_at,
        "plans_pushed_for_links": [e["reason"] for e in pushes],
        "new_plan_running_from_step": replanned,
        "samples_per_s": {
            "before": rate(1, at),
            "while_slow": rate(at + 1, replanned or steps),
            "after_new_plan": rate(replanned + 1, steps) if replanned else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/network.py needs root (network namespaces, veth pairs, tc)")
    mixed, uniform_ib = MIXED, all_infiniband(MIXED)
    mixed_cluster, ib_cluster = cluster_from_dict(mixed), cluster_from_dict(uniform_ib)
    nic_aware = make_plan(mixed_cluster, SPEC, "drover")
    file_order = in_file_order(nic_aware, mixed_cluster)
    on_ib = make_plan(ib_cluster, SPEC, "drover")
    runs = {
        "nic_aware_mixed": (mixed, mixed_cluster, nic_aware),
        "file_order_mixed": (mixed, mixed_cluster, file_order),
        "drover_all_ib": (uniform_ib, ib_cluster, on_ib),
    }
    measured, predicted, as_planned = {}, {}, {}
    for name, (data, cluster, plan) in runs.items():
        measured[name] = measure(data, plan, args.steps)
        predicted[name] = evaluate(plan, cluster_from_dict(fp32_wire(data)), SPEC).samples_per_s
        as_planned[name] = evaluate(plan, cluster, SPEC).samples_per_s
    print(
        json.dumps(
            {
                "cores": os.cpu_count(),
                "cluster": "examples/clusters/ib-roce-eth.yaml",
                "plans": {
                    name: [[s["devices"] for s in p["stages"]] for p in plan.to_dict()["pipelines"]]
                    for name, (_, _, plan) in runs.items()
                },
                "samples_per_s": measured,
                "predicted_samples_per_s": predicted,
                "predicted_note": "for fp32 on the wire (links at half the values per second); the planner's "
                "own figures, for 2-byte values as on GPUs, are predicted_as_planned",
                "predicted_as_planned": as_planned,
                "measured_over_predicted": {k: measured[k] / predicted[k] for k in runs},
                "target_measured_over_predicted_within": 0.25,
                "mixed_over_all_ib": measured["nic_aware_mixed"] / measured["drover_all_ib"],
                "target_mixed_over_all_ib_at_least": 0.9,
                "nic_aware_over_file_order": measured["nic_aware_mixed"] / measured["file_order_mixed"],
                "target_nic_aware_over_file_order_at_least": 1.3,
                "slowed_link": slowed_link(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
