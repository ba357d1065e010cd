"""Hugging Face weights in and out, against `transformers` itself: a small Llama
that transformers builds with random weights (no download) gives Drover's
logits once imported, and after training under a multi-pipeline plan the
exported directory loads in transformers and gives Drover's logits again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from drover.agent.runtime import hf
from drover.agent.runtime.launch import train_reference, train_workers
from drover.agent.runtime.model import Decoder, config_of
from drover.planner.errors import SpecError
from drover.planner.model import load_model
from drover.planner.training import Training

from support import DP2_PP2, MIXED_TP, ROOT, assert_matches_reference

transformers = pytest.importorskip("transformers")

TINY_LLAMA = ROOT / "examples" / "models" / "tiny-llama.yaml"


@pytest.fixture(scope="module")
def spec():
    # Hugging Face's default epsilon and a rotary base other than ours, so both travel.
    return replace(load_model(TINY_LLAMA), norm_eps=1e-6, rope_theta=50_000.0)


def hf_model(spec, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn_hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.seq_len,
        rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_dir(spec, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    hf_model(spec).save_pretrained(root / "hf-llama")
    return root


def drover_model(spec, state: dict) -> Decoder:
    model = Decoder(config_of(spec), seed=0)
    model.load_state_dict(state)
    return model.eval()


def imported(spec, directory) -> dict:
    weights = hf.HfWeights(directory, spec)
    state = {}
    for prefix, part in [("embed.", "embed"), ("head.", "head")] + [(f"blocks.{i}.", i) for i in range(spec.layers)]:
        state |= {prefix + k: v for k, v in weights.part(part).items()}
    return state


def tokens(spec, seed=1):
    return torch.randint(spec.vocab, (3, spec.seq_len), generator=torch.Generator().manual_seed(seed))


def test_imported_weights_give_the_transformers_logits(spec, hf_dir):
    model = drover_model(spec, imported(spec, hf_dir / "hf-llama"))
    reference = hf_model(spec)  # the same seed: the same random weights
    x = tokens(spec)
    with torch.no_grad():
        want = reference(x).logits
        got = model(x)
    assert (got - want).abs().max().item() < 1e-5


def test_trained_under_a_multi_pipeline_plan_the_export_loads_in_transformers(spec, hf_dir, tmp_path):
    training = Training(4, 3, init="hf-llama")
    plans = [(0, DP2_PP2), (2, MIXED_TP)]
    train_workers(spec, 4, plans, tmp_path / "run", training, data_root=hf_dir)
    train_reference(spec, training, tmp_path / "reference", data_root=hf_dir)
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")  # init from HF, then exact as ever

    state = torch.load(tmp_path / "run" / "model.pt")
    started = imported(spec, hf_dir / "hf-llama")
    assert any(not torch.equal(state[k], started[k]) for k in state)  # it trained
    out = hf.export(state, spec, tmp_path / "export")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = tokens(spec, seed=2)
    with torch.no_grad():
        want = drover_model(spec, state)(x)
        got = loaded(x).logits
    assert (got - want).abs().max().item() < 1e-5
    assert json.loads((out / "config.json").read_text())["num_key_value_heads"] == spec.kv_heads


def test_an_unsupported_architecture_is_refused_naming_the_field(spec, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(SpecError, match="architectures.*GPT2LMHeadModel.*LlamaForCausalLM"):
        hf.HfWeights(tmp_path, spec)


def test_a_model_file_that_disagrees_with_the_checkpoint_is_refused(spec, hf_dir):
    with pytest.raises(SpecError, match="'layers' = 3.*4, as .*config.json says"):
        hf.HfWeights(hf_dir / "hf-llama", replace(spec, layers=3))


def test_gpt_models_do_not_export_and_nothing_is_written(tmp_path):
    gpt = load_model(ROOT / "examples" / "models" / "tiny.yaml")
    with pytest.raises(SpecError, match="family.*llama"):
        hf.export({}, gpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
