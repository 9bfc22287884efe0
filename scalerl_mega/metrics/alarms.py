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


class LogprobMismatchWarning(UserWarning):
    """An on-policy token's engine and trainer log-probs differ by more than the threshold."""


class LogprobMismatchStop(SystemExit):
    """`metrics.mismatch_mode=stop`: the run ends (non-zero exit status, the message on stderr)."""


MISMATCH_KEY = "train/onpolicy_abs_log_ratio_max"


class MismatchGuard:
    """`metrics.max_logprob_mismatch` on a step's `train/onpolicy_abs_log_ratio_max` (the max over
    on-policy tokens of |log pi_train - log pi_engine|; the max rather than the mean because one
    wrong token, e.g. a flipped MoE route or a stale weight shard, is the failure to catch).

    Modes: "warn" warns once per excursion above the threshold; "stop" raises `LogprobMismatchStop`
    (a SystemExit with the message); "assert" raises AssertionError, and `finish()` raises one too
    when no step had an on-policy token to check (a CI run whose check never ran). The loop calls
    `check` after writing the step's metrics and before any checkpoint of that step, so the newest
    checkpoint on disk is the last one taken before the offending step. threshold None: no check.
    """

    def __init__(self, threshold: float | None, mode: str = "stop"):
        if mode not in ("warn", "stop", "assert"):
            raise ValueError(f"metrics.mismatch_mode={mode!r} is not one of ['warn', 'stop', 'assert']")
        if threshold is not None and not threshold > 0:
            raise ValueError(f"metrics.max_logprob_mismatch={threshold!r} must be > 0")
        self.threshold, self.mode = threshold, mode
        self.checked_steps = 0
        self.fired = 0
        self._active = False

    def check(self, *, step: int, metrics: dict) -> bool:
        """Return True when the step exceeded the threshold (warn mode; the others raise)."""
        if self.threshold is None or MISMATCH_KEY not in metrics:
            return False
        self.checked_steps += 1
        value = float(metrics[MISMATCH_KEY])
        above = not value <= self.threshold  # NaN counts as above
        fire = above and not self._active
        self._active = above
        if not above:
            return False
        msg = (f"step {step}: engine-vs-trainer log-prob mismatch {MISMATCH_KEY}={value:.6g} exceeds "
               f"metrics.max_logprob_mismatch={self.threshold:g} (mean "
               f"{float(metrics.get('train/onpolicy_abs_log_ratio_mean', float('nan'))):.6g} over "
               f"{float(metrics.get('train/onpolicy_tokens', 0)):.0f} on-policy tokens)")
        if self.mode == "assert":
            raise AssertionError(msg)
        if self.mode == "stop":
            raise LogprobMismatchStop(f"{msg}; run stopped (metrics.mismatch_mode=stop). No checkpoint of "
                                      "this step was written; the newest checkpoint predates it")
        if fire:
            self.fired += 1
            warnings.warn(msg, LogprobMismatchWarning, stacklevel=2)
        return True

    def finish(self) -> None:
        """End of the run: in assert mode, fail when the check never saw an on-policy token."""
        if self.mode == "assert" and self.threshold is not None and self.checked_steps == 0:
            raise AssertionError(f"metrics.max_logprob_mismatch={self.threshold:g} (mismatch_mode=assert) "
                                 f"checked no step: no step logged {MISMATCH_KEY} (no on-policy tokens)")
