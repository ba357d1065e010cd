"""The llama family in the runtime: its block against attention written out by
hand (grouped-query heads, rotary positions), its tensor-parallel split, and
real gloo workers through live switches giving the reference run's model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from drover.agent.runtime.launch import train_reference, train_workers
from drover.agent.runtime.model import (
    HEAD,
    Decoder,
    DecoderConfig,
    LlamaBlock,
    LlamaHead,
    RMSNorm,
    build_part,
    config_of,
)
from drover.agent.runtime.parts import assemble, empty_part, pack, unpack
from drover.agent.runtime.tensor_parallel import shard, shard_block, split_dim, unshard
from drover.planner.model import load_model
from drover.planner.training import Optimizer, Schedule, Training

from support import DP2_PP2, MIXED_TP, ROOT, TP2, assert_matches_reference, losses, trace

TINY_LLAMA = ROOT / "examples" / "models" / "tiny-llama.yaml"
STEPS, SEED = 6, 7


def llama(kv_heads: int, heads: int = 4) -> DecoderConfig:
    return DecoderConfig(
        layers=2, hidden=32, ffn_hidden=48, heads=heads, seq_len=8, vocab=16, family="llama", kv_heads=kv_heads
    )


def by_hand(block: LlamaBlock, x: torch.Tensor) -> torch.Tensor:
    """The block written out: RMSNorm, rotary positions as complex rotations of
    the pairs (i, i + d/2), one loop over query heads each reading key/value head
    h // (heads / kv_heads), an explicit causal mask, then SwiGLU."""
    cfg = block.cfg
    kv_heads, d = cfg.kv_heads or cfg.heads, cfg.head_dim
    seq = x.shape[1]

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w

    def rotate(t):  # (batch, seq, d)
        pos = torch.arange(seq, dtype=torch.float64)[:, None]
        angle = pos * 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        z = torch.complex(t[..., : d // 2].double(), t[..., d // 2 :].double()) * torch.polar(
            torch.ones_like(angle), angle
        )
        return torch.cat((z.real, z.imag), dim=-1).float()

    h = norm(x, block.attn_norm.weight)
    q, k, v = h @ block.q.weight.T, h @ block.k.weight.T, h @ block.v.weight.T
    mask = torch.ones(seq, seq).tril().bool()
    heads = []
    for i in range(cfg.heads):
        j = i // (cfg.heads // kv_heads)
        qi, kj, vj = (
            rotate(q[..., i * d : (i + 1) * d]),
            rotate(k[..., j * d : (j + 1) * d]),
            v[..., j * d : (j + 1) * d],
        )
        scores = (qi @ kj.transpose(1, 2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        heads.append(scores.softmax(-1) @ vj)
    x = x + torch.cat(heads, dim=-1) @ block.o.weight.T
    h = norm(x, block.mlp_norm.weight)
    return x + (F.silu(h @ block.gate.weight.T) * (h @ block.up.weight.T)) @ block.down.weight.T


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_block_equals_attention_written_out(kv_heads):
    torch.manual_seed(0)
    block = build_part(llama(kv_heads), 1, seed=3)
    with torch.no_grad():  # norms away from 1, so a missing or misplaced weight shows
        block.attn_norm.weight.uniform_(0.5, 1.5)
        block.mlp_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 32)
    assert block.k.weight.shape == (kv_heads * 8, 32)
    torch.testing.assert_close(block(x), by_hand(block, x), rtol=1e-5, atol=1e-5)


def test_grouped_heads_equal_multi_head_with_each_kv_head_repeated():
    """kv_heads=2 of 4 is multi-head attention whose k and v rows repeat each
    key/value head for its two query heads (0,0,1,1 and not 0,1,0,1)."""
    gqa = build_part(llama(2), 0, seed=1)
    mha = build_part(llama(4), 0, seed=1)
    d = gqa.cfg.head_dim
    with torch.no_grad():
        for name in ("k", "v"):
            w = getattr(gqa, name).weight.view(2, d, -1)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(4 * d, -1))
        for name in ("attn_norm", "q", "o", "mlp_norm", "gate", "up", "down"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
    x = torch.randn(3, 8, 32)
    torch.testing.assert_close(gqa(x), mha(x), rtol=1e-6, atol=1e-6)


def test_rotary_scores_depend_only_on_the_distance():
    from drover.agent.runtime.model import rope

    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8)
    scores = rope(q, 10_000.0)[0, 0] @ rope(k, 10_000.0)[0, 0].T
    for offset in range(1, 4):
        torch.testing.assert_close(scores.diagonal(offset), scores.diagonal(offset)[:1].expand(6 - offset))
    assert not torch.allclose(scores.diagonal(0)[0], scores.diagonal(2)[0])


def test_parts_are_built_from_seed_and_part_alone():
    cfg = llama(2)
    full = Decoder(cfg, seed=5)
    for (name, a), (_, b) in zip(full.blocks[1].named_parameters(), build_part(cfg, 1, seed=5).named_parameters()):
        assert torch.equal(a, b), name
    assert isinstance(full.head, LlamaHead) and isinstance(full.head.norm, RMSNorm)
    assert not hasattr(full.embed, "pos")  # rotary positions: no learned position table
    assert not torch.equal(build_part(cfg, 1, seed=6).q.weight, full.blocks[1].q.weight)


def test_every_block_weight_is_split_or_a_norm():
    block = build_part(llama(2), 0, seed=0)
    names = {n for n, _ in block.named_parameters()}
    assert names - set(LlamaBlock.tp_splits) == {"attn_norm.weight", "mlp_norm.weight"}


def test_tensor_parallel_shards_rebuild_the_block_and_its_sums():
    """Two ranks' shards: each holds 2 query heads and 1 key/value head; their
    split-region outputs add up to the whole block's."""
    cfg, x = llama(2), torch.randn(2, 8, 32)
    whole = build_part(cfg, 2, seed=4)
    ranks = [shard_block(build_part(cfg, 2, seed=4), 2, r) for r in range(2)]
    assert ranks[0].q.weight.shape == (16, 32) and ranks[0].k.weight.shape == (8, 32)
    assert ranks[0].o.weight.shape == (32, 16) and ranks[0].down.weight.shape == (32, 24)
    for name, p in whole.named_parameters():
        got = unshard([dict(r.named_parameters())[name].data for r in ranks], split_dim(whole, name))
        assert torch.equal(got, p.data), name

    def partials(block):  # the exit all-reduce's inputs, gathered by hand
        seen = []
        block.exit = _Record(seen)
        block(x)
        return seen

    # The attention's exit only: a lone rank's MLP would start from its partial sum.
    summed = partials(ranks[0])[0] + partials(ranks[1])[0]
    torch.testing.assert_close(summed, partials(whole)[0], rtol=1e-5, atol=1e-6)


class _Record(torch.nn.Module):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def forward(self, y):
        self.seen.append(y.detach())
        return y


def test_pack_unpack_and_reslice_across_tp_sizes():
    cfg = llama(2)
    whole = build_part(cfg, 1, seed=2)
    state = {n: {"exp_avg": p.data * 2, "exp_avg_sq": p.data.abs()} for n, p in whole.named_parameters()}
    pieces = {}
    for r in range(2):
        module = empty_part(cfg, 1, 2, r, torch.device("cpu"))
        params = {n: shard(p.data, split_dim(whole, n), 2, r) for n, p in whole.named_parameters()}
        moments = {n: {k: shard(s[k], split_dim(whole, n), 2, r) for k in s} for n, s in state.items()}
        for name, p in module.named_parameters():
            p.data = params[name]
        pieces[(2, r)] = unpack(module, pack(module, moments))
    rebuilt, rebuilt_state = assemble(cfg, 1, 1, 0, pieces, torch.device("cpu"), seed=0)
    for name, p in whole.named_parameters():
        assert torch.equal(dict(rebuilt.named_parameters())[name].data, p.data), name
        assert torch.equal(rebuilt_state[name]["exp_avg"], state[name]["exp_avg"]), name
    assert isinstance(empty_part(cfg, HEAD, 1, 0, torch.device("cpu")), LlamaHead)


# -- real workers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec():
    return load_model(TINY_LLAMA)


def test_tiny_llama_example_is_a_gqa_llama(spec):
    cfg = config_of(spec)
    assert cfg.family == "llama" and cfg.heads == 4 and cfg.kv_heads == 2 and cfg.ffn_hidden == 128


def test_parallel_llama_with_tp_stages_and_switches_equals_reference(spec, tmp_path):
    """DP2-PP2, then two TP-2 stages (k and v split to one head each), then a TP-2
    stage beside a whole pipeline, with clipping by the global norm (binding: the bound is
    below the norm) and a warm-up and cosine schedule: the single-process model and losses."""
    training = Training(STEPS, SEED, Optimizer(clip_norm=0.3), Schedule(2, "cosine", 1e-4))
    train_reference(spec, training, tmp_path / "reference")
    plans = [(0, DP2_PP2), (2, TP2), (4, MIXED_TP)]
    train_workers(spec, 4, plans, tmp_path / "run", training)
    assert all(t["grad_norm"] > 0.3 for t in trace(tmp_path / "run"))
    assert_matches_reference(tmp_path / "run", tmp_path / "reference")
    rows = trace(tmp_path / "run")
    assert [t["plan_version"] for t in rows] == [1, 1, 2, 2, 3, 3]
    migrations = [json.loads(line) for line in (tmp_path / "run" / "migrations.jsonl").read_text().splitlines()]
    assert [m["step"] for m in migrations] == [2, 4] and all(m["bytes_moved"] > 0 for m in migrations)
    model = torch.load(tmp_path / "run" / "model.pt")
    assert model["blocks.0.k.weight"].shape == (32, 64) and "blocks.0.gate.weight" in model
    assert losses(tmp_path / "reference")[-1] < losses(tmp_path / "reference")[0]
