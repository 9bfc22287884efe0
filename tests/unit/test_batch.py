"""batch.py: groups -> TrainBatch, checked against hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.batch import build_train_batch, pack_micro_batches
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, ScoredCompletion


def _sc(prompt_ids, out, logp, versions, reward, *, mask=None, idx=0, pid="p"):
    comp = Completion(prompt_id=pid, sample_index=idx, prompt_ids=prompt_ids, output_ids=out, gen_logprobs=logp,
                      weight_versions=versions, finish_reason=FinishReason.STOP, loss_mask=mask)
    return ScoredCompletion(completion=comp, reward=reward, passed=reward > 0)


def _groups():
    a = Group(prompt=Prompt(prompt_id="a", text="", task="synthetic", gold=""), samples=[
        _sc([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], [0, 0, 1], 1.0, pid="a"),
        _sc([5, 6], [10], [-0.4], [1], 0.0, idx=1, pid="a"),
    ])
    b = Group(prompt=Prompt(prompt_id="b", text="", task="synthetic", gold=""), samples=[
        _sc([2], [3], [-0.5], [0], 1.0, pid="b"),
        _sc([2], [3], [-0.5], [0], 1.0, idx=1, pid="b"),
    ])
    c = Group(prompt=Prompt(prompt_id="c", text="", task="synthetic", gold=""), samples=[
        # token 11 is an injected interruption token: loss mask 0
        _sc([3], [4, 11, 12], [-1.0, 0.0, -2.0], [1, 1, 2], 0.0, mask=[1, 0, 1], pid="c"),
        _sc([3], [13, 14], [-0.7, -0.8], [2, 2], 1.0, idx=1, pid="c"),
        _sc([3], [15], [-0.9], [2], 1.0, idx=2, pid="c"),
    ])
    return [a, b, c]


def _build(groups, **kw):
    args = dict(adv_norm="batch", adv_eps=0.0, aggregation="prompt", filter_zero_variance=True,
                micro_batch_tokens=8)
    args.update(kw)
    return build_train_batch(groups, **args)


def test_layout_filter_and_weights_hand_worked():
    res = _build(_groups())
    b = res.batch
    assert res.kept_groups == [0, 2]
    assert res.metrics["filter/dropped_all_passed"] == 1
    assert b.prompt_ids == ["a", "c"]
    assert b.prompt_index_B.tolist() == [0, 0, 1, 1, 1]
    assert b.input_ids_BT.tolist() == [
        [5, 6, 7, 8, 9], [5, 6, 10, 0, 0], [3, 4, 11, 12, 0], [3, 13, 14, 0, 0], [3, 15, 0, 0, 0]]
    assert b.targets_BT.tolist() == [
        [0, 7, 8, 9, 0], [0, 10, 0, 0, 0], [4, 0, 12, 0, 0], [13, 14, 0, 0, 0], [15, 0, 0, 0, 0]]
    assert b.loss_mask_BT.tolist() == [
        [0, 1, 1, 1, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert torch.allclose(b.gen_logp_BT, torch.tensor([
        [0, -0.1, -0.2, -0.3, 0], [0, -0.4, 0, 0, 0], [-1.0, 0, -2.0, 0, 0], [-0.7, -0.8, 0, 0, 0],
        [-0.9, 0, 0, 0, 0]]))
    assert b.weight_version_BT.tolist() == [
        [-1, 0, 0, 1, -1], [-1, 1, -1, -1, -1], [1, 1, 2, -1, -1], [2, 2, -1, -1, -1], [2, -1, -1, -1, -1]]
    assert b.position_ids_BT.tolist() == [list(range(5))] * 5
    # Prompt aggregation: prompt a has 4 trained tokens, prompt c has 5; 2 prompts.
    w = b.token_weights_BT
    expect_w = b.loss_mask_BT * torch.tensor([1 / 8, 1 / 8, 1 / 10, 1 / 10, 1 / 10])[:, None]
    assert torch.allclose(w, expect_w)
    assert float(w.sum()) == pytest.approx(1.0)


def test_advantages_batch_prompt_none():
    # Kept rewards: a = [1, 0], c = [0, 1, 1]. Centred: [.5, -.5, -2/3, 1/3, 1/3].
    dev = [0.5, -0.5, -2 / 3, 1 / 3, 1 / 3]
    batch_std = math.sqrt(sum(d * d for d in dev) / 5)  # mean of dev is 0
    std_c = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)
    got = _build(_groups(), adv_norm="batch").batch.advantages_B
    assert torch.allclose(got.double(), torch.tensor([d / batch_std for d in dev], dtype=torch.float64), atol=1e-6)
    got = _build(_groups(), adv_norm="prompt").batch.advantages_B
    expect = [0.5 / 0.5, -0.5 / 0.5] + [d / std_c for d in dev[2:]]
    assert torch.allclose(got.double(), torch.tensor(expect, dtype=torch.float64), atol=1e-6)
    got = _build(_groups(), adv_norm="none").batch.advantages_B
    assert torch.allclose(got.double(), torch.tensor(dev, dtype=torch.float64), atol=1e-6)


def test_no_filter_keeps_zero_variance_prompt_in_denominators():
    res = _build(_groups(), filter_zero_variance=False, aggregation="sample", adv_norm="none")
    b = res.batch
    assert res.kept_groups == [0, 1, 2]
    assert b.advantages_B[2:4].tolist() == [0.0, 0.0]  # prompt b: all rewards equal
    # Sample aggregation: 7 samples, w = 1 / (7 * |y_i|).
    lens = [3, 1, 1, 1, 2, 2, 1]
    row_w = b.token_weights_BT.sum(1)
    assert torch.allclose(row_w, torch.full((7,), 1 / 7))
    first = b.token_weights_BT[0]
    assert torch.allclose(first[first > 0], torch.full((lens[0],), 1 / (7 * 3)))


def test_all_zero_variance_gives_no_batch():
    res = _build([_groups()[1]])
    assert res.batch is None and res.kept_groups == [] and res.metrics["batch_prompts"] == 0


def test_batch_carries_the_plan_and_its_padding():
    # lengths of the 5 rows above: [5, 3, 4, 3, 2]; budget 8 tokens per micro-batch (rows x longest row):
    # the plan of tests/unit/test_microbatch.py (no padding), and with packing two packed rows
    res = _build(_groups())
    assert res.batch.lengths_B == [5, 3, 4, 3, 2] and not res.batch.packed
    assert res.batch.micro_batches == pack_micro_batches([5, 3, 4, 3, 2], max_tokens=8) == [[0], [2], [1, 3], [4]]
    assert res.metrics["micro_batches"] == 4 and res.metrics["padding_fraction"] == 0.0
    # packed, first-fit decreasing into 8-token rows: [5, 3] (rows 0, 1), [4, 3] (rows 2, 3), [2] (row 4)
    res = _build(_groups(), pack_sequences=True)
    assert res.batch.packed and res.batch.micro_batches == [[0, 1], [2, 3], [4]]
    assert res.metrics["padding_fraction"] == 0.0
    # a budget that forces padding: 10 tokens, overhead 1: [5, 4] (10) + [3, 3, 2] (9) costs 19 + 2 = 21
    # (2 padded tokens of 19 executed) against [5] [4] [3, 3, 2] at 5 + 4 + 9 + 3 = 21: a tie keeps fewer
    res = _build(_groups(), micro_batch_tokens=10)
    assert res.batch.micro_batches == [[0, 2], [1, 3, 4]]
    assert res.metrics["padding_fraction"] == pytest.approx(1 - 17 / 19)


def test_length_mismatch_is_rejected():
    g = _groups()[0]
    g.samples[0].completion.gen_logprobs = [-0.1]
    with pytest.raises(ValueError, match="gen_logprobs"):
        _build([g])
