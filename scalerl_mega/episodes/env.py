"""The environment seam (`env=custom`): a user's class, built once per episode, that talks in chat messages.

    class MyEnv:
        def __init__(self, **kwargs): ...                       # env.custom.kwargs
        def reset(self, task: dict) -> list[dict]: ...          # the dataset row -> the opening messages
        def step(self, reply: str) -> tuple[list[dict], float, bool]: ...
            # the assistant's reply text -> (messages to append, role user or tool; this turn's reward; done)

The episode's reward is the sum of its turns' rewards. Every `reset` and `step` runs in the reward workers'
pool (`rewards.pool.RewardPool`) under the deadline `env.step_timeout_s`; the environment object travels to
the worker and back with each call (so it must pickle). A call that raises, times out or kills its worker
comes back as the pool's error result, which the episode driver reports exactly as a raising reward is
reported (`reward/errors`, the first traceback logged, `reward.stop_error_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from scalerl_mega.jsonvalue import JSON
from scalerl_mega.types import Prompt

ROLES = ("user", "tool", "system")


class Environment(Protocol):
    """What `env.custom._target_` names (see the module doc)."""

    def reset(self, task: dict) -> list[dict]: ...

    def step(self, reply: str) -> tuple[list[dict], float, bool]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvCall:
    """One `reset` (env None: built here from target and kwargs) or `step` of one episode's environment."""

    target: str
    kwargs: dict
    env: Any = None
    task: dict | None = None
    reply: str | None = None


@dataclass(kw_only=True, slots=True)
class EnvOutcome:
    """What a call returned, with the environment object after it."""

    env: Any
    messages: list[dict]
    reward: float = 0.0
    done: bool = False
    reason: str = "env"
    """Read by the pool's error log (`rewards.result.error_key`): never an error here."""
    detail: str = ""
    extra: dict = field(default_factory=dict)


_CLASSES: dict[str, JSON] = {}


def task_row(prompt: Prompt) -> dict:
    """The dataset row given to `reset`: the prompt's metadata plus `prompt` (its text), `gold`, `task`,
    `prompt_id`."""
    return {**prompt.meta, "prompt": prompt.text, "gold": prompt.gold, "task": prompt.task,
            "prompt_id": prompt.prompt_id}


def check_messages(messages: Any, *, where: str, roles: tuple[str, ...] = ROLES) -> list[dict]:
    """`messages` as a list of {role, content} dicts with roles in `roles`; ValueError naming `where`."""
    if not isinstance(messages, list):
        raise ValueError(f"{where} returned {type(messages).__name__}, expected a list of chat messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in roles or not isinstance(m.get("content"), str):
            raise ValueError(f"{where} returned the message {m!r}: expected {{'role': one of {list(roles)}, "
                             f"'content': str}}")
    return [dict(m) for m in messages]


def run_env_call(call: EnvCall) -> EnvOutcome:
    """What a pool worker runs: build and reset the environment, or step it."""
    if call.env is None:
        cls = _CLASSES.get(call.target)
        if cls is None:
            from scalerl_mega.rewards.custom import resolve_target

            cls = _CLASSES[call.target] = resolve_target(call.target, key="env.custom._target_")
        env = cls(**call.kwargs)
        messages = check_messages(env.reset(dict(call.task or {})), where=f"{call.target}.reset",
                                  roles=("system", "user"))
        if not messages:
            raise ValueError(f"{call.target}.reset returned no messages: an episode needs an opening")
        return EnvOutcome(env=env, messages=messages)
    out = call.env.step(call.reply)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise ValueError(f"{call.target}.step returned {out!r}: expected (messages, reward, done)")
    messages, reward, done = out
    reward = float(reward)
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise ValueError(f"{call.target}.step returned the reward {out[1]!r}: not a finite number")
    return EnvOutcome(env=call.env, messages=check_messages(messages, where=f"{call.target}.step"), reward=reward,
                      done=bool(done))


class EnvRunner:
    """Runs environment calls in a `RewardPool` (`env.step_timeout_s` per call); `map` never raises because of a
    call: a failed one comes back as the pool's `RewardResult` (reason `error: ...`, `pool_timeout`,
    `worker_died`)."""

    def __init__(self, *, target: str, kwargs: dict, step_timeout_s: float, num_workers: int,
                 failure_reward: float, start_method: str = "spawn") -> None:
        from scalerl_mega.rewards.custom import resolve_target
        from scalerl_mega.rewards.pool import RewardPool

        resolve_target(target, key="env.custom._target_")
        self.target, self.kwargs = target, dict(kwargs)
        self.failure_reward = float(failure_reward)
        self._pool = RewardPool(num_workers=num_workers, score_fn=run_env_call,
                                deadline_fn=lambda _call: float(step_timeout_s), init_fn=None,
                                failure_reward=failure_reward, start_method=start_method)

    def map(self, calls: list[EnvCall]) -> list[Any]:
        return self._pool.map(calls) if calls else []

    def reset_call(self, prompt: Prompt) -> EnvCall:
        return EnvCall(target=self.target, kwargs=self.kwargs, task=task_row(prompt))

    def step_call(self, env: Any, reply: str) -> EnvCall:
        return EnvCall(target=self.target, kwargs=self.kwargs, env=env, reply=reply)

    def close(self) -> None:
        self._pool.close()
