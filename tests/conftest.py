"""Shared fixtures: where the spec's golden examples are, and one factory of
test clusters and models with named variants."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_asyncio

from drover.planner.cluster import cluster_from_dict
from drover.planner.model import model_from_dict

ROOT = Path(__file__).resolve().parents[1]
SPEC_EXAMPLES = Path(os.environ.get("DROVER_SPEC_EXAMPLES", ROOT.parent / "shared" / "spec" / "examples"))

A100 = {"name": "A100-80G", "tflops": 312, "memory_gib": 80}
NICS = {
    "infiniband": [{"type": "infiniband", "gbps": 200, "count": 8}],
    "roce": [{"type": "roce", "gbps": 200, "count": 8}],
    "ethernet": [],
}

# name -> (node count, per-node NIC kinds cycled, rates)
CLUSTER_VARIANTS = {
    "healthy": (4, ["infiniband"], {}),
    "one-straggler": (4, ["infiniband"], {"n1/3": 3.0}),
    "hopeless-straggler": (4, ["infiniband"], {"n2/0": 12.0}),
    "failed": (4, ["infiniband"], {"n0/5": "inf"}),
    "slow-node": (4, ["infiniband"], {f"n3/{j}": 2.0 for j in range(8)}),
    "ib-roce": (4, ["infiniband", "roce"], {}),
    "ib-ethernet": (4, ["infiniband", "ethernet"], {}),
}

MODEL_VARIANTS = {
    "gpt-7b": dict(layers=32, hidden=4096, ffn_hidden=16384, heads=32, seq_len=4096, vocab=32000,
                   global_batch=256, micro_batch=1),
    "gpt-1b": dict(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=32000, global_batch=128, micro_batch=2),
    # two key/value heads: rule 6 allows TP of 1 or 2 only
    "llama-gqa": dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=2, seq_len=4096, vocab=128256,
                      global_batch=256, micro_batch=1),
}


@pytest.fixture
def spec_examples() -> Path:
    if not SPEC_EXAMPLES.is_dir():
        pytest.skip(f"spec examples not found at {SPEC_EXAMPLES} (set DROVER_SPEC_EXAMPLES)")
    return SPEC_EXAMPLES


def make_cluster(variant: str = "healthy", **rates):
    nodes, kinds, variant_rates = CLUSTER_VARIANTS[variant]
    data = {
        "name": variant,
        "defaults": {"gpus": 8, "gpu": A100, "intra_gbps": 2400, "ethernet_gbps": 100, "nics": NICS["infiniband"]},
        "nodes": [{"name": f"n{i}", "nics": NICS[kinds[i % len(kinds)]]} for i in range(nodes)],
        "rates": {**variant_rates, **{k.replace("_", "/"): v for k, v in rates.items()}},
    }
    return cluster_from_dict(data, variant)


def make_model(variant: str = "gpt-7b", **overrides):
    return model_from_dict({"name": variant, **MODEL_VARIANTS[variant], **overrides}, variant)


@pytest.fixture
def cluster_factory():
    return make_cluster


@pytest.fixture
def model_factory():
    return make_model


@pytest_asyncio.fixture
async def plane_factory(tmp_path):
    """Control planes in process (real port, real SQLite file), one per call with its
    options as the named variant: `await plane_factory(device_silence_s=1.0)`."""
    from support import serve_plane
    stops = []

    async def make(**options):
        served, stop = await serve_plane(tmp_path, **options)
        stops.append(stop)
        return served
    yield make
    for stop in stops:
        await stop()


@pytest_asyncio.fixture
async def plane(plane_factory):
    """The default variant of plane_factory; see support.Plane."""
    return await plane_factory()
