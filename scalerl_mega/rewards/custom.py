"""The `reward` Hydra group (conf/reward/*.yaml) and custom rewards given as a `_target_` callable.

`RewardSettings` is the group's schema; `reward_fn_from_settings` builds the run's `RewardFn`:

- no `reward.custom`: `TaskRewardFn` (math verifier / code sandbox, rewards/pool.py) with every
  setting of the group (`require_think`, `num_workers`, `math_timeout_s`, `code_*` limits, ...);
- `reward.custom: {_target_: pkg.module.fn, **kwargs}`: `CustomRewardFn`, which calls
  `fn(completion, gold, **kwargs)` in the same `RewardPool` worker processes with the same hard
  per-item deadline as a math item (`item_timeout_s`, else `math_timeout_s` + 10 s): a call that
  hangs is killed and scores `incorrect` ("pool_timeout"); one that raises scores `incorrect`.

`fn` returns a bool (passed: `correct` / `incorrect`), a number (the reward; passed when it is
>= `correct`), a `(reward, passed)` pair or a `RewardResult`. Example: scalerl_mega/rewards/examples.py,
conf/reward/custom_example.yaml.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from scalerl_mega.config.reward import RewardSettings
from scalerl_mega.rewards.result import RewardResult

TARGET = "_target_"


def pool_config(s: RewardSettings):
    """The `rewards.pool.RewardConfig` of settings `s` (validated there; errors name `reward.<key>`)."""
    from scalerl_mega.rewards.pool import RewardConfig

    keys = [f.name for f in dataclasses.fields(RewardConfig)]
    try:
        values = {k: getattr(s, k) for k in keys}
        values["code_hide_paths"] = tuple(values["code_hide_paths"])
        return RewardConfig(**values)
    except ValueError as exc:
        raise ValueError(str(exc).replace("rewards.", "reward.")) from None


def _custom_parts(custom: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(custom, dict) or not isinstance(custom.get(TARGET), str) or not custom[TARGET]:
        raise ValueError(f"reward.custom={custom!r}: must be a mapping with {TARGET}: <module.function>")
    return custom[TARGET], {k: v for k, v in custom.items() if k != TARGET}


def resolve_target(target: str, *, key: str = "reward.custom._target_"):
    """The callable at dotted path `target`; ValueError naming `key` (the config key it came from) otherwise."""
    import importlib

    module, _, attr = target.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError) as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module.split(".")[0] == exc.name.split(".")[0]:
            hint = (f"; a module of your own must be importable where the run starts: put the directory holding "
                    f"{exc.name.split('.')[0]}/ or {exc.name.split('.')[0]}.py on PYTHONPATH "
                    f"(PYTHONPATH=/path/to/dir scalerl-train ...) or pip install it")
        raise ValueError(f"{key}={target!r}: cannot import it ({exc}){hint}") from None
    if not callable(fn):
        raise ValueError(f"{key}={target!r}: not a callable")
    return fn


def check_reward_settings(s: RewardSettings) -> None:
    """Compose-time checks of the reward group (the custom target is imported, not called)."""
    if s.item_timeout_s is not None and not s.item_timeout_s > 0:
        raise ValueError(f"reward.item_timeout_s={s.item_timeout_s!r} must be > 0 (or null)")
    if s.stop_error_rate is not None and not 0.0 < s.stop_error_rate <= 1.0:
        raise ValueError(f"reward.stop_error_rate={s.stop_error_rate!r} must be in (0, 1] (or null: never stop)")
    pool_config(s)
    if s.custom is not None:
        resolve_target(_custom_parts(s.custom)[0])


@dataclass(frozen=True, kw_only=True, slots=True)
class CustomItem:
    target: str
    kwargs: dict
    text: str
    gold: Any
    correct: float
    incorrect: float


_RESOLVED: dict[str, Any] = {}


def _as_result(out: object, item: CustomItem) -> RewardResult:
    if isinstance(out, RewardResult):
        return out
    if isinstance(out, bool):
        return RewardResult(passed=out, reward=item.correct if out else item.incorrect, reason="custom")
    if isinstance(out, tuple) and len(out) == 2:
        return RewardResult(passed=bool(out[1]), reward=float(out[0]), reason="custom")
    reward = float(out)
    if not math.isfinite(reward):
        raise ValueError(f"custom reward returned {out!r}")
    return RewardResult(passed=reward >= item.correct, reward=reward, reason="custom")


def score_custom_item(item: CustomItem) -> RewardResult:
    """What a pool worker runs for a custom reward (the target is imported once per worker)."""
    fn = _RESOLVED.get(item.target)
    if fn is None:
        fn = _RESOLVED[item.target] = resolve_target(item.target)
    return _as_result(fn(item.text, item.gold, **item.kwargs), item)


class CustomRewardFn:
    """The `RewardFn` seam over a user callable, scored in a `RewardPool` with hard deadlines."""

    def __init__(self, settings: RewardSettings, *, start_method: str = "spawn") -> None:
        from scalerl_mega.rewards.pool import RewardItem, RewardPool, item_deadline

        self.config = pool_config(settings)
        self.target, self.kwargs = _custom_parts(settings.custom)
        resolve_target(self.target)
        deadline = item_deadline(RewardItem(task="math", text="", gold="", config=self.config))
        self._pool = RewardPool(num_workers=self.config.num_workers, score_fn=score_custom_item,
                                deadline_fn=lambda _item: deadline, init_fn=None,
                                failure_reward=self.config.incorrect, start_method=start_method)

    def __call__(self, prompts: list, texts: list[str]) -> list[tuple[float, bool, str]]:
        if len(prompts) != len(texts):
            raise ValueError(f"CustomRewardFn: {len(prompts)} prompts but {len(texts)} texts")
        cfg = self.config
        items = [CustomItem(target=self.target, kwargs=dict(self.kwargs), text=t, gold=p.gold, correct=cfg.correct,
                            incorrect=cfg.incorrect) for p, t in zip(prompts, texts)]
        out = []
        for r in self._pool.map(items) if items else []:
            reward = cfg.incorrect if r.reward != r.reward else r.reward  # NaN (error) -> incorrect
            out.append((reward, r.passed and r.reward == r.reward, r.reason))
        return out

    def close(self) -> None:
        self._pool.close()


def reward_fn_from_settings(s: RewardSettings | None = None, *, num_workers: int | None = None):
    """The run's RewardFn from the reward group (`None`: the group's defaults)."""
    from scalerl_mega.rewards.pool import TaskRewardFn

    s = s if s is not None else RewardSettings()
    if num_workers is not None:
        s = dataclasses.replace(s, num_workers=num_workers) if dataclasses.is_dataclass(s) else s
    if s.custom is not None:
        return CustomRewardFn(s)
    return TaskRewardFn(pool_config(s))
