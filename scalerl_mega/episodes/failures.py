"""What an episode that fails for reasons outside the policy becomes (`env.on_error`).

Kinds: `step_timeout` (an environment `reset`/`step`, or an agent between its calls, ran past
`env.step_timeout_s` of its own time), `episode_timeout` (the episode's wall clock passed `env.episode_timeout_s`),
`env_error` (`reset`/`step` raised or returned something malformed), `agent_error` (the agent function raised
or returned a non-number).

- `env.on_error=drop` (the default): the episode is not trained: its sample carries the reason
  `dropped: <kind>: <detail>` and `inflight.score_groups` moves it out of its group (`Group.dropped`); the
  step counts it (`episode/dropped`, `episode/dropped_by_reason`), and a step where at least
  `reward.stop_error_rate` of the episodes were dropped stops the run with one line.
- `env.on_error=score_incorrect`: the episode is trained with `reward.incorrect`, its reason that of a raising
  reward (`error: <Type> at <file>:<line>: ...`, counted in `reward/errors`) or of a reward past its deadline
  (`pool_timeout`, counted in `reward/timeouts`).

Either way the first failure of each distinct kind is logged once (with its traceback); later ones are counted.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from scalerl_mega.config.env import ON_ERROR
from scalerl_mega.rewards.result import error_key, error_result

log = logging.getLogger("scalerl_mega.episodes")

DROPPED = "dropped: "
KINDS = ("step_timeout", "episode_timeout", "env_error", "agent_error")
TIMEOUT_REASON = "pool_timeout"
"""A timed-out episode's reason under `score_incorrect`: the reward pool's, so `reward/timeouts` counts it."""


def is_dropped(reason: str) -> bool:
    return reason.startswith(DROPPED)


def dropped_kind(reason: str) -> str:
    """The kind of a dropped episode's reason (`dropped: step_timeout: ...` -> `step_timeout`)."""
    return reason[len(DROPPED):].split(":", 1)[0]


@dataclass(kw_only=True)
class EpisodeFailures:
    """Turns a failure into an episode result (module doc) and logs the first of each kind."""

    on_error: str = "drop"
    failure_reward: float = -1.0
    seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"env.on_error={self.on_error!r} must be one of {list(ON_ERROR)}")

    def result(self, kind: str, *, error: BaseException | None = None, detail: str = "",
               quiet: bool = False) -> tuple[float, bool, str]:
        """The episode result of a failure of `kind`: `error` the exception of an `*_error`, `detail` what a
        timeout exceeded (`env.step_timeout_s=10 s in MyEnv.step`). `quiet`: not logged (the run is ending)."""
        if kind not in KINDS:
            raise ValueError(f"unknown episode failure kind {kind!r} (one of {list(KINDS)})")
        if error is not None:
            res = error_result(error)
            reason, trace = res.reason, res.detail
            key = f"{kind}: {error_key(reason)}"
        else:
            reason, trace, key = TIMEOUT_REASON, "", kind
        if not quiet:
            self._log_once(key, kind=kind, reason=reason if error is not None else detail, trace=trace)
        if self.on_error == "drop":
            return 0.0, False, f"{DROPPED}{kind}: {reason if error is not None else detail}"
        return self.failure_reward, False, reason

    def _log_once(self, key: str, *, kind: str, reason: str, trace: str) -> None:
        with self._lock:
            if key in self.seen:
                return
            self.seen.add(key)
        drop = self.on_error == "drop"
        log.warning("episode %s: %s; %s (first of its kind: the same again is only counted, metrics %s)%s", kind,
                    reason, "dropped from training" if drop else "scored incorrect (env.on_error=score_incorrect)",
                    "episode/dropped_by_reason" if drop else "reward/errors, reward/timeouts",
                    "\n" + trace.rstrip() if trace else "")
