"""The outcome of scoring one completion."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardResult:
    """Reward of one completion.

    `passed` is the binary verdict (its mean over a batch is the pass rate in [0, 1]); `reward` is
    the scalar used for advantages (paper App. A.3: +1 correct, -1 incorrect, configurable);
    `reason` says why, for metrics and debugging ("exact", "math_verify", "timeout", ...).
    """

    passed: bool
    reward: float
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardValues:
    """Reward values for a correct and an incorrect completion (paper: +1 / -1)."""

    correct: float = 1.0
    incorrect: float = -1.0

    def __post_init__(self) -> None:
        if not self.correct > self.incorrect:
            raise ValueError(
                f"rewards: correct ({self.correct}) must be greater than incorrect ({self.incorrect})"
            )

    def result(self, passed: bool, reason: str) -> RewardResult:
        return RewardResult(passed=passed, reward=self.correct if passed else self.incorrect, reason=reason)
