"""One console line per step: step, reward, pass rate, truncation rate, staleness, tokens/s."""

from __future__ import annotations

from collections.abc import Mapping


def progress_line(*, step: int, total_steps: int, metrics: Mapping[str, float]) -> str:
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
    return " | ".join(parts)
