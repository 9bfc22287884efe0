"""Advantages and the zero-variance filter against float64 references from the paper (Sec. 2, 3.2, 4)."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.objective.advantages import compute_advantages, zero_variance_filter, zero_variance_mask


def pstd(xs):  # population std, ddof=0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def ref_advantages(rewards, prompts, normalization, eps):
    groups = {}
    for r, p in zip(rewards, prompts):
        groups.setdefault(p, []).append(r)
    hat = [r - sum(groups[p]) / len(groups[p]) for r, p in zip(rewards, prompts)]  # Â_i = r_i - mean
    if normalization == "none":
        return hat
    if normalization == "prompt":
        return [h / (pstd(groups[p]) + eps) for h, p in zip(hat, prompts)]
    s = pstd(hat)
    return [h / (s + eps) for h in hat]


@pytest.mark.parametrize("normalization", ["batch", "prompt", "none"])
def test_advantages_match_reference(normalization):
    g = torch.Generator().manual_seed(0)
    prompts = [5, 5, 5, 2, 2, 9, 9, 9, 9, 1]  # uneven groups, non-contiguous ids
    rewards = torch.randn(len(prompts), generator=g, dtype=torch.float64)
    got = compute_advantages(rewards, torch.tensor(prompts), normalization=normalization, eps=1e-4)
    exp = ref_advantages(rewards.tolist(), prompts, normalization, 1e-4)
    torch.testing.assert_close(got, torch.tensor(exp, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_hand_worked_binary_rewards():
    # prompt 0: rewards (1, 0, 0, 0) -> Â = (0.75, -0.25, -0.25, -0.25); prompt 1: (1, 1) -> Â = 0.
    r = torch.tensor([1.0, 0, 0, 0, 1, 1], dtype=torch.float64)
    p = torch.tensor([0, 0, 0, 0, 1, 1])
    none = compute_advantages(r, p, normalization="none")
    torch.testing.assert_close(none, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0], dtype=torch.float64))
    # prompt std of (1,0,0,0) = sqrt(3)/4
    prompt = compute_advantages(r, p, normalization="prompt", eps=0.0 + 1e-12)
    torch.testing.assert_close(prompt[:4], none[:4] / (math.sqrt(3) / 4), rtol=1e-9, atol=0)
    assert torch.all(prompt[4:] == 0)
    # batch std over all six Â: mean 0, sum of squares 0.75 -> std sqrt(0.75/6)
    batch = compute_advantages(r, p, normalization="batch", eps=0.0)
    torch.testing.assert_close(batch, none / math.sqrt(0.75 / 6), rtol=1e-12, atol=0)


def test_effective_batch_normalization_uses_kept_samples_only():
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0], dtype=torch.float64)
    p = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    res = zero_variance_filter(r, p, passed=r > 0.5)
    assert res.kept_prompts == [0]
    assert res.dropped == {1: "all_passed", 2: "all_failed"}
    kept = res.keep
    adv = compute_advantages(r[kept], p[kept], normalization="batch", eps=0.0)
    # Â on the kept prompt: (2/3, -1/3, -1/3), population std sqrt(2)/3
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64) / (math.sqrt(2) / 3))
    m = res.metrics()
    assert m["filter/prompts_dropped"] == 2 and m["filter/dropped_all_passed"] == 1
    assert m["filter/samples_kept"] == 3


def test_zero_variance_mask_and_reason_without_pass_flags():
    r = torch.tensor([0.5, 0.5, -1.0, 2.0])
    p = torch.tensor([3, 3, 4, 4])
    assert zero_variance_mask(r, p).tolist() == [False, False, True, True]
    assert zero_variance_filter(r, p).dropped == {3: "constant_reward"}


def test_bad_inputs():
    r = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="prompt_index"):
        compute_advantages(r, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="empty batch"):
        compute_advantages(r[:0], torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="normalization='group'"):
        compute_advantages(r, torch.tensor([0, 0]), normalization="group")
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
