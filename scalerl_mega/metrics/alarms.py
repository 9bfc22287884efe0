"""Truncation-rate alarm (paper App. A.13: at batch 768, truncations of 10-15% typically
destabilised training; ScaleRL stayed below 5%)."""

from __future__ import annotations

import warnings


class TruncationRateWarning(UserWarning):
    """The share of completions that hit the generation budget is above the alarm threshold."""


class TruncationAlarm:
    """Warns when a step's truncation rate exceeds `threshold`; once per excursion above it."""

    def __init__(self, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"metrics.truncation_alarm={threshold!r} must be in (0, 1]")
        self.threshold = threshold
        self._active = False
        self.fired = 0

    def check(self, *, step: int, truncation_rate: float) -> bool:
        """Return True (and warn) when the rate crosses above the threshold."""
        above = truncation_rate > self.threshold
        fire = above and not self._active
        self._active = above
        if fire:
            self.fired += 1
            warnings.warn(
                f"step {step}: truncation rate {truncation_rate:.1%} > {self.threshold:.0%} "
                "(paper App. A.13: 10-15% truncations destabilise RL; consider a larger generation "
                "budget or earlier interruption)",
                TruncationRateWarning,
                stacklevel=2,
            )
        return fire
