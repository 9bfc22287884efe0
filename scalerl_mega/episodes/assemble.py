"""The episode engines a run's `env` group asks for, over an already-built engine: the one-turn episode
(`env=single`), the environment driver (`env=custom`) or the agent endpoint (`env=agent`), with their own thread
pool and failure policy. Every run's engine is one of these: one rollout path.

`build.py` calls these with the task's pieces; the engine sizing stays there (`max_seq_len` is asked for only
where an episode engine needs it, so a failing check reports in the order it always did).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig
    from scalerl_mega.episodes.failures import EpisodeFailures
    from scalerl_mega.episodes.pool import EpisodePool
    from scalerl_mega.interfaces import RolloutEngine, Tokenizer


class EpisodeTask(Protocol):
    """What the episode engines take from the run's task (`build.Task`)."""

    tokenizer: Tokenizer
    stop_token_ids: list[int]

    def decode(self, ids: list[int]) -> str: ...


def episode_engine(cfg: TrainConfig, engine: RolloutEngine, *, task: EpisodeTask,
                   max_seq_len: Callable[[], int]) -> RolloutEngine:
    """`env=single`: the one-turn episode over it (episodes/single.py); `env=custom`: the episode driver over it
    (episodes/driver.py), the environment on the episodes' own pool, the template checked now
    (episodes/template.py); `env=agent`: `agent_engine`. `max_seq_len`: the local engine's longest sequence (not
    asked for with SGLang)."""
    if cfg.env.name == "single":
        return single_turn_engine(engine, decode=task.decode, correct=float(cfg.reward.correct))
    from scalerl_mega.config.env import episode_budget

    if cfg.env.name == "agent":
        return agent_engine(cfg, engine, task=task, max_seq_len=max_seq_len)
    from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
    from scalerl_mega.episodes.env import EnvRunner
    from scalerl_mega.episodes.template import ChatSplicer

    try:
        splicer = ChatSplicer(task.tokenizer, template=str(cfg.env.chat_template), stop_token_ids=task.stop_token_ids)
        custom = dict(cfg.env.custom)
        runner = EnvRunner(target=str(custom["_target_"]), kwargs=dict(custom.get("kwargs") or {}))
        pool, failures = episode_pool(cfg)
    except Exception:
        engine.close()
        raise
    return EpisodeEngine(engine, runner=runner, splicer=splicer, decode=task.decode, pool=pool, failures=failures,
                         settings=EpisodeSettings(max_turns=int(cfg.env.max_turns), correct=float(cfg.reward.correct),
                                                  budget=episode_budget(cfg.env, max_new_tokens=cfg.length.max_new_tokens),
                                                  step_timeout_s=float(cfg.env.step_timeout_s),
                                                  episode_timeout_s=float(cfg.env.episode_timeout_s),
                                                  max_seq_len=0 if cfg.rollout.name == "sglang"
                                                  else max_seq_len()))


def single_turn_engine(engine: RolloutEngine, *, decode: Callable[[list[int]], str],
                       correct: float = 1.0) -> RolloutEngine:
    """`env=single`: the one-turn episode (`episodes.single.OneTurn`) over `engine`: the opening is the prompt's
    own ids, a turn generates its sampling's budget (the engine checks the sequence length, as for any request),
    the reward group scores it, no deadline of its own (`rollout.stall_timeout_s` covers a hung engine)."""
    from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
    from scalerl_mega.episodes.pool import InlinePool
    from scalerl_mega.episodes.single import OneTurn

    never = float("inf")
    return EpisodeEngine(engine, runner=OneTurn(), splicer=None, decode=decode, pool=InlinePool(),
                         settings=EpisodeSettings(max_turns=1, budget=0, correct=correct, step_timeout_s=never,
                                                  episode_timeout_s=never, reward_group=True))


def episode_pool(cfg: TrainConfig) -> tuple[EpisodePool, EpisodeFailures]:
    """The episodes' own threads (`env.concurrency`) and failure policy (`env.on_error`)."""
    from scalerl_mega.config.env import episode_concurrency
    from scalerl_mega.episodes.failures import EpisodeFailures
    from scalerl_mega.episodes.pool import EpisodePool

    size = episode_concurrency(cfg.env, prompts_per_step=cfg.train.prompts_per_step,
                               generations_per_prompt=cfg.train.generations_per_prompt)
    return (EpisodePool(size=size, name=f"env-{cfg.env.name}"),
            EpisodeFailures(on_error=str(cfg.env.on_error), failure_reward=float(cfg.reward.incorrect)))


def agent_engine(cfg: TrainConfig, engine: RolloutEngine, *, task: EpisodeTask,
                 max_seq_len: Callable[[], int]) -> RolloutEngine:
    """`env=agent`: the agent episodes over `engine` (episodes/agent.py): the OpenAI-compatible endpoint in this
    process, the agent functions on the episodes' own pool (`env.concurrency` threads)."""
    import copy

    from scalerl_mega.config.env import episode_budget
    from scalerl_mega.episodes.agent import AgentEngine, AgentSettings
    from scalerl_mega.episodes.template import resolve_template

    try:
        tokenizer = task.tokenizer
        if cfg.env.chat_template:  # the endpoint templates with the tokenizer's template: a copy carries the fixed one
            tokenizer = copy.copy(tokenizer)
            tokenizer.chat_template = resolve_template(str(cfg.env.chat_template), tokenizer)[0]
        pool, failures = episode_pool(cfg)
        settings = AgentSettings(correct=float(cfg.reward.correct), max_turns=int(cfg.env.max_turns),
                                 budget=episode_budget(cfg.env, max_new_tokens=cfg.length.max_new_tokens),
                                 step_timeout_s=float(cfg.env.step_timeout_s),
                                 episode_timeout_s=float(cfg.env.episode_timeout_s))
        return AgentEngine(engine, tokenizer=tokenizer, target=str(dict(cfg.env.agent)["_target_"]), settings=settings,
                           pool=pool, failures=failures, stop_token_ids=list(task.stop_token_ids),
                           max_seq_len=0 if cfg.rollout.name == "sglang" else max_seq_len())
    except Exception:
        engine.close()
        raise
