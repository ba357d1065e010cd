"""Random small clusters and models for the optimum property tests, drawn through a
`pick(options)` function so Hypothesis (which shrinks) and a seeded random.Random
(for long off-line runs) draw the same kinds of cases."""

from __future__ import annotations

GPUS = [
    {"name": "A100-80G", "tflops": 312, "memory_gib": 80},
    {"name": "A10-24G", "tflops": 125, "memory_gib": 24},
    {"name": "H100-80G", "tflops": 989, "memory_gib": 80},
    {"name": "V100-16G", "tflops": 125, "memory_gib": 16},
]
NICS = [
    [],
    [{"type": "infiniband", "gbps": 200, "count": 4}],
    [{"type": "roce", "gbps": 100, "count": 2}],
    [{"type": "roce", "gbps": 100}, {"type": "infiniband", "gbps": 400}],
]
RATES = [1.1, 1.25, 1.5, 3, 5, 12, "inf"]
# hidden sizes with several head counts: TP sizes 3 and 6 are valid for some, not for others
SHAPES = [(1536, [6, 12, 16]), (3072, [8, 12, 24]), (4096, [8, 16, 32]), (6144, [12, 24, 48]), (8192, [16, 32, 64])]


def random_case(pick, max_gpus: int = 8) -> tuple[dict, dict]:
    """A (cluster, model) pair of dicts; `pick(options)` returns one of the options."""
    nodes, total = [], 0
    for i in range(pick([1, 2, 3, 4])):
        sizes = [g for g in (1, 2, 3, 4, 8) if total + g <= max_gpus]
        if not sizes:
            break
        gpus = pick(sizes)
        total += gpus
        nodes.append(
            {
                "name": f"n{i}",
                "gpus": gpus,
                "gpu": pick(GPUS),
                "intra_gbps": pick([400, 2400]),
                "ethernet_gbps": pick([10, 100]),
                "nics": pick(NICS),
            }
        )
    devices = [f"{n['name']}/{j}" for n in nodes for j in range(n["gpus"])]
    rates = {}
    for _ in range(pick([0, 0, 1, 2, 3])):
        rates[pick(devices)] = pick(RATES)
    hidden, heads_options = pick(SHAPES)
    heads = pick(heads_options)
    family = pick(["gpt", "gpt", "llama"])
    b = pick([1, 2])
    model = {
        "family": family,
        "layers": pick([2, 3, 4, 5, 6, 8]),
        "hidden": hidden,
        "heads": heads,
        "seq_len": pick([512, 2048, 4096]),
        "vocab": pick([1000, 32000, 128000]),
        "global_batch": b * pick([1, 2, 3, 4, 6, 8]),
        "micro_batch": b,
    }
    if family == "llama":
        model["kv_heads"] = heads // pick([1, 2, 4])
    return {"name": "random", "nodes": nodes, "rates": rates}, model
