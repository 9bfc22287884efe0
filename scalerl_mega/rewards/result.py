"""The outcome of scoring one completion."""

from __future__ import annotations

import os
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
    detail: str = ""
    """The traceback when scoring raised (`error_result`); empty otherwise."""


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


ERROR_PREFIX = "error: "
WORKER_DIED = "worker_died"


def error_result(exc: BaseException) -> RewardResult:
    """The result of a scoring call that raised: reward NaN (the RewardFn makes it `incorrect`), reason
    `error: <Type> at <file>:<line>: <message>` (the innermost frame: where it was raised) and the traceback."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    msg = " ".join(str(exc).split())[:200]
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
    return RewardResult(passed=False, reward=float("nan"), reason=f"{ERROR_PREFIX}{type(exc).__name__}{where}: {msg}",
                        detail=detail)


def error_key(reason: str) -> str | None:
    """The distinct error a reason names, None if it is not a scoring failure: `<Type> at <file>:<line>` for a
    scoring call that raised (`error_result`; the message, which may quote the sample, is left out), `worker
    died` for a worker that died mid-item (segfault, os._exit, OOM kill). A timeout is a verdict (incorrect),
    not an error."""
    if reason.startswith(ERROR_PREFIX):
        return reason[len(ERROR_PREFIX):].split(": ", 1)[0]
    if reason.startswith(WORKER_DIED):
        return "worker died"
    return None
