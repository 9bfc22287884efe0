"""Length control on token counts (paper Sec. 2 "Controlling Generation Lengths", Sec. 4, App. A.11).

Two alternatives:
- forced interruption: per sample, an interruption length is drawn uniformly in [lo, hi] (paper: [10k, 12k]);
  if the thinking trace reaches it, the end-of-thinking phrase is appended and the model then produces its
  answer within the answer budget. The injected phrase is not trained on (loss mask 0).
- DAPO overlong penalty (App. A.11): R_len(y) = clip((L_max - |y|) / L_cache - 1, -1, 0), added to the reward
  of correct traces only (paper: L_max = 14k, L_cache = 2k).

Pure functions: no tokenizer, no engine. Engines call them with token counts and token-id lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

END_OF_THINKING = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
"""The end-of-thinking phrase of J_ScaleRL (Sec. 4)."""


def sample_interruption_lengths(
    num_samples: int, *, lo: int, hi: int, generator: torch.Generator | None = None
) -> list[int]:
    """Interruption lengths, one per sample, uniform over the integers in [lo, hi] (App. A.11)."""
    if num_samples < 0:
        raise ValueError(f"num_samples={num_samples} must be >= 0")
    if not 0 < lo <= hi:
        raise ValueError(f"interruption range lo={lo}, hi={hi} must satisfy 0 < lo <= hi")
    return torch.randint(lo, hi + 1, (num_samples,), generator=generator).tolist()


@dataclass(kw_only=True, frozen=True, slots=True)
class InterruptionOutcome:
    """Token accounting of one completion under forced interruption."""

    interrupted: bool
    thinking_tokens: int
    """Sampled thinking tokens kept (min(natural thinking length, interruption length))."""
    injected_tokens: int
    """Phrase tokens injected (0 if not interrupted)."""
    answer_tokens: int
    """Sampled tokens after the phrase (0 if not interrupted: the natural answer is part of the trace)."""
    truncated: bool
    """The answer ran out of its budget."""

    @property
    def total_tokens(self) -> int:
        return self.thinking_tokens + self.injected_tokens + self.answer_tokens

    def loss_mask(self) -> list[int]:
        """1 for sampled tokens, 0 for the injected phrase (matches `Completion.loss_mask`)."""
        return [1] * self.thinking_tokens + [0] * self.injected_tokens + [1] * self.answer_tokens


def forced_interruption(
    *,
    natural_length: int,
    interruption_at: int,
    phrase_tokens: int,
    answer_length: int,
    answer_budget: int,
) -> InterruptionOutcome:
    """Outcome of generating with an interruption at `interruption_at` tokens.

    `natural_length`: tokens the model would generate uninterrupted (thinking + answer, ending on its own);
    `answer_length`: tokens the model would generate after the phrase if interrupted; `answer_budget`: cap on
    those. A trace that ends on its own before `interruption_at` is never interrupted.
    """
    for name, v in (("natural_length", natural_length), ("phrase_tokens", phrase_tokens),
                    ("answer_length", answer_length), ("answer_budget", answer_budget)):
        if v < 0:
            raise ValueError(f"{name}={v} must be >= 0")
    if interruption_at <= 0:
        raise ValueError(f"interruption_at={interruption_at} must be > 0")
    if natural_length <= interruption_at:
        return InterruptionOutcome(interrupted=False, thinking_tokens=natural_length, injected_tokens=0,
                                   answer_tokens=0, truncated=False)
    answer = min(answer_length, answer_budget)
    return InterruptionOutcome(interrupted=True, thinking_tokens=interruption_at, injected_tokens=phrase_tokens,
                               answer_tokens=answer, truncated=answer_length > answer_budget)


def interruption_loss_mask(num_output_tokens: int, *, interrupted_at: int | None, phrase_tokens: int) -> list[int]:
    """Loss mask [num_output_tokens]: 0 on the injected phrase at `interrupted_at`, 1 elsewhere."""
    mask = [1] * num_output_tokens
    if interrupted_at is None:
        return mask
    if not 0 <= interrupted_at <= num_output_tokens - phrase_tokens:
        raise ValueError(f"interrupted_at={interrupted_at} with phrase_tokens={phrase_tokens} does not fit in "
                         f"{num_output_tokens} output tokens")
    for i in range(interrupted_at, interrupted_at + phrase_tokens):
        mask[i] = 0
    return mask


def overlong_penalty(lengths: torch.Tensor, *, l_max: int, l_cache: int) -> torch.Tensor:
    """R_len = clip((L_max - |y|) / L_cache - 1, -1, 0) per sample (App. A.11, DAPO)."""
    if not 0 < l_cache <= l_max:
        raise ValueError(f"need 0 < l_cache={l_cache} <= l_max={l_max}")
    lens = torch.as_tensor(lengths, dtype=torch.float64)
    return ((l_max - lens) / l_cache - 1).clamp(-1.0, 0.0)


def apply_overlong_penalty(
    rewards: torch.Tensor, lengths: torch.Tensor, correct: torch.Tensor, *, l_max: int, l_cache: int
) -> torch.Tensor:
    """rewards + R_len on correct traces only (App. A.11); incorrect traces are unchanged."""
    if not (rewards.shape == torch.as_tensor(lengths).shape == torch.as_tensor(correct).shape):
        raise ValueError(f"shape mismatch: rewards {tuple(rewards.shape)}, lengths "
                         f"{tuple(torch.as_tensor(lengths).shape)}, correct {tuple(torch.as_tensor(correct).shape)}")
    pen = overlong_penalty(lengths, l_max=l_max, l_cache=l_cache).to(rewards.dtype)
    return torch.where(torch.as_tensor(correct, dtype=torch.bool), rewards + pen, rewards)
