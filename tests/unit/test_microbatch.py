"""The micro-batch plan (batch.pack_micro_batches) and its execution tensors (trainer/microbatch.py),
against hand-worked plans and a brute-force search."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from scalerl_mega.batch import micro_batch_overhead_tokens, pack_micro_batches, plan_padding_fraction
from scalerl_mega.trainer.microbatch import (aux_loss_weight, block_causal_mask, cut_micro_batch, plan_of, rank_share,
                                             unpack)


def test_issue_example_one_long_row_and_31_short_rows():
    # one 400-token row + 31 rows of 40 tokens at a 1,600-token budget. Overhead 1600/32 = 50.
    # [400] alone + the 31 short rows together (31 x 40 = 1240 <= 1600): 400 + 1240 + 2 x 50 = 1740;
    # the greedy cut [400, 40, 40, 40] (1600) + 28 x 40 (1120) would cost 2820; no padding is possible.
    lengths = [400] + [40] * 31
    plan = pack_micro_batches(lengths, max_tokens=1600)
    assert plan == [[0], list(range(1, 32))]
    assert plan_padding_fraction(lengths, plan, pack=False) == 0.0
    # (the old execution padded every row to 400, 4 rows per micro-batch: 8 micro-batches, 1 - 1640/12800
    # = 87.2% padding; bench/microbatch.py measures it)
    # packed (first-fit decreasing): 400 + 30 x 40 = 1600 fills the first row, the last 40 opens a second
    packed = pack_micro_batches(lengths, max_tokens=1600, pack=True)
    assert packed == [[0, *range(1, 31)], [31]]
    assert plan_padding_fraction(lengths, packed, pack=True) == 0.0


def test_plan_trades_padding_against_micro_batches_hand_worked():
    # lengths [5, 3, 4, 3, 2] at 8 tokens, overhead 1: sorted rows 0(5) 2(4) 1(3) 3(3) 4(2).
    # [5] must stand alone (2 x 5 > 8). Of the rest, [4] [3,3] [2] costs 4+6+2 + 3 = 15; [4,3] [3,2]
    # costs 8+6 + 2 = 16 (2 padded tokens); [4] [3] [3] [2] costs 12 + 4 = 16.
    assert micro_batch_overhead_tokens(8) == 1
    assert pack_micro_batches([5, 3, 4, 3, 2], max_tokens=8) == [[0], [2], [1, 3], [4]]
    # [10, 9, 9, 9] at 40 (overhead 1): together 40 + 1 = 41 (10% padding) > [10] [9, 9, 9] = 10 + 27 + 2
    assert pack_micro_batches([10, 9, 9, 9], max_tokens=40) == [[0], [1, 2, 3]]
    # a tie (together 20 + 1 = 21 = 10 + 9 + 2 apart) keeps fewer micro-batches
    assert pack_micro_batches([9, 10], max_tokens=20) == [[1, 0]]
    assert pack_micro_batches([9, 1], max_tokens=8) == [[0], [1]]  # an oversize row stands alone
    with pytest.raises(ValueError, match="max_tokens"):
        pack_micro_batches([1], max_tokens=0)


def _brute_force_cost(lengths: list[int], max_tokens: int) -> int:
    """Cheapest cut of the length-sorted rows into runs, over all 2^(n-1) cuts."""
    s = sorted(lengths, reverse=True)
    best = None
    for cuts in itertools.product([False, True], repeat=len(s) - 1):
        runs, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                runs.append(s[start:i])
                start = i
        runs.append(s[start:])
        if any(len(r) > 1 and len(r) * r[0] > max_tokens for r in runs):
            continue
        cost = sum(len(r) * r[0] for r in runs) + micro_batch_overhead_tokens(max_tokens) * len(runs)
        best = cost if best is None else min(best, cost)
    return best


def test_plan_is_optimal_against_brute_force():
    rng = random.Random(3)
    for _ in range(60):
        n = rng.randint(1, 9)
        lengths = [rng.randint(1, 40) for _ in range(n)]
        budget = rng.choice([40, 64, 100, 160])
        plan = pack_micro_batches(lengths, max_tokens=budget)
        assert sorted(i for mb in plan for i in mb) == list(range(n))
        longest = [max(lengths[i] for i in mb) for mb in plan]
        assert all(len(mb) == 1 or len(mb) * m <= budget for mb, m in zip(plan, longest))
        assert all(lengths[i] >= lengths[j] for a, b in zip(plan, plan[1:]) for i in a for j in b)  # sorted
        cost = sum(len(mb) * m for mb, m in zip(plan, longest)) + micro_batch_overhead_tokens(budget) * len(plan)
        assert cost == _brute_force_cost(lengths, budget), (lengths, budget, plan)


def test_packed_plan_respects_the_budget_and_holds_every_row():
    rng = random.Random(5)
    lengths = [rng.randint(1, 30) for _ in range(50)]
    plan = pack_micro_batches(lengths, max_tokens=64, pack=True)
    assert sorted(i for mb in plan for i in mb) == list(range(50))
    assert all(sum(lengths[i] for i in mb) <= 64 for mb in plan)
    assert len(plan) <= -(-sum(lengths) // 64) + 2  # first-fit decreasing: near the lower bound


def test_rank_share_pads_with_fillers():
    plan = [[0], [1, 2], [3], [4], [5]]
    assert rank_share(plan, dp=2, dp_rank=0) == [[0], [3], [5]]
    assert rank_share(plan, dp=2, dp_rank=1) == [[1, 2], [4], []]
    assert rank_share(plan, dp=1, dp_rank=0) == plan


@pytest.mark.parametrize("n,dp", [(5, 2), (6, 2), (7, 4), (1, 3), (9, 1)])
def test_aux_loss_weight_gives_every_real_micro_batch_one_over_n(n, dp):
    # Megatron: per-micro-batch aux gradient scale 1 / (micro-batches on the rank); DDP: mean over dp.
    # Effective weight of a real micro-batch = aux_loss_weight / (dp * per_rank); one rank gives 1 / n.
    plan = [[i] for i in range(n)]
    per_rank = len(rank_share(plan, dp=dp, dp_rank=0))
    total = 0.0
    for r in range(dp):
        for rows in rank_share(plan, dp=dp, dp_rank=r):
            w = aux_loss_weight(n_micro_batches=n, dp=dp, filler=not rows) / (dp * per_rank)
            assert w == pytest.approx(0.0 if not rows else 1.0 / n, abs=1e-15)
            total += w
    assert total == pytest.approx(1.0, abs=1e-12)
    assert aux_loss_weight(n_micro_batches=5, dp=2, filler=False) == 6 / 5  # hand-worked: 2 * 3 / 5
    with pytest.raises(ValueError, match="n_micro_batches=0"):
        aux_loss_weight(n_micro_batches=0, dp=2, filler=False)


def test_plan_of_defaults_and_checks():
    assert plan_of(rows=5, seq_len=4, micro_batch_size=2).micro_batches == [[0, 1], [2, 3], [4]]
    # rows of the batch width 4, 2 per micro-batch: [0, 1] [2] and [0] [1, 2] both cost 8 + 4 + 2; the
    # later cut wins the tie (the run that ends the plan is taken as long as possible)
    p = plan_of(rows=3, seq_len=4, micro_batch_tokens=8)
    assert p.micro_batches == [[0], [1, 2]] and p.lengths == [4, 4, 4]
    with pytest.raises(ValueError, match="each of the 3 rows once"):
        plan_of(rows=3, seq_len=4, micro_batches=[[0, 1], [1]])
    with pytest.raises(ValueError, match="2 lengths for 3 rows"):
        plan_of(rows=3, seq_len=4, lengths=[1, 2])


def _data(B: int = 3, T: int = 6) -> dict:
    return {"input_ids": torch.arange(B * T).view(B, T) + 1, "position_ids": torch.arange(T).expand(B, T),
            "targets": torch.arange(B * T).view(B, T) + 100,
            "loss_mask": (torch.arange(T)[None, :] < torch.tensor([6, 2, 3])[:, None] - 1).float(),
            "advantages": torch.tensor([1.0, 2.0, 3.0]), "weight_version": torch.zeros(B, T, dtype=torch.int64),
            "trainer_version": torch.tensor(4)}


def test_unpacked_micro_batch_is_trimmed_to_its_longest_row():
    mb = cut_micro_batch(_data(), [2, 1], [6, 2, 3], packed=False)
    assert mb["input_ids"].tolist() == [[13, 14, 15], [7, 8, 9]]
    assert mb["advantages"].tolist() == [3.0, 2.0] and mb["rows"].tolist() == [2, 1]
    assert mb["padding_mask"].tolist() == [[False, False, False], [False, False, True]]
    assert (float(mb["executed_tokens"]), float(mb["real_tokens"])) == (6.0, 5.0)
    assert int(mb["trainer_version"]) == 4
    # sequence parallelism at TP 4: width rounded up to 8, beyond the batch's T = 6
    mb = cut_micro_batch(_data(), [0], [6, 2, 3], packed=False, cols_multiple=4)
    assert mb["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert mb["input_ids"][0, 6:].tolist() == [0, 0] and mb["weight_version"][0, 6:].tolist() == [-1, -1]
    assert float(mb["executed_tokens"]) == 8.0


def test_packed_micro_batch_layout_hand_worked():
    mb = cut_micro_batch(_data(), [2, 0], [6, 2, 3], packed=True, cols_multiple=4)
    assert mb["input_ids"].tolist() == [[13, 14, 15, 1, 2, 3, 4, 5, 6, 0, 0, 0]]
    assert mb["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2]]
    assert mb["packed_targets"].tolist() == [[112, 113, 114, 100, 101, 102, 103, 104, 105, 0, 0, 0]]
    assert mb["packed_loss_mask"].tolist() == [[1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert mb["cu_seqlens"].tolist() == [0, 3, 9, 12] and mb["max_seqlen"] == 6
    assert mb["padding_mask"].tolist() == [[False] * 9 + [True] * 3]
    # the loss view stays per sample: [2 samples, longest 6]
    assert mb["targets"].tolist() == [[112, 113, 114, 115, 116, 117], [100, 101, 102, 103, 104, 105]]
    assert unpack(mb["packed_targets"], mb["unpack_index"])[0, :3].tolist() == [112, 113, 114]
    assert unpack(mb["packed_targets"], mb["unpack_index"])[1].tolist() == mb["targets"][1].tolist()
    assert (float(mb["executed_tokens"]), float(mb["real_tokens"])) == (12.0, 9.0)


def test_filler_micro_batch_trains_nothing():
    mb = cut_micro_batch(_data(), [], [6, 2, 3], packed=True)
    assert mb["input_ids"].shape == (1, 1) and mb["rows"].numel() == 0
    assert float(mb["loss_mask"].sum()) == 0.0 and float(mb["advantages"].abs().sum()) == 0.0
    assert mb["weight_version"].tolist() == [[-1]]
    assert (float(mb["executed_tokens"]), float(mb["real_tokens"])) == (1.0, 0.0)


def test_block_causal_mask_matches_per_sample_causality():
    cu = torch.tensor([0, 3, 9, 12], dtype=torch.int32)
    mask = block_causal_mask(cu, 12)[0, 0]
    seg = [0] * 3 + [1] * 6 + [2] * 3
    for q in range(12):
        for k in range(12):
            assert bool(mask[q, k]) == (not (seg[q] == seg[k] and k <= q)), (q, k)
