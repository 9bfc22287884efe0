"""Length control (paper App. A.11): forced interruption and the DAPO overlong penalty."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.objective.length import (
    END_OF_THINKING, apply_overlong_penalty, forced_interruption, interruption_loss_mask, overlong_penalty,
    sample_interruption_lengths)


def test_phrase_is_the_papers():
    assert END_OF_THINKING == "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


def test_interruption_lengths_uniform_in_closed_range():
    lens = sample_interruption_lengths(4000, lo=10, hi=13, generator=torch.Generator().manual_seed(0))
    assert set(lens) == {10, 11, 12, 13}
    counts = [lens.count(v) for v in range(10, 14)]
    assert min(counts) > 850 and max(counts) < 1150  # ~1000 each (binomial sd ~27)
    with pytest.raises(ValueError, match="lo=5, hi=4"):
        sample_interruption_lengths(1, lo=5, hi=4)


def test_forced_interruption_accounting():
    out = forced_interruption(natural_length=500, interruption_at=100, phrase_tokens=7, answer_length=30,
                              answer_budget=20)
    assert (out.interrupted, out.thinking_tokens, out.injected_tokens, out.answer_tokens, out.truncated) == \
        (True, 100, 7, 20, True)
    assert out.total_tokens == 127
    assert out.loss_mask() == [1] * 100 + [0] * 7 + [1] * 20
    short = forced_interruption(natural_length=90, interruption_at=100, phrase_tokens=7, answer_length=30,
                                answer_budget=20)
    assert not short.interrupted and short.total_tokens == 90 and not short.truncated
    assert interruption_loss_mask(6, interrupted_at=2, phrase_tokens=3) == [1, 1, 0, 0, 0, 1]
    assert interruption_loss_mask(3, interrupted_at=None, phrase_tokens=3) == [1, 1, 1]
    with pytest.raises(ValueError, match="interrupted_at=5"):
        interruption_loss_mask(6, interrupted_at=5, phrase_tokens=3)


def test_overlong_penalty_formula_paper_values():
    # L_max = 14k, L_cache = 2k: no penalty up to 12k, linear to -1 at 14k, -1 beyond.
    lens = torch.tensor([0, 12000, 13000, 13500, 14000, 20000])
    torch.testing.assert_close(overlong_penalty(lens, l_max=14000, l_cache=2000),
                               torch.tensor([0.0, 0.0, -0.5, -0.75, -1.0, -1.0], dtype=torch.float64))
    rewards = torch.tensor([1.0, 1.0, -1.0])
    out = apply_overlong_penalty(rewards, torch.tensor([13000, 11000, 14000]), torch.tensor([True, True, False]),
                                 l_max=14000, l_cache=2000)
    torch.testing.assert_close(out, torch.tensor([0.5, 1.0, -1.0]))  # only correct traces penalised
    with pytest.raises(ValueError, match="l_cache"):
        overlong_penalty(lens, l_max=10, l_cache=20)
