"""What an episode run (`env=custom` / `env=agent`) is checked for before its first step, without a model: the
target imports and has the shape the episodes call (an environment class with `reset(task)` and `step(reply)`,
built with `env.custom.kwargs`; an agent function `fn(base_url, task)`), and the chat template exists and, for
`env=custom`, splices exactly (`template.ChatSplicer.check`, the check `build.episode_engine` makes). Run by
`scalerl-train --validate` and at the run's start alike (train.pre_step_checks); each error names its key."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import EnvConfig
    from scalerl_mega.interfaces import Tokenizer

ENV_METHODS = {"reset": "task", "step": "reply"}
"""The methods an environment class must have, with the one argument each is called with (episodes/env.py)."""


def _binds(fn: Callable, *args: Any, **kwargs: Any) -> bool:
    """Whether `fn` accepts these arguments (True when its signature cannot be read: a builtin or C extension)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def check_env_target(target: str, *, kwargs: dict) -> type:
    """`env.custom._target_`: an importable class with `reset(task)` and `step(reply)` methods that is built with
    `env.custom.kwargs`; returns it. ValueError naming the key."""
    from scalerl_mega.rewards.custom import resolve_target

    key = "env.custom._target_"
    cls = resolve_target(target, key=key)
    if not inspect.isclass(cls):
        raise ValueError(f"{key}={target!r} is a {type(cls).__name__}, not a class: the environment is a class with "
                         "reset(task) and step(reply) methods, built once per episode (docs/extending.md)")
    for name, arg in ENV_METHODS.items():
        method = getattr(cls, name, None)
        if not callable(method):
            raise ValueError(f"{key}={target!r}: the class has no {name}({arg}) method (an environment needs "
                             f"{' and '.join(f'{m}({a})' for m, a in ENV_METHODS.items())})")
        if not _binds(method, None, None):  # (self, arg)
            raise ValueError(f"{key}={target!r}: {cls.__name__}.{name}{inspect.signature(method)} cannot be called "
                             f"as {name}({arg}) (one argument besides self)")
    if not _binds(cls, **kwargs):
        raise ValueError(f"env.custom.kwargs={kwargs!r}: {cls.__name__}{inspect.signature(cls)} cannot be built "
                         f"with them ({key}={target!r})")
    return cls


def check_agent_target(target: str) -> Callable:
    """`env.agent._target_`: an importable function called as `fn(base_url, task)`; returns it."""
    from scalerl_mega.rewards.custom import resolve_target

    key = "env.agent._target_"
    fn = resolve_target(target, key=key)
    if not _binds(fn, "http://127.0.0.1:1/v1", {}):
        raise ValueError(f"{key}={target!r}: {getattr(fn, '__name__', target)}{inspect.signature(fn)} cannot be "
                         "called as fn(base_url, task) (the agent gets its endpoint's base url and the task row)")
    return fn


def check_episode_template(env: EnvConfig, tokenizer: Tokenizer, *, stop_token_ids: Sequence[int]) -> None:
    """`env.chat_template` (or the tokenizer's own) resolves; for `env=custom` it is also prefix-preserving
    (`ChatSplicer`'s check on probe conversations), as the run checks it when it builds the episode engine; the
    agent endpoint checks each call instead (a call its template does not extend starts a new run)."""
    from scalerl_mega.episodes.template import ChatSplicer, resolve_template

    if env.name == "custom":
        ChatSplicer(tokenizer, template=str(env.chat_template), stop_token_ids=stop_token_ids)
    else:
        resolve_template(str(env.chat_template), tokenizer)


def check_episodes(env: EnvConfig, tokenizer: Tokenizer, *, stop_token_ids: Sequence[int]) -> None:
    """Every check of an episode run before its first step (module doc); nothing for `env=single`."""
    if env.name == "single":
        return
    if env.name == "custom":
        custom = dict(env.custom)
        check_env_target(str(custom["_target_"]), kwargs=dict(custom.get("kwargs") or {}))
    else:
        check_agent_target(str(dict(env.agent)["_target_"]))
    check_episode_template(env, tokenizer, stop_token_ids=stop_token_ids)
