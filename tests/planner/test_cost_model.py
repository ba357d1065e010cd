"""The reference cost model against the spec's golden examples, and the
errors for bad cluster, model and plan files."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drover.planner.cluster import cluster_from_dict, load_cluster
from drover.planner.cost import StageCost, evaluate, fits_memory, most_micro_batches, validate
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import load_model, model_from_dict
from drover.planner.plan import load_plan, plan_from_dict

from support import make_model


def _example_dirs(root):
    dirs = sorted(p for p in root.iterdir() if (p / "expected.json").exists())
    assert dirs, f"no golden examples under {root}"
    return dirs


def test_golden_examples_reproduced_to_1e6(spec_examples):
    for folder in _example_dirs(spec_examples):
        cluster = load_cluster(folder / "cluster.yaml")
        model = load_model(folder / "model.yaml")
        plan = load_plan(folder / "plan.json")
        validate(plan, cluster, model)
        got = evaluate(plan, cluster, model)
        expected = json.loads((folder / "expected.json").read_text())
        for key, want in expected.items():
            value = getattr(got, key)
            values, wants = (value, want) if isinstance(want, list) else ([value], [want])
            assert len(values) == len(wants), (folder.name, key)
            for v, w in zip(values, wants):
                assert v == pytest.approx(w, rel=1e-6), (folder.name, key)


def test_every_invalid_plan_rejected_naming_its_rule(spec_examples):
    seen = 0
    for folder in _example_dirs(spec_examples):
        cluster = load_cluster(folder / "cluster.yaml")
        model = load_model(folder / "model.yaml")
        for bad in sorted((folder / "invalid").glob("*.json")) if (folder / "invalid").is_dir() else []:
            with pytest.raises(PlanError) as info:
                validate(load_plan(bad), cluster, model)
            assert info.value.rule == bad.stem
            assert bad.stem in str(info.value)
            seen += 1
    assert seen >= 7


def _small_plan(**changes):
    plan = {
        "strategy": "t",
        "global_batch": 8,
        "micro_batch": 1,
        "pipelines": [
            {
                "micro_batches": 8,
                "stages": [{"devices": ["n0/0"], "layers": [0, 2]}, {"devices": ["n0/1"], "layers": [2, 4]}],
            }
        ],
        "removed": ["n0/2", "n0/3"],
    }
    plan.update(changes)
    return plan


@pytest.fixture
def tiny():
    cluster = cluster_from_dict(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "n0",
                    "gpus": 4,
                    "intra_gbps": 100,
                    "ethernet_gbps": 10,
                    "gpu": {"name": "g", "tflops": 100, "memory_gib": 80},
                }
            ],
        }
    )
    model = model_from_dict(
        {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1000, "global_batch": 8, "micro_batch": 1}
    )
    return cluster, model


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"removed": ["n0/2"]}, "device-neither-used-nor-removed"),
        ({"removed": ["n0/2", "n0/3", "n9/0"]}, "unknown-device"),
        ({"global_batch": 16}, "batch-mismatch"),
        (
            {
                "pipelines": [
                    {
                        "micro_batches": 8,
                        "stages": [{"devices": ["n0/0"], "layers": [0, 3]}, {"devices": ["n0/1"], "layers": [2, 4]}],
                    }
                ]
            },
            "layer-overlap",
        ),
        (
            {
                "pipelines": [
                    {
                        "micro_batches": 8,
                        "stages": [{"devices": ["n0/0"], "layers": [0, 2]}, {"devices": ["n0/1"], "layers": [2, 5]}],
                    }
                ]
            },
            "layers-out-of-range",
        ),
        (
            {
                "pipelines": [
                    {
                        "micro_batches": 8,
                        "stages": [{"devices": ["n0/0"], "layers": [0, 0]}, {"devices": ["n0/1"], "layers": [0, 4]}],
                    }
                ]
            },
            "empty-stage",
        ),
        (
            {
                "pipelines": [
                    {
                        "micro_batches": 8,
                        "stages": [{"devices": ["n0/0"], "layers": [-1, 2]}, {"devices": ["n0/1"], "layers": [2, 4]}],
                    }
                ]
            },
            "layers-out-of-range",
        ),
        (
            {
                "pipelines": [
                    {"micro_batches": 8, "stages": [{"devices": ["n0/0"], "layers": [0, 4]}]},
                    {"micro_batches": 0, "stages": [{"devices": ["n0/1"], "layers": [0, 4]}]},
                ]
            },
            "micro-batches-below-one",
        ),
    ],
)
def test_more_rules_named(tiny, change, rule):
    # (a first stage from block -1 read as an overlap with a previous stage there is not)
    cluster, model = tiny
    with pytest.raises(PlanError) as info:
        validate(plan_from_dict(_small_plan(**change)), cluster, model)
    assert info.value.rule == rule


def test_a_failed_device_may_not_be_listed_as_removed_either(tiny):
    # Rule 1: a failed device appears nowhere in a plan; plan check took one in 'removed'.
    cluster, model = tiny
    failed = cluster.with_rates({"n0/3": math.inf})
    with pytest.raises(PlanError, match="'n0/3' has failed.*'removed'") as info:
        validate(plan_from_dict(_small_plan()), failed, model)
    assert info.value.rule == "failed-device-used"
    validate(plan_from_dict(_small_plan(removed=["n0/2"])), failed, model)


@pytest.mark.parametrize("count", [12.5, "8", True, None])
def test_a_micro_batch_count_that_is_no_integer_says_at_least_one(count):
    # It stated the parser's bound, "an integer >= -9223372036854775808".
    pipeline = {"micro_batches": count, "stages": [{"devices": ["n0/0"], "layers": [0, 4]}]}
    with pytest.raises(SpecError, match=r"'pipelines\[0\].micro_batches' = .*: an integer >= 1 \(rule 4"):
        plan_from_dict(_small_plan(pipelines=[pipeline]))


def test_small_valid_plan_passes(tiny):
    validate(plan_from_dict(_small_plan()), *tiny)


GOOD_NODE = {
    "name": "a",
    "gpus": 8,
    "intra_gbps": 100,
    "ethernet_gbps": 10,
    "gpu": {"name": "g", "tflops": 100, "memory_gib": 80},
}


@pytest.mark.parametrize(
    "data, field, value",
    [
        ({"nodes": []}, "nodes", []),
        ({"nodes": [{**GOOD_NODE, "gpus": 0}]}, "nodes[0].gpus", 0),
        ({"nodes": [{**GOOD_NODE, "gpus": "eight"}]}, "nodes[0].gpus", "eight"),
        ({"nodes": [{k: v for k, v in GOOD_NODE.items() if k != "gpu"}]}, "nodes[0].gpu", None),
        ({"nodes": [{**GOOD_NODE, "gpu": {"name": "g", "tflops": -1, "memory_gib": 80}}]}, "nodes[0].gpu.tflops", -1),
        ({"nodes": [{**GOOD_NODE, "nics": [{"type": "myrinet", "gbps": 10}]}]}, "nodes[0].nics[0].type", "myrinet"),
        ({"nodes": [GOOD_NODE, GOOD_NODE]}, "nodes[1].name", "a"),
        ({"nodes": [GOOD_NODE], "rates": {"a/9": 2.0}}, "rates.a/9", 2.0),
        ({"nodes": [GOOD_NODE], "rates": {"a/1": 0.5}}, "rates.a/1", 0.5),
        ({"nodes": [GOOD_NODE], "colour": "red"}, "colour", "red"),
        # bounded, so planning a file is bounded work and its arithmetic stays finite
        ({"nodes": [{**GOOD_NODE, "gpus": 100_000}]}, "nodes[0].gpus", 100_000),
        ({"nodes": [{**GOOD_NODE, "name": f"n{i}"} for i in range(2049)]}, "nodes", "16392 devices"),
        (
            {"nodes": [{**GOOD_NODE, "gpu": {"name": "g", "tflops": 1e300, "memory_gib": 80}}]},
            "nodes[0].gpu.tflops",
            1e300,
        ),
        (
            {"nodes": [{**GOOD_NODE, "gpu": {"name": "g", "tflops": 1, "memory_gib": 1e300}}]},
            "nodes[0].gpu.memory_gib",
            1e300,
        ),
        ({"nodes": [{**GOOD_NODE, "intra_gbps": 1e7}]}, "nodes[0].intra_gbps", 1e7),
        ({"nodes": [{**GOOD_NODE, "ethernet_gbps": 5e-324}]}, "nodes[0].ethernet_gbps", 5e-324),  # was 1/0
        (
            {"nodes": [{**GOOD_NODE, "gpu": {"name": "g", "tflops": 1e-4, "memory_gib": 80}}]},
            "nodes[0].gpu.tflops",
            1e-4,
        ),
        (
            {"nodes": [{**GOOD_NODE, "nics": [{"type": "roce", "gbps": 100, "count": 65}]}]},
            "nodes[0].nics[0].count",
            65,
        ),
        ({"nodes": [GOOD_NODE], "rates": {"a/1": 1.7e308}}, "rates.a/1", 1.7e308),
    ],
)
def test_bad_cluster_fields_named(data, field, value):
    with pytest.raises(SpecError) as info:
        cluster_from_dict({"name": "c", **data}, "c.yaml")
    err = info.value
    assert (err.field, err.value) == (field, value)
    assert f"'{field}'" in str(err) and "c.yaml" in str(err)


def test_failed_rate_spellings():
    for spelled in ("inf", "Infinity", float("inf")):
        c = cluster_from_dict({"name": "c", "nodes": [GOOD_NODE], "rates": {"a/1": spelled}})
        assert c.device_by_id["a/1"].failed and len(c.usable) == 7


GOOD_MODEL = {
    "layers": 4,
    "hidden": 256,
    "heads": 4,
    "seq_len": 128,
    "vocab": 1000,
    "global_batch": 8,
    "micro_batch": 2,
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"layers": 0}, "layers"),
        ({"heads": 3}, "heads"),
        ({"micro_batch": 3}, "micro_batch"),
        ({"mfu": 1.5}, "mfu"),
        ({"mfu": 5e-324}, "mfu"),  # planning divided by zero
        ({"rope_theta": 5e-324}, "rope_theta"),
        ({"norm_eps": 5e-324}, "norm_eps"),
        ({"name": "a\nb"}, "name"),  # a forged row in drover job list
        ({"name": "\x1b[31m"}, "name"),
        ({"vocab": None}, "vocab"),
        ({"family": "mamba"}, "family"),
        ({"kv_heads": 2}, "kv_heads"),  # gpt is multi-head: kv_heads = heads
        ({"family": "llama", "kv_heads": 3}, "kv_heads"),
    ],
)
def test_bad_model_fields_named(change, field):
    with pytest.raises(SpecError) as info:
        model_from_dict({**GOOD_MODEL, **change}, "m.yaml")
    assert info.value.field == field


def test_model_defaults():
    m = model_from_dict(GOOD_MODEL)
    assert m.ffn_hidden == 4 * 256 and m.mfu == 0.5 and m.micro_batches == 4


def test_llama_block_by_the_spec_formulas():
    m = model_from_dict({**GOOD_MODEL, "family": "llama", "hidden": 4096, "heads": 32, "kv_heads": 8})
    h, f = 4096, 11008  # the llama default: 256 * ceil(floor(8h/3) / 256)
    assert m.ffn_hidden == f
    assert m.block_params == 2 * h * h + 2 * h * (h * 8 // 32) + 3 * h * f
    assert m.block_flops == 2 * 2 * 128 * m.block_params + 4 * 2 * 128 * 128 * h
    assert model_from_dict({**GOOD_MODEL, "family": "llama"}).kv_heads == 4  # default: heads


def test_tp_must_divide_kv_heads(tiny):
    cluster, _ = tiny
    model = model_from_dict({**GOOD_MODEL, "family": "llama", "global_batch": 8, "micro_batch": 1, "kv_heads": 1})
    plan = _small_plan(
        pipelines=[{"micro_batches": 8, "stages": [{"devices": ["n0/0", "n0/1"], "layers": [0, 4]}]}],
        removed=["n0/2", "n0/3"],
    )
    with pytest.raises(PlanError) as info:
        validate(plan_from_dict(plan), cluster, model)
    assert info.value.rule == "tp-does-not-divide-heads" and "kv_heads (1)" in str(info.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="readable cluster file"):
        load_cluster(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed")
    with pytest.raises(SpecError, match="valid YAML") as info:
        load_cluster(bad)
    assert "\n" not in str(info.value) and "at line 1, column 17" in str(info.value)  # one line, with where
    bad.write_text("- just a list")
    with pytest.raises(SpecError, match="mapping"):
        load_model(bad)
    bad.write_text("")
    with pytest.raises(SpecError, match="'empty': a mapping of the model file's fields"):
        load_model(bad)


@pytest.mark.parametrize("name, text", [("m.yaml", "layers: 4\nlayers: 8\n"), ("m.json", '{"layers": 4, "layers": 8}')])
def test_a_key_given_twice_is_refused(tmp_path, name, text):
    # PyYAML and json kept the last one silently.
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError, match="found the key 'layers' twice"):
        load_model(path)


def test_a_merged_mapping_is_overridden_by_the_keys_beside_it(tmp_path):
    path = tmp_path / "c.yaml"
    node = "{name: a, gpus: 2, gpu: {name: g, tflops: 100, memory_gib: 80}, intra_gbps: 100, ethernet_gbps: 10}"
    path.write_text(f"name: c\nnodes:\n  - &a {node}\n  - {{<<: *a, name: b, gpus: 4}}\n")
    assert [(n.name, n.gpus) for n in load_cluster(path).nodes] == [("a", 2), ("b", 4)]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"layers": 2**31}, "layers"),
        ({"global_batch": 2**31}, "global_batch"),
        ({"hidden": 2**20, "heads": 4}, "hidden"),
        ({"global_batch": 2**20, "micro_batch": 1}, "micro_batch"),
        ({"family": "llama", "kv_heads": 8}, "kv_heads"),  # more key/value heads than heads
    ],
)
def test_model_numbers_are_bounded(change, field):
    """Planning and memory stay bounded for a model from the network (2**31 layers once hung the server)."""
    with pytest.raises(SpecError) as info:
        model_from_dict({**GOOD_MODEL, **change}, "m.yaml")
    assert info.value.field == field


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_most_micro_batches_is_the_largest_count_memory_holds(data):
    """most_micro_batches (a binary search per stage) against trying every count with
    fits_memory: the largest m that fits, M once M fits, 0 when none does."""
    model = make_model("gpt-7b", global_batch=data.draw(st.integers(1, 64)))
    S = data.draw(st.integers(1, 8))
    cuts = sorted(data.draw(st.lists(st.integers(1, model.layers - 1), min_size=S - 1, max_size=S - 1, unique=True)))
    bounds = [0, *cuts, model.layers]
    row = [
        StageCost(0, t, 1e14, data.draw(st.sampled_from([16, 24, 40, 80])) * 2**30, a, b)
        for a, b, t in zip(
            bounds, bounds[1:], data.draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=S, max_size=S))
        )
    ]
    fitting = [m for m in range(1, model.micro_batches + 1) if fits_memory([row], [m], model)]
    assert most_micro_batches(row, model) == (max(fitting) if fitting else 0)
