"""The user's own model (family custom, docs/models.md): counted from its built parts,
planned by its declared splits, trained exactly like the built-in families, and refused
with one clear error when it breaks the protocol."""

from __future__ import annotations

import sys

import pytest
import torch

from drover.agent.runtime.custom import check_counts, with_counts
from drover.agent.runtime.launch import local_cluster, train_reference, train_workers
from drover.agent.supervisor import allow_entry_point
from drover.cli.models import read_model
from drover.planner.cost import validate
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import model_from_dict
from drover.planner.training import Optimizer, Schedule, Training

from support import DP2_PP2, MIXED_TP, ROOT, TP2, assert_matches_reference, losses, trace

EXAMPLE = ROOT / "examples" / "models" / "parallel-decoder.yaml"
sys.path.insert(0, str(EXAMPLE.parent))  # where parallel_decoder.py lies, as the CLI does for a model file
FIELDS = {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "seq_len": 32, "vocab": 128}
FIELDS |= {"global_batch": 16, "micro_batch": 2, "family": "custom"}


def custom(entry_point: str, **fields):
    data = {"name": entry_point, **FIELDS, "entry_point": entry_point} | fields
    return model_from_dict(with_counts(data, "model.yaml"), "model.yaml")


@pytest.fixture(scope="module")
def spec():
    return read_model(EXAMPLE)


def test_parameters_and_splits_are_counted_from_the_built_parts(spec):
    from parallel_decoder import Embedding, Head, ParallelBlock

    class Config:  # the numbers build() reads
        hidden, ffn_hidden, heads, seq_len, vocab, norm_eps = 64, 256, 4, 32, 128, 1e-5

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert spec.block_params == count(ParallelBlock(Config)) == 4 * 64 * 64 + 2 * 64 * 256 + 2 * 64
    assert spec.embedding_params == count(Embedding(Config)) and spec.head_params == count(Head(Config))
    assert spec.parameters == 4 * spec.block_params + spec.embedding_params + spec.head_params
    assert sorted(spec.counted.tp_split_sizes) == [64, 64, 64, 64, 256, 256]
    assert [t for t in (1, 2, 4, 8) if spec.tp_divides(t)] == [1, 2, 4]  # 8 does not divide heads


def test_a_model_declaring_no_splits_runs_with_tp_1(spec):
    unsplit = custom("user_models:unsplit")
    assert unsplit.counted.tp_split_sizes == () and not unsplit.tp_divides(2)
    with pytest.raises(PlanError, match="tp-does-not-divide-heads.*declares no tensor-parallel splits"):
        validate(TP2, local_cluster(4), unsplit)
    validate(TP2, local_cluster(4), spec)  # the example declares its splits


def test_custom_model_with_tp_stages_and_switches_equals_reference(spec, tmp_path):
    """The example's parallel blocks (one enter and one exit around both branches) split
    over TP-2 stages, through two live switches, with clipping and a schedule."""
    training = Training(6, 3, Optimizer(clip_norm=0.3), Schedule(2, "cosine", 1e-4))
    train_reference(spec, training, tmp_path / "reference")
    train_workers(spec, 4, [(0, DP2_PP2), (2, TP2), (4, MIXED_TP)], tmp_path / "run", training)
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")
    assert [t["plan_version"] for t in trace(tmp_path / "run")] == [1, 1, 2, 2, 3, 3]
    model = torch.load(tmp_path / "run" / "model.pt")
    assert model["blocks.0.up.weight"].shape == (256, 64) and "embed.positions.weight" in model
    assert losses(tmp_path / "reference")[-1] < losses(tmp_path / "reference")[0]


@pytest.mark.parametrize("entry_point", ["user_models:scaled", "user_models:drawn"])
def test_a_blocks_buffer_is_made_again_where_the_block_moves(entry_point, tmp_path):
    # A moved block was built empty, buffers included, and nothing filled them: after a switch
    # the loss went wrong, or NaN. Then a buffer drawn from the seeded generator was remade with
    # seed 0, not the job's (3 here): the model drifted from the reference after the switch.
    scaled = custom(entry_point)
    training = Training(4, 3)
    train_reference(scaled, training, tmp_path / "reference")
    train_workers(scaled, 4, [(0, DP2_PP2), (2, TP2)], tmp_path / "run", training)
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")


def test_a_drawn_buffer_survives_a_resume_under_another_plan(tmp_path):
    # A resumed part is built empty and filled from the checkpoint; its buffer was remade with
    # seed 0, and the resumed run drifted from the reference.
    from dataclasses import replace

    from drover.planner.training import Checkpointing

    drawn = custom("user_models:drawn")
    training = Training(4, 3, checkpoint=Checkpointing("ckpt", every_steps=2, keep=1))
    train_reference(drawn, replace(training, checkpoint=None), tmp_path / "reference")
    train_workers(drawn, 4, [(0, DP2_PP2)], tmp_path / "first", replace(training, steps=2), data_root=tmp_path)
    resumed = replace(training, checkpoint=None, resume="ckpt")
    train_workers(drawn, 4, [(0, TP2)], tmp_path / "resumed", resumed, data_root=tmp_path)
    assert [t["step"] for t in trace(tmp_path / "resumed")] == [2, 3]
    final = torch.load(tmp_path / "resumed" / "model.pt")
    reference = torch.load(tmp_path / "reference" / "model.pt")
    for key, tensor in reference.items():
        assert torch.allclose(final[key], tensor, rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize(
    "entry_point, says",
    [
        ("no_such_module:build", "an importable function"),
        ("user_models:no_such_function", "an importable function"),
        ("user_models:returns_a_tensor", "a function returning a torch.nn.Module for part 'embed', not Tensor"),
        ("user_models:split_head", "tp_splits on blocks only"),
        ("user_models:names_no_such_weight", "names of the block's parameters"),
        ("user_models:blocks_differ", "blocks with the same parameter names and shapes"),
        ("user_models:wrong_head", "a tensor of shape (2, 32, 128)"),
        ("user_models:raises", "RuntimeError: out of ideas"),
    ],
)
def test_a_model_breaking_the_protocol_gets_one_clear_error(entry_point, says):
    with pytest.raises(SpecError, match="entry_point") as error:
        custom(entry_point)
    assert says in str(error.value)


def test_bad_model_fields_are_refused():
    with pytest.raises(SpecError, match="'entry_point' = '/etc/passwd'"):
        custom("/etc/passwd")
    with pytest.raises(SpecError, match="'counted' = '.missing.'"):
        model_from_dict({**FIELDS, "entry_point": "parallel_decoder:build"})
    with pytest.raises(SpecError, match="'entry_point' = .*only for family custom"):
        model_from_dict({**FIELDS, "family": "gpt", "entry_point": "parallel_decoder:build"})


def test_counts_that_differ_from_the_built_parts_are_refused_where_workers_run(spec):
    claimed = model_from_dict(
        with_counts({"name": "x", **FIELDS, "entry_point": "parallel_decoder:build"}, "model.yaml")
        | {"counted": {"block_params": 1, "embedding_params": 2, "head_params": 3}},
        "model.yaml",
    )
    with pytest.raises(SpecError, match="what parallel_decoder:build builds here"):
        check_counts(claimed)
    check_counts(spec)  # the true counts pass


def test_an_agent_imports_only_the_modules_its_operator_allowed():
    allow_entry_point("parallel_decoder:build", ("parallel_decoder",))
    allow_entry_point("mine.models.x:build", ("mine",))
    for allowed in [(), ("parallel",), ("mine.models.y",)]:
        with pytest.raises(ValueError, match="--model-modules"):
            allow_entry_point("parallel_decoder:build" if allowed != ("mine.models.y",) else "mine.models.x:b", allowed)
