"""Multi-sender weight sync plan (weight_sync/plan.py): the group cap rule, who sends which tensor,
bucket boundaries equal to the sender's stream bucketing."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.weight_sync.plan import SenderLayout, expert_senders_per_stage, plan_buckets, sender_specs
from scalerl_mega.weight_sync import TensorSpec, iter_buckets


def test_group_cap_rule_largest_divisor_of_ep():
    assert expert_senders_per_stage(pp=1, ep=1) == 1
    assert expert_senders_per_stage(pp=2, ep=2) == 2  # 4 groups <= 16
    assert expert_senders_per_stage(pp=4, ep=8, max_groups=16) == 4  # 16 // 4 = 4, divides 8
    assert expert_senders_per_stage(pp=3, ep=8, max_groups=16) == 4  # 16 // 3 = 5 -> largest divisor of 8 <= 5
    assert expert_senders_per_stage(pp=16, ep=8, max_groups=16) == 1
    assert expert_senders_per_stage(pp=2, ep=6, max_groups=9) == 3  # 9 // 2 = 4 -> divisors of 6: 1, 2, 3
    with pytest.raises(ValueError, match=r"max_groups=4 \(groups per engine\) is smaller than the 8 pipeline stages"):
        expert_senders_per_stage(pp=8, ep=1, max_groups=4)
    lay = SenderLayout(pp=2, ep=8, max_groups=4)
    assert lay.pools == 2 and lay.pool_size == 4
    assert [s.group_name for s in lay.senders] == ["weight_update_group-pp0", "weight_update_group-pp0-ep1",
                                                   "weight_update_group-pp1", "weight_update_group-pp1-ep1"]
    # pool leaders: ep ranks 0 (the stage's emitting rank) and 4; ep rank 5 sends nothing
    assert [s.group_name for s in lay.sends(stage=1, ep_rank=4, emitting=False, expert_emitting=True)] == [
        "weight_update_group-pp1-ep1"]
    assert lay.sends(stage=1, ep_rank=5, emitting=False, expert_emitting=True) == []
    assert lay.sends(stage=0, ep_rank=0, emitting=True, expert_emitting=True) == [lay.sender(0, 0)]


def _dims():
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.tiny import tiny_hf_config

    return dims_from_hf_config(tiny_hf_config("qwen3_moe").to_dict())


def test_sender_specs_split_stages_and_expert_owners():
    from scalerl_mega.convert import tables

    dims = _dims()  # 4 layers (layer 1 dense), 4 experts
    plan = [TensorSpec(n, tables.expected_hf_shape(n, dims), "bfloat16") for n in tables.hf_names(dims)]
    got = sender_specs(dims, SenderLayout(pp=2, ep=2), plan)
    names = {g: [s.name for s in v] for g, v in got.items()}
    assert sorted(n for v in names.values() for n in v) == sorted(tables.hf_names(dims))  # each tensor once
    lead0, ep0 = names["weight_update_group-pp0"], names["weight_update_group-pp0-ep1"]
    assert lead0[0] == "model.embed_tokens.weight" and "lm_head.weight" in names["weight_update_group-pp1"]
    assert all(".layers.0." in n or ".layers.1." in n or "embed" in n for n in lead0)
    # experts 2, 3 belong to ep rank 1 (4 experts / ep 2); its group holds only them, of stage 0's layers 0 (moe)
    assert ep0 and all(".mlp.experts.2." in n or ".mlp.experts.3." in n for n in ep0)
    assert all(".layers.0." in n for n in ep0)
    assert not any(".mlp.experts.2." in n or ".mlp.experts.3." in n for n in lead0)
    # order inside a sender follows the table order (the stream's order)
    order = {n: i for i, n in enumerate(tables.hf_names(dims))}
    for v in names.values():
        assert [order[n] for n in v] == sorted(order[n] for n in v)


def test_plan_buckets_match_stream_bucketing():
    specs = [TensorSpec("a", (10,), "float32"), TensorSpec("b", (10,), "float32"), TensorSpec("c", (30,), "float32"),
             TensorSpec("d", (10,), "bfloat16"), TensorSpec("e", (10,), "bfloat16")]
    stream = [(s.name, torch.zeros(s.shape, dtype=getattr(torch, s.dtype))) for s in specs]
    for bucket_bytes in (0, 50, 100, 1000):
        want = [[n for n, _ in b] for b in iter_buckets(stream, bucket_bytes=bucket_bytes)]
        assert [[s.name for s in b] for b in plan_buckets(specs, bucket_bytes=bucket_bytes)] == want
    assert [[s.name for s in b] for b in plan_buckets(specs, bucket_bytes=100)] == [["a", "b"], ["c"], ["d", "e"]]
    with pytest.raises(ValueError, match="'x' has no dtype"):
        plan_buckets([TensorSpec("x", (1,))], bucket_bytes=10)
