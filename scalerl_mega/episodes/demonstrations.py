"""Warm-start traces of a multi-turn protocol: an environment class that can show how its episodes are solved
(`reference_replies(task) -> list[str]`, the assistant's replies in order) gets SFT examples spliced exactly as the
episode driver splices an episode (episodes/driver.py), so the warm start teaches the protocol the RL then trains:

    prompt ids  = the opening (`reset`'s messages, templated once with the generation prompt);
    target ids  = each reply's ids and the stop id that ends it (loss 1), then the environment's answer to the
                  reply (`step`), spliced as the template's difference (loss 0), and so on.

The replies are replayed through the environment itself: a reference that does not pass (its rewards summed
below `correct`, or the environment not done after the last reply) is an error naming the task, so the traces
always show what the environment really says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from scalerl_mega.episodes.env import Environment, check_messages, task_row
from scalerl_mega.episodes.template import ChatSplicer
from scalerl_mega.types import Prompt

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig

SftExample = tuple[list[int], list[int], list[int]]
"""(prompt ids, target ids, target loss mask)."""


class Demonstrating(Environment, Protocol):
    """An environment that shows its protocol: the assistant's replies that pass `task`."""

    def reference_replies(self, task: dict) -> list[str]: ...


def has_demonstrations(env_cls: type) -> bool:
    """Whether an environment class shows its protocol (`reference_replies`)."""
    return callable(getattr(env_cls, "reference_replies", None))


def demonstration(env: Demonstrating, task: dict, splicer: ChatSplicer, *, correct: float) -> SftExample:
    """One task's SFT example from a fresh environment object `env` (see the module doc); ValueError when the
    reference replies do not pass."""
    messages = check_messages(env.reset(dict(task)), where="reset", roles=("system", "user"))
    prompt_ids = splicer.opening(messages)
    target: list[int] = []
    mask: list[int] = []
    reward, done = 0.0, False
    replies = list(env.reference_replies(dict(task)))
    for i, reply in enumerate(replies):
        closing = splicer.closing(messages)
        stop = closing[0] if closing and closing[0] in splicer.stop_token_ids else None
        ids = list(splicer.tokenizer(reply, add_special_tokens=False)["input_ids"]) + ([stop] if stop is not None else [])
        target += ids
        mask += [1] * len(ids)
        messages.append({"role": "assistant", "content": reply})
        new, r, done = env.step(reply)
        reward += float(r)
        if done:
            if i != len(replies) - 1:
                raise ValueError(f"{type(env).__name__}.reference_replies: the episode of {task.get('prompt')!r} "
                                 f"ended after reply {i + 1} of {len(replies)}")
            break
        new = check_messages(new, where="step")
        env_ids = splicer.environment_ids(messages, new, stopped_with=stop)
        target += env_ids
        mask += [0] * len(env_ids)
        messages += new
    if not done or reward < correct:
        raise ValueError(f"{type(env).__name__}.reference_replies of {task.get('prompt')!r} do not pass: reward "
                         f"{reward:g} (reward.correct={correct:g}), done={done}")
    return prompt_ids, target, mask


def demonstrations(env_cls: Callable[..., Demonstrating], kwargs: dict, prompts: Sequence[Prompt], splicer: ChatSplicer, *,
                   correct: float) -> list[SftExample]:
    """The SFT examples of `prompts` (one fresh `env_cls(**kwargs)` each, given the row `reset` gets)."""
    return [demonstration(env_cls(**kwargs), task_row(p), splicer, correct=correct) for p in prompts]


def warm_start_examples(config: TrainConfig, task: Any) -> list[SftExample] | None:
    """The warm start's examples when the run's environment (`env=custom`) shows its protocol: one
    demonstration per training prompt, templated with `env.chat_template`; None otherwise (the task's own traces)."""
    if config.env.name != "custom":
        return None
    from scalerl_mega.rewards.custom import resolve_target

    custom = dict(config.env.custom)
    cls = resolve_target(str(custom["_target_"]), key="env.custom._target_")
    if not has_demonstrations(cls):
        return None
    splicer = ChatSplicer(task.tokenizer, template=str(config.env.chat_template), stop_token_ids=task.stop_token_ids)
    return demonstrations(cls, dict(custom.get("kwargs") or {}), task.train_prompts, splicer,
                          correct=float(config.reward.correct))
