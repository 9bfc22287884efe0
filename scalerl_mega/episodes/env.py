"""The environment seam (`env=custom`): a user's class, built once per episode, that talks in chat messages.

    class MyEnv:
        def __init__(self, **kwargs): ...                       # env.custom.kwargs
        def reset(self, task: dict) -> list[dict]: ...          # the dataset row -> the opening messages
        def step(self, reply: str) -> tuple[list[dict], float, bool]: ...
            # the assistant's reply text -> (messages to append, role user or tool; this turn's reward; done)

The episode's reward is the sum of its turns' rewards. `task` is the dataset row (`task_row`). Every `reset` and
`step` runs on a thread of the episodes' own pool (`episodes.pool.EpisodePool`, `env.concurrency` threads), never
in the reward workers; the environment object stays in the trainer process (it need not pickle). A call that
raises or returns something malformed, or runs past `env.step_timeout_s`, fails its episode
(`episodes.failures`: dropped by default).
"""

from __future__ import annotations

from typing import Protocol

from scalerl_mega.types import Prompt

ROLES = ("user", "tool", "system")


class Environment(Protocol):
    """What `env.custom._target_` names (see the module doc)."""

    def reset(self, task: dict) -> list[dict]: ...

    def step(self, reply: str) -> tuple[list[dict], float, bool]: ...


ADDED_KEYS = ("prompt", "gold", "prompt_id")


def task_row(prompt: Prompt) -> dict:
    """What `reset(task)` and an agent's `fn(base_url, task)` receive: the dataset row with all its own columns
    unchanged (`Prompt.row`; a generated task's row is its `meta`), plus `prompt` (the formatted prompt text),
    `gold` and `prompt_id`. A row that has a column of one of these names is refused (ValueError naming it):
    the added key never overwrites the row's own value."""
    row = prompt.meta if prompt.row is None else prompt.row
    clash = [k for k in ADDED_KEYS if k in row]
    if clash:
        raise ValueError(f"the dataset row of prompt {prompt.prompt_id} has the column(s) {clash}, which episodes add "
                         f"to the row they pass to reset(task) / fn(base_url, task) ({list(ADDED_KEYS)}): rename "
                         f"the column in the dataset")
    return {**row, "prompt": prompt.text, "gold": prompt.gold, "prompt_id": prompt.prompt_id}


def check_messages(messages: object, *, where: str, roles: tuple[str, ...] = ROLES) -> list[dict]:
    """`messages` as a list of {role, content} dicts with roles in `roles`; ValueError naming `where`."""
    if not isinstance(messages, list):
        raise ValueError(f"{where} returned {type(messages).__name__}, expected a list of chat messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in roles or not isinstance(m.get("content"), str):
            raise ValueError(f"{where} returned the message {m!r}: expected {{'role': one of {list(roles)}, "
                             f"'content': str}}")
    return [dict(m) for m in messages]


class EnvRunner:
    """Builds and calls `env.custom._target_` (imported now, so that a bad target fails before any episode).
    `reset` and `step` are what the pool's threads run; each checks what the user's method returned."""

    def __init__(self, *, target: str, kwargs: dict) -> None:
        from scalerl_mega.rewards.custom import resolve_target

        self.cls = resolve_target(target, key="env.custom._target_")
        self.target, self.kwargs = target, dict(kwargs)

    def task(self, prompt: Prompt) -> dict:
        """What `reset` receives for `prompt`: the dataset row (`task_row`; a column clash is refused here, at
        submission, not on a pool thread)."""
        return task_row(prompt)

    def reset(self, task: dict) -> tuple[Environment, list[dict]]:
        """A new environment and its opening messages (roles system/user)."""
        env = self.cls(**self.kwargs)
        messages = check_messages(env.reset(dict(task)), where=f"{self.target}.reset", roles=("system", "user"))
        if not messages:
            raise ValueError(f"{self.target}.reset returned no messages: an episode needs an opening")
        return env, messages

    def step(self, env: Environment, reply: str) -> tuple[list[dict], float, bool]:
        out = env.step(reply)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise ValueError(f"{self.target}.step returned {out!r}: expected (messages, reward, done)")
        messages, reward, done = out
        reward = float(reward)
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"{self.target}.step returned the reward {out[1]!r}: not a finite number")
        return check_messages(messages, where=f"{self.target}.step"), reward, bool(done)
