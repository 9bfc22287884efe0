"""The `env` group (conf/env/<name>.yaml): what one sample is. `single` (the default) is one prompt and one
completion scored by the reward group; `custom` runs a user's environment class turn by turn (episodes/env.py);
`agent` runs a user's agent function against an OpenAI-compatible endpoint (episodes/agent_server.py). Checked
here (pure values); the targets, their signatures and the chat template where the run and `--validate` check
them before any model load (`episodes.checks.check_episodes`); the targets are built with the episodes
(`episodes.env.EnvRunner`, `episodes.agent.AgentEngine`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalerl_mega.config.checks import one_of, positive

ENV_NAMES = ("single", "custom", "agent")
ON_ERROR = ("drop", "score_incorrect")
"""`env.on_error` (`episodes.failures`)."""


@dataclass
class EnvConfig:
    """conf/env/<name>.yaml."""

    name: str = "single"
    max_turns: int = 1
    """Assistant turns per episode at most (`single`: 1). The episode ends earlier when the environment says done."""
    max_tokens: int = 0
    """Token budget of a whole episode after its opening (generated and environment ids together); a turn may
    generate at most what is left of it (and `length.max_new_tokens`). An episode that runs out is truncated
    (finish reason `length`, counted in `truncation_rate`). 0: `length.max_new_tokens` x `max_turns`."""
    step_timeout_s: float = 10.0
    """The environment's or agent's own time at most: each `reset` / `step` call (`env=custom`), each stretch of
    the agent's code between its calls (`env=agent`); the wait for a pool thread or for generation never counts.
    An episode past it fails (`on_error`)."""
    episode_timeout_s: float = 3600.0
    """A whole episode's wall clock at most, from its submission (generation included): a generous cap for what
    `step_timeout_s` cannot see (an agent stuck in a loop of calls). An episode past it fails (`on_error`)."""
    concurrency: int = 0
    """Threads of the episodes' own pool (`episodes/pool.py`), where environment calls and agent functions run,
    apart from the reward workers. 0: `train.prompts_per_step` x `train.generations_per_prompt` (every episode
    of a step in flight; `episode_concurrency`). Threads start on demand."""
    on_error: str = "drop"
    """An episode that times out or whose environment / agent raises: `drop` (not trained; counted in
    `episode/dropped` by reason; a step where at least `reward.stop_error_rate` of the episodes were dropped,
    or every one of them, stops the run) or `score_incorrect` (trained with `reward.incorrect`, counted in `reward/errors` /
    `reward/timeouts`)."""
    chat_template: str = ""
    """The chat template episodes are spliced with. Empty: the tokenizer's own; a name of
    `episodes.template.FIXED_TEMPLATES` (`arith`, `chatml`); or a path to a Jinja file."""
    custom: Any = None
    """`env=custom`: {_target_: pkg.mod.Class, kwargs: {...}}: the environment class, built once per episode."""
    agent: Any = None
    """`env=agent`: {_target_: pkg.mod.fn}: `fn(base_url, task) -> float`, the agent code."""


def episode_budget(env: EnvConfig, *, max_new_tokens: int) -> int:
    """Output ids (generated + environment) an episode may hold: `env.max_tokens`, else max_new_tokens x turns."""
    return int(env.max_tokens) or int(max_new_tokens) * int(env.max_turns)


def episode_concurrency(env: EnvConfig, *, prompts_per_step: int, generations_per_prompt: int) -> int:
    """Threads of the episodes' pool: `env.concurrency`, else every episode of one step."""
    return int(env.concurrency) or int(prompts_per_step) * int(generations_per_prompt)


def validate_env(env: EnvConfig) -> None:
    one_of("env.name", env.name, ENV_NAMES)
    one_of("env.on_error", env.on_error, ON_ERROR)
    positive("env.max_turns", env.max_turns)
    positive("env.step_timeout_s", env.step_timeout_s)
    positive("env.episode_timeout_s", env.episode_timeout_s)
    if isinstance(env.concurrency, bool) or not isinstance(env.concurrency, int) or env.concurrency < 0:
        raise ValueError(f"env.concurrency={env.concurrency!r} must be an integer >= 0 (0: train.prompts_per_step x "
                         f"train.generations_per_prompt threads)")
    if float(env.episode_timeout_s) < float(env.step_timeout_s):
        raise ValueError(f"env.episode_timeout_s={env.episode_timeout_s:g} must be >= env.step_timeout_s="
                         f"{env.step_timeout_s:g}: the episode's cap covers all of its calls and its generation")
    if int(env.max_tokens) < 0:
        raise ValueError(f"env.max_tokens={env.max_tokens!r} must be >= 0 (0: length.max_new_tokens x env.max_turns)")
    if env.name == "single" and int(env.max_turns) != 1:
        raise ValueError(f"env.max_turns={env.max_turns} with env.name=single: a single-turn sample has one turn; "
                         "use env=custom or env=agent for episodes")
    for key in ("custom", "agent"):
        node = getattr(env, key)
        if env.name == key:
            target = node.get("_target_") if hasattr(node, "get") else None
            if not isinstance(target, str) or not target:
                raise ValueError(f"env.{key}._target_ is not set: env={key} needs env.{key}._target_=pkg.module."
                                 f"{'Class' if key == 'custom' else 'function'}")
    if env.name == "custom":
        kwargs = env.custom.get("kwargs", None)
        if kwargs is not None and not hasattr(kwargs, "keys"):
            raise ValueError(f"env.custom.kwargs={kwargs!r} must be a mapping of keyword arguments")
