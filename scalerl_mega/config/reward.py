"""The `reward` group (conf/reward/<name>.yaml; paper App. A.3: +1 correct / -1 incorrect). Checked where it is
used: `rewards.custom.check_reward_settings` (the custom function imports) and `rewards.pool.RewardConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class RewardSettings:
    """conf/reward/<name>.yaml (paper App. A.3: +1 correct / -1 incorrect)."""

    name: str = "default"
    correct: float = 1.0
    incorrect: float = -1.0
    require_think: bool = True
    """Completions must close their thinking with `</think>` before the answer is read."""
    require_boxed: bool = False
    num_workers: int = 1
    """Reward worker processes (math-verify, code sandbox, custom rewards)."""
    math_timeout_s: float = 5.0
    code_time_limit_s: float = 5.0
    code_memory_mb: int = 512
    code_partial_credit: bool = False
    code_scratch_mb: int = 64
    """Private tmpfs (cwd, /tmp, /dev/shm) of each sandboxed program (rewards/sandbox.py)."""
    code_hide_paths: list[str] = field(default_factory=list)
    """More host paths the sandbox hides (dataset locations under visible system directories)."""
    item_timeout_s: Optional[float] = None
    """Hard per-item deadline (worker killed); None: math_timeout_s + 1 s (math-verify runs in the worker,
    this is its timeout), code: per-test limits."""
    stop_error_rate: Optional[float] = 1.0
    """Stop the run (one-line message, exit status 1) when at least this share of a step's samples, or of a
    validation's, fail to score: the reward function raised or its worker died (counted per step as
    `reward/errors`, the first traceback of each distinct error logged). 1.0: when every sample fails; null:
    never (errors score `incorrect`)."""
    custom: Any = None
    """Optional {_target_: dotted.path.to.fn, **kwargs}: replaces the built-in verifiers."""
