"""Generated planner scenarios for the benchmark: many clusters of the kinds
the planner meets, drawn from a seed.

    from scenarios import generate
    for s in generate(200, seed=0):
        cluster, model = s.cluster(), s.model()

Each scenario is plain data (a cluster dict and a model dict in the spec's
formats), so a case can be saved as JSON and replayed. Kinds of damage: mild
stragglers (1.1x-1.7x), severe stragglers (2x-12x), whole slow nodes
(1.2x-2x), failed GPUs, stragglers packed on one node, and mixes of these.
Networks: all InfiniBand, InfiniBand + RoCE (alternating nodes or a block of
RoCE nodes), some Ethernet-only nodes among InfiniBand ones, all RoCE. Models
from 1.3B to 70B (gpt and llama, some with head counts that allow few
tensor-parallel sizes, e.g. 52 heads). 64 to 1,024 GPUs of one kind (A100,
H100 or A40), weighted towards 64-256 GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from drover.planner.cluster import cluster_from_dict
from drover.planner.errors import PlanError
from drover.planner.model import model_from_dict
from drover.planner.search import make_plan

ROOT = Path(__file__).resolve().parents[1]

GPUS = {
    # name, peak bf16 TFLOP/s, memory; NVLink (or PCIe) per-GPU Gbps; RDMA NIC Gbps x count per node
    "A100": {"gpu": {"name": "A100-80G", "tflops": 312, "memory_gib": 80}, "intra": 2400, "nic": (200, 8)},
    "H100": {"gpu": {"name": "H100-80G", "tflops": 989, "memory_gib": 80}, "intra": 3600, "nic": (400, 8)},
    "A40": {"gpu": {"name": "A40-48G", "tflops": 149.7, "memory_gib": 48}, "intra": 512, "nic": (200, 2)},
}
GPU_WEIGHTS = {"A100": 6, "H100": 3, "A40": 1}
SIZES = {64: 35, 128: 30, 256: 20, 512: 10, 1024: 5}  # GPUs: weight

# name: family, layers, hidden, heads, kv_heads (0: heads), ffn_hidden (0: default)
MODELS = {
    "gpt-1.3b": ("gpt", 24, 2048, 16, 0, 0),
    "gpt-2.7b-20h": ("gpt", 32, 2560, 20, 0, 0),  # TP 1, 2, 4, 5
    "gpt-3.6b": ("gpt", 32, 3072, 24, 0, 0),  # TP 1, 2, 3, 4, 6, 8
    "gpt-7b": ("gpt", 32, 4096, 32, 0, 0),
    "llama-8b": ("llama", 32, 4096, 32, 8, 14336),
    "gpt-13b": ("gpt", 40, 5120, 40, 0, 0),  # TP 1, 2, 4, 5, 8
    "gpt-20b": ("gpt", 44, 6144, 48, 0, 0),
    "gpt-30b-52h": ("gpt", 60, 6656, 52, 0, 0),  # TP 1, 2, 4 only
    "llama-34b": ("llama", 48, 8192, 64, 8, 22016),
    "gpt-70b": ("gpt", 80, 8192, 64, 0, 28672),
    "llama-70b": ("llama", 80, 8192, 64, 8, 28672),
}
MODEL_WEIGHTS = {
    "gpt-1.3b": 2,
    "gpt-2.7b-20h": 1,
    "gpt-3.6b": 2,
    "gpt-7b": 2,
    "llama-8b": 2,
    "gpt-13b": 2,
    "gpt-20b": 1,
    "gpt-30b-52h": 2,
    "llama-34b": 1,
    "gpt-70b": 2,
    "llama-70b": 1,
}
DAMAGE = {"mild": 3, "severe": 3, "slow-node": 2, "failed": 2, "one-node": 2, "mixed": 4}
NETWORKS = {"ib": 10, "ib+roce": 6, "ib+eth": 2, "roce": 1}


@dataclass(frozen=True)
class Scenario:
    id: int
    seed: int
    description: str
    cluster_dict: dict
    model_dict: dict
    network: str = ""  # a key of NETWORKS
    damage: str = ""  # a key of DAMAGE

    def cluster(self):
        return cluster_from_dict(self.cluster_dict, f"scenario-{self.id}")

    def model(self):
        return model_from_dict(self.model_dict, f"scenario-{self.id}")

    def healthy_cluster(self):
        return cluster_from_dict({**self.cluster_dict, "rates": {}}, f"scenario-{self.id}-healthy")

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "seed": self.seed,
            "description": self.description,
            "cluster": self.cluster_dict,
            "model": self.model_dict,
            "network": self.network,
            "damage": self.damage,
        }


def scenario_from_dict(data: dict) -> Scenario:
    return Scenario(
        data["id"],
        data["seed"],
        data["description"],
        data["cluster"],
        data["model"],
        data.get("network", ""),
        data.get("damage", ""),
    )


def _pick(rng: random.Random, weights: dict):
    keys = list(weights)
    return rng.choices(keys, [weights[k] for k in keys])[0]


def _model(rng: random.Random, gpus: int) -> tuple[dict, str]:
    name = _pick(rng, MODEL_WEIGHTS)
    family, layers, hidden, heads, kv, ffn = MODELS[name]
    seq = rng.choice((2048, 4096))
    per_gpu = rng.choice((4, 8, 16))
    micro = 2 if (hidden <= 3072 and seq == 2048 and rng.random() < 0.4) else 1
    data = {
        "name": name,
        "family": family,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "seq_len": seq,
        "vocab": 32000,
        "global_batch": per_gpu * gpus * micro,
        "micro_batch": micro,
    }
    if kv:
        data["kv_heads"] = kv
    if ffn:
        data["ffn_hidden"] = ffn
    return data, f"{name} seq {seq} B {data['global_batch']} b {micro}"


def _network(rng: random.Random, nodes: int, gpu: str) -> tuple[list[list], str, str]:
    gbps, count = GPUS[gpu]["nic"]
    ib = [{"type": "infiniband", "gbps": gbps, "count": count}]
    roce = [{"type": "roce", "gbps": gbps, "count": count}]
    kind = _pick(rng, NETWORKS)
    if kind == "ib":
        return [ib] * nodes, "all InfiniBand", kind
    if kind == "roce":
        return [roce] * nodes, "all RoCE", kind
    if kind == "ib+eth":
        slow = set(rng.sample(range(nodes), max(1, min(nodes // 4, rng.randint(1, 3)))))
        return [[] if i in slow else ib for i in range(nodes)], f"InfiniBand, {len(slow)} Ethernet-only nodes", kind
    if rng.random() < 0.5:
        return [roce if i % 2 else ib for i in range(nodes)], "InfiniBand + RoCE alternating", kind
    share = rng.choice((0.25, 0.5, 0.75))
    start = rng.randrange(nodes)
    block = {(start + j) % nodes for j in range(max(1, round(nodes * share)))}
    return [roce if i in block else ib for i in range(nodes)], f"InfiniBand + RoCE, {len(block)} RoCE nodes", kind


def _span(values) -> str:
    vals = sorted(values)
    return f"{vals[0]}x" if vals[0] == vals[-1] else f"{vals[0]}x-{vals[-1]}x"


def _damage(rng: random.Random, nodes: int, per_node: int, kind: str) -> tuple[dict, str]:
    devices = [(n, j) for n in range(nodes) for j in range(per_node)]
    rates: dict[tuple, float] = {}
    parts = []

    def stragglers(count: int, low: float, high: float, label: str) -> None:
        chosen = rng.sample([d for d in devices if d not in rates], count)
        for d in chosen:
            rates[d] = round(rng.uniform(low, high), 2)
        parts.append(f"{count} {label} {_span(rates[d] for d in chosen)}")

    def slow_nodes(count: int) -> None:
        for n in rng.sample(range(nodes), count):
            r = round(rng.uniform(1.2, 2.0), 2)
            for j in range(per_node):
                rates[n, j] = r
            parts.append(f"node n{n} slowed {r}x")

    def failed(count: int) -> None:
        for d in rng.sample([d for d in devices if d not in rates], count):
            rates[d] = math.inf
        parts.append(f"{count} failed")

    def one_node() -> None:
        n = rng.randrange(nodes)
        count = rng.randint(2, per_node - 1)
        for j in rng.sample(range(per_node), count):
            rates[n, j] = round(rng.choice((rng.uniform(1.1, 1.7), rng.uniform(2, 9))), 2)
        span = _span(rates[n, j] for j in range(per_node) if (n, j) in rates)
        parts.append(f"{count} stragglers on node n{n} {span}")

    most = max(2, min(8, nodes // 2))
    if kind == "mild":
        stragglers(rng.randint(1, most), 1.1, 1.7, "mild")
    elif kind == "severe":
        stragglers(rng.randint(1, most), 2.0, 12.0, "severe")
    elif kind == "slow-node":
        slow_nodes(rng.randint(1, max(1, min(2, nodes // 8))))
    elif kind == "failed":
        failed(rng.randint(1, 4))
    elif kind == "one-node":
        one_node()
    else:
        options = ["mild", "severe", "slow-node", "failed", "one-node"]
        for part in rng.sample(options, rng.randint(2, 3)):
            if part == "mild":
                stragglers(rng.randint(1, most), 1.1, 1.7, "mild")
            elif part == "severe":
                stragglers(rng.randint(1, most), 2.0, 12.0, "severe")
            elif part == "slow-node":
                slow_nodes(1)
            elif part == "failed":
                failed(rng.randint(1, 3))
            else:
                one_node()
    out = {f"n{n}/{j}": ("inf" if math.isinf(r) else r) for (n, j), r in sorted(rates.items())}
    return out, ", ".join(parts)


def draw(index: int, seed: int = 0, check: bool = True) -> Scenario:
    """Scenario `index` of the stream `seed`; redrawn (from the same stream) until
    Drover finds a plan for it, so every scenario can be planned."""
    rng = random.Random(seed * 1_000_003 + index)
    while True:
        gpus = _pick(rng, SIZES)
        gpu = _pick(rng, GPU_WEIGHTS)
        per_node = 4 if (gpu == "A40" and rng.random() < 0.5) else 8
        nodes = gpus // per_node
        model, model_text = _model(rng, gpus)
        nics, net_text, network = _network(rng, nodes, gpu)
        kind = _pick(rng, DAMAGE)
        rates, damage_text = _damage(rng, nodes, per_node, kind)
        spec = GPUS[gpu]
        cluster = {
            "name": f"gen-{seed}-{index}",
            "defaults": {
                "gpus": per_node,
                "gpu": spec["gpu"],
                "intra_gbps": spec["intra"],
                "ethernet_gbps": 100,
                "nics": nics[0],
            },
            "nodes": [{"name": f"n{i}", "nics": nics[i]} for i in range(nodes)],
            "rates": rates,
        }
        text = f"{gpus} {gpu} ({per_node}/node), {net_text}; {model_text}; {kind}: {damage_text}"
        s = Scenario(index, seed, text, cluster, model, network, kind)
        if not check:
            return s
        try:  # out of time at once, the search stops at its first plan: whether one exists, fast
            make_plan(s.healthy_cluster(), s.model(), budget_s=0.0)
            make_plan(s.cluster(), s.model(), budget_s=0.0)
        except PlanError:
            continue
        return s


def generate(count: int, seed: int = 0) -> list[Scenario]:
    return [draw(i, seed) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description="Print generated scenarios' descriptions (or JSON).")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scenarios = generate(args.count, args.seed)
    if args.json:
        print(json.dumps([s.to_dict() for s in scenarios], indent=1))
    else:
        for s in scenarios:
            print(s.id, s.description)


if __name__ == "__main__":
    main()
