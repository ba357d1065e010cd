"""Hugging Face Llama checkpoints in and out: `config.json` plus safetensors.

Import reads a directory that `transformers` wrote for a Llama-architecture
model (LlamaForCausalLM) and hands each worker the tensors of the parts it
holds, read lazily from the safetensors files, so no process loads the
whole model. Export writes a gathered model (model.pt's state dict, in the
single-process names) as a directory `AutoModelForCausalLM.from_pretrained`
loads. Nothing here touches the network.

The layouts agree without permutation: Hugging Face's Llama applies rotary
positions in the rotate-half form, and its grouped-query attention shares
key/value head j among query heads j*g .. j*g+g-1, as model.py does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from drover.planner.errors import SpecError
from drover.planner.model import ModelSpec
from drover.planner.spec_io import load_mapping

from .model import EMBED, HEAD, DecoderConfig, part_prefix
from .parts import empty_part

ARCHITECTURES = ("LlamaForCausalLM",)
EXPORT_SHARD_BYTES = 4 << 30

# Drover's name within a part -> Hugging Face's name (blocks under model.layers.{i}.).
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "q.weight": "self_attn.q_proj.weight",
    "k.weight": "self_attn.k_proj.weight",
    "v.weight": "self_attn.v_proj.weight",
    "o.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "gate.weight": "mlp.gate_proj.weight",
    "up.weight": "mlp.up_proj.weight",
    "down.weight": "mlp.down_proj.weight",
}
_EMBED_NAMES = {"tok.weight": "model.embed_tokens.weight"}
_HEAD_NAMES = {"norm.weight": "model.norm.weight", "out.weight": "lm_head.weight"}


def hf_names(part) -> dict[str, str]:
    if part == EMBED:
        return _EMBED_NAMES
    if part == HEAD:
        return _HEAD_NAMES
    return {ours: f"model.layers.{part}.{theirs}" for ours, theirs in _BLOCK_NAMES.items()}


def read_config(directory: str | Path) -> dict:
    """The model fields a Hugging Face directory fixes (family, sizes, rotary base, norm epsilon),
    with a clear error for anything Drover does not run."""
    path = Path(directory) / "config.json"
    source = str(path)
    config = load_mapping(path, "Hugging Face config.json")
    architectures = config.get("architectures") or []
    if not any(a in ARCHITECTURES for a in architectures) and config.get("model_type") != "llama":
        raise SpecError(source, "architectures", architectures, f"a Llama architecture ({', '.join(ARCHITECTURES)})")
    for key, unsupported in (("attention_bias", True), ("mlp_bias", True)):
        if config.get(key) is unsupported:
            raise SpecError(source, key, unsupported, "false: Drover's Llama has no biases")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecError(source, "hidden_act", config["hidden_act"], "silu")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise SpecError(source, "rope_parameters.rope_type", rope.get("rope_type"), "default (no rope scaling)")
    try:
        heads = int(config["num_attention_heads"])
        fields = {
            "family": "llama",
            "layers": int(config["num_hidden_layers"]),
            "hidden": int(config["hidden_size"]),
            "ffn_hidden": int(config["intermediate_size"]),
            "heads": heads,
            "kv_heads": int(config.get("num_key_value_heads") or heads),
            "vocab": int(config["vocab_size"]),
            "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10_000.0))),
            "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        }
    except KeyError as exc:
        raise SpecError(source, exc.args[0], "(missing)", "present in a Llama config") from None
    except (TypeError, ValueError) as exc:
        raise SpecError(source, "(file)", str(exc)[:80], "numbers where Llama configs have them") from None
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != fields["hidden"]:
        wanted = fields["hidden"] // heads
        raise SpecError(source, "head_dim", head_dim, f"hidden_size / num_attention_heads ({wanted})")
    fields["tied"] = bool(config.get("tie_word_embeddings", False))
    fields["max_positions"] = int(config.get("max_position_embeddings", 0)) or None
    return fields


def check_matches(spec: ModelSpec, directory: str | Path) -> None:
    """Refuse a model file that does not describe the Hugging Face model it starts from."""
    fields = read_config(directory)
    source = str(Path(directory) / "config.json")
    for key in ("family", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "rope_theta", "norm_eps"):
        if getattr(spec, key) != fields[key]:
            raise SpecError(spec.name, key, getattr(spec, key), f"{fields[key]!r}, as {source} says")
    if fields["max_positions"] and spec.seq_len > fields["max_positions"]:
        allowed = f"at most max_position_embeddings ({fields['max_positions']})"
        raise SpecError(spec.name, "seq_len", spec.seq_len, allowed)


def model_fields(directory: str | Path) -> dict:
    """The model-file fields of a Hugging Face directory (drover model from-hf)."""
    fields = read_config(directory)
    fields.pop("tied")
    fields.pop("max_positions")
    return fields


class HfWeights:
    """A Hugging Face directory's tensors, opened lazily, handed out per part in Drover's names."""

    def __init__(self, directory: str | Path, spec: ModelSpec):
        self.directory = Path(directory)
        check_matches(spec, directory)
        self.tied = read_config(directory)["tied"]
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (self.directory / "model.safetensors").exists():
            with safe_open(self.directory / "model.safetensors", "pt") as f:
                weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        else:
            raise SpecError(str(directory), "init", str(directory), "a directory with model.safetensors (or its index)")
        for file in set(weight_map.values()):
            if Path(file).name != file:  # stay inside the directory
                raise SpecError(str(index), "weight_map", file, "file names inside the directory")
        self.weight_map = weight_map

    def part(self, part) -> dict[str, torch.Tensor]:
        """The whole (unsharded) tensors of a part, float32, keyed by the part's parameter names."""
        names = dict(hf_names(part))
        if part == HEAD and self.tied and names["out.weight"] not in self.weight_map:
            # Tied: the head starts as the embedding, then the two train apart.
            names["out.weight"] = _EMBED_NAMES["tok.weight"]
        out = {}
        for ours, theirs in names.items():
            file = self.weight_map.get(theirs)
            if file is None:
                raise SpecError(str(self.directory), theirs, "(missing)", "present in the safetensors files")
            with safe_open(self.directory / file, "pt") as f:
                out[ours] = f.get_tensor(theirs).to(torch.float32)
        return out

    def module(self, cfg: DecoderConfig, part) -> torch.nn.Module:
        """The whole part, on the CPU, holding the directory's weights."""
        module = empty_part(cfg, part, 1, 0, torch.device("cpu"))
        module.load_state_dict(self.part(part))
        return module


def hf_config(spec: ModelSpec) -> dict:
    if spec.family != "llama":
        raise SpecError(spec.name, "family", spec.family, "llama: only Llama models export to Hugging Face")
    return {
        "architectures": list(ARCHITECTURES),
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn_hidden,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "num_hidden_layers": spec.layers,
        "head_dim": spec.hidden // spec.heads,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def export(state: dict[str, torch.Tensor], spec: ModelSpec, out_dir: str | Path) -> Path:
    """Write a gathered model (single-process names) as a Hugging Face Llama directory."""
    config = hf_config(spec)
    out = Path(out_dir)
    renamed = {}
    for part in [EMBED, *range(spec.layers), HEAD]:
        for ours, theirs in hf_names(part).items():
            key = part_prefix(part) + ours
            if key not in state:
                raise SpecError(str(out_dir), key, "(missing)", f"a model of {spec.layers} llama blocks")
            renamed[theirs] = state[key].contiguous()
    out.mkdir(parents=True, exist_ok=True)
    shards, current, size = [], {}, 0
    for name, tensor in renamed.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > EXPORT_SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], out / "model.safetensors", metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, out / file, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(shard, file)
        total = sum(t.numel() * t.element_size() for t in renamed.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
