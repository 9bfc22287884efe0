"""One console line per step: step, reward, pass rate, truncation rate, staleness, tokens/s, scoring errors,
and the time: elapsed since the launch started, and the ETA of the remaining steps (`ProgressClock`)."""

from __future__ import annotations

import time
from collections.abc import Mapping


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m` (rounded down to the unit shown)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressClock:
    """Elapsed time since `started` (the launch's start, `time.monotonic()` clock) and the ETA of the remaining
    steps at this launch's mean seconds per step (validations and saves included), measured from the end of its
    first step: the first step also carries the loop's start (the step-0 validation, the first weight push), so the
    ETA starts at the second. `now` is injectable for tests."""

    def __init__(self, *, first_step: int, started: float | None = None, now=time.monotonic) -> None:
        self.now = now
        self.started = now() if started is None else started
        self.first_step = first_step
        self.t_first: float | None = None
        """When this launch's first step ended."""

    def timing(self, *, step: int, total_steps: int) -> tuple[float, float | None]:
        """(elapsed seconds, ETA seconds or None until two steps of this launch are done)."""
        t = self.now()
        if self.t_first is None and step > self.first_step:
            self.t_first = t
        done = step - self.first_step - 1
        eta = (t - self.t_first) / done * max(total_steps - step, 0) if done > 0 and self.t_first is not None else None
        return t - self.started, eta


def progress_line(*, step: int, total_steps: int, metrics: Mapping[str, float], elapsed_s: float | None = None,
                  eta_s: float | None = None) -> str:
    """Format the step's progress line; missing metrics print as '-'."""

    def get(key: str, fmt: str) -> str:
        value = metrics.get(key)
        return "-" if value is None else format(value, fmt)

    width = len(str(total_steps))
    done = step / total_steps if total_steps else 0.0
    bar_len = 20
    filled = min(bar_len, int(round(done * bar_len)))
    bar = "#" * filled + "." * (bar_len - filled)
    parts = [
        f"[{bar}] step {step:>{width}}/{total_steps}",
        f"reward {get('reward_mean', '.3f')}",
        f"pass {get('pass_rate', '.3f')}",
        f"trunc {get('truncation_rate', '.1%')}",
        f"stale {get('staleness_mean', '.2f')}/{get('staleness_max', '.0f')}",
        f"tok/s {get('tokens_per_s', '.0f')}",
    ]
    if "val_pass_rate" in metrics:
        parts.append(f"val {get('val_pass_rate', '.3f')}")
    if metrics.get("reward/errors"):
        parts.append(f"reward errors {get('reward/errors', '.0f')}/{get('samples', '.0f')}")
    if elapsed_s is not None:
        parts.append(f"{format_duration(elapsed_s)} elapsed, ETA " + ("-" if eta_s is None else format_duration(eta_s)))
    return " | ".join(parts)
