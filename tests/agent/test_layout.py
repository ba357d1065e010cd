"""What a plan asks of each worker: roles, gradient-sync groups and the
transfers of a plan switch, by tables."""

from __future__ import annotations

import torch

from drover.agent.runtime import data, layout
from drover.agent.runtime.model import EMBED, HEAD, Decoder, DecoderConfig, build_part
from drover.planner.plan import plan_from_dict

from support import DP2_PP2, MIXED_TP, REJOIN, SHRINK, THREE, TP2, UNEVEN, local_plan

RANKS = {f"local/{i}": i for i in range(4)}
L = 4


def moves(old, new):
    return {(m.part, m.src, m.dst, m.t, m.r) for m in layout.transfers(old, new, RANKS, L)}


def test_parts_on_one_node_are_those_no_other_node_holds_a_copy_of():
    # local/* are one node's devices: every part is on it alone.
    assert layout.one_node_parts(DP2_PP2, 4) == layout.part_order(4)
    across = DP2_PP2.to_dict()
    for pipe, node in zip(across["pipelines"], ("a", "b")):
        for k, stage in enumerate(pipe["stages"]):
            stage["devices"] = [f"{node}/{k}"]  # each pipeline on its own node: copies on both
    assert layout.one_node_parts(plan_from_dict(across), 4) == []
    across["pipelines"][1]["stages"][1]["devices"] = ["a/2"]  # blocks 2-3 and the head: on a alone
    assert layout.one_node_parts(plan_from_dict(across), 4) == [2, 3, HEAD]


def test_roles_of_a_two_by_two_plan():
    roles = layout.roles(DP2_PP2, RANKS)
    assert roles[1].parts == [2, 3, HEAD] and roles[1].prev_group == (0,) and roles[1].micro_batches == (0, 4)
    assert roles[2].parts == [EMBED, 0, 1] and roles[2].next_group == (3,) and roles[2].micro_batches == (4, 8)


def test_sync_groups_follow_block_ranges_not_stages():
    groups = {(g.parts, g.ranks, g.mode) for g in layout.sync_groups(UNEVEN, RANKS, L)}
    assert groups == {
        ((EMBED,), (0, 2), "shard"),
        ((0,), (0, 2), "shard"),
        ((1, 2), (1, 2), "shard"),
        ((3,), (1, 3), "shard"),
        ((HEAD,), (1, 3), "shard"),
    }
    assert layout.sync_groups(TP2, RANKS, L) == []  # one pipeline: nothing to sum
    mixed = {(g.parts, g.mode) for g in layout.sync_groups(MIXED_TP, RANKS, L)}
    assert mixed == {((EMBED,), "full"), ((0, 1, 2), "full"), ((3,), "shard"), ((HEAD,), "shard")}


def test_switch_moves_only_what_changes_owner():
    assert moves(DP2_PP2, DP2_PP2) == set()
    # local/0 gives block 1 to local/1; nothing else changes owner.
    one_block = layout.transfers(DP2_PP2, layout_plan_shift(), RANKS, L)
    # From local/0, which gives block 1 up, rather than local/2, which keeps working on it.
    assert {(m.part, m.src, m.dst) for m in one_block} == {(1, 0, 1)}


def layout_plan_shift():
    return local_plan((4, [([0], (0, 1)), ([1], (1, 4))]), (4, [([2], (0, 2)), ([3], (2, 4))]))


def test_tp_change_takes_every_old_shard_or_its_own():
    got = moves(DP2_PP2, SHRINK)
    # local/0 and local/1 now hold blocks 0-2 as a TP pair; both rebuild from t=1 holders.
    assert (0, 0, 0, 1, 0) in got  # local/0 re-slices its own copy of block 0
    assert (2, 1, 1, 1, 0) in got and (0, 0, 1, 1, 0) in got
    assert all(m[3] == 1 for m in got)  # every shard sent is a whole (t=1) copy


def test_removed_device_gets_state_back_when_it_returns():
    got = moves(SHRINK, REJOIN)
    assert {m[0] for m in got if m[2] == 2} == {EMBED, 0, 1, 2, 3, HEAD}
    assert moves(REJOIN, THREE)  # three pipelines now


def test_blocks_depend_only_on_seed_and_index():
    cfg = DecoderConfig()
    full = Decoder(cfg, seed=5)
    alone = build_part(cfg, 2, seed=5)
    for (name, a), (_, b) in zip(full.blocks[2].named_parameters(), alone.named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(build_part(cfg, 2, seed=6).q.weight, alone.q.weight)


def test_data_is_a_pure_function_of_seed_step_sample():
    a = data.sample_tokens(1, 4, 9, 16, 128)
    assert torch.equal(a, data.sample_tokens(1, 4, 9, 16, 128))
    assert not torch.equal(a, data.sample_tokens(1, 4, 10, 16, 128))
    inputs, targets = data.Synthetic(1, 16, 128).batch(4, 8, 3)
    assert torch.equal(inputs[1], a[:-1]) and torch.equal(targets[1], a[1:])


def test_neighbouring_stages_exchange_with_the_pairs_the_schedule_uses():
    """Stage k+1's member j receives from stage k's member j mod t, and sends gradients back to
    member r of stage k from its own member r mod t': the pairs given their own groups."""
    ranks = {f"local/{i}": i for i in range(8)}
    plan = local_plan((8, [([0, 1], (0, 2)), ([2], (2, 3)), ([3, 4, 5, 6], (3, 4))]))
    assert layout.p2p_pairs(plan, ranks) == [(0, 2), (1, 2), (2, 3), (2, 4), (2, 5), (2, 6)]
    assert layout.p2p_pairs(local_plan((8, [([0, 1, 2, 3], (0, 4))])), ranks) == []  # one stage: none
