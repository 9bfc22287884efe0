"""`env=agent`: existing agent code as episodes. `fn(base_url, task) -> float` (`env.agent._target_`; `task` the
dataset row, `episodes.env.task_row`) runs on a thread of the episodes' own pool (`episodes.pool`,
`env.concurrency` threads; blocking code such as a sync `openai` client, `requests` or `subprocess` is fine) and
talks to its own base url of an OpenAI-compatible endpoint (`episodes/agent_server.py`, served in this process).
Every chat-completions call of the agent becomes an engine request on exact ids, bridged here to the loop's engine
(`AgentEngine._generate`, answered from `poll`); when the agent returns, its calls are stitched
(`episodes/stitch.py`) and the episode's sample is the last stitched run (a call that did not extend the previous
one started a new run: counted in `Completion.broken_prefixes`, the earlier runs are not trained). The reward is
what `fn` returned.

Deadlines bound the agent's own time, not its wait for generation: each stretch of the agent's code (from its
start to its first call, between a call's answer and its next call, from the last answer to its return) at most
`env.step_timeout_s`; the whole episode at most `env.episode_timeout_s` of wall clock. An agent that raises,
returns a non-number or runs past a deadline fails its episode (`episodes.failures`: dropped by default).

Sampling is the loop's (temperature, top_p, seed per call: the trainer's log-probs assume the rollout
temperature); an agent's `max_tokens` and `stop` only shorten a call. At most `env.max_turns` calls and
`env.max_tokens` ids after the first call's prompt: a call beyond them is refused (the agent sees an error).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from scalerl_mega.episodes.driver import TURN_SEED_STRIDE, EngineFront
from scalerl_mega.episodes.env import task_row
from scalerl_mega.episodes.failures import EpisodeFailures
from scalerl_mega.episodes.pool import Call, EpisodePool
from scalerl_mega.interfaces import RolloutEngine, Tokenizer
from scalerl_mega.types import Completion, FinishReason, Prompt, SamplingParams


def run_agent(fn: Callable[[str, dict], object], target: str, base_url: str, task: dict) -> float:
    """What a pool thread runs: the user's agent function, once; its reward checked to be a finite number."""
    out = fn(base_url, dict(task))
    reward = float(out)
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise ValueError(f"{target} returned the reward {out!r}: not a finite number")
    return reward


@dataclass(kw_only=True)
class _AgentEpisode:
    key: int
    episode_id: str
    prompt: Prompt
    sampling: SamplingParams
    version: int
    index: int
    calls: int = 0
    refused: int = 0
    opening: int | None = None
    submitted_at: float = 0.0
    call: Call | None = None
    in_generate: int = 0
    """Chat calls of the agent now waiting for the engine (its own time does not run meanwhile)."""
    own_since: float | None = None
    """When the agent's current stretch of own time began (None while queued for a thread)."""


def _shutting_down() -> ValueError:
    """A call refused because the run is ending (ValueError: the endpoint answers 400, no traceback logged)."""
    return ValueError("the trainer is shutting down")


@dataclass(kw_only=True)
class AgentSettings:
    """The agent episodes' settings (`env.*`, `reward.correct`)."""

    correct: float
    max_turns: int
    budget: int
    step_timeout_s: float = 60.0
    episode_timeout_s: float = 3600.0
    clock: Callable[[], float] = time.monotonic
    """The deadlines' clock (tests move a manual one)."""


class AgentEngine(EngineFront):
    """A `RolloutEngine` of agent episodes over `engine` (module doc); the agents run on `pool`."""

    def __init__(self, engine: RolloutEngine, *, tokenizer: Tokenizer, target: str, settings: AgentSettings,
                 pool: EpisodePool, stop_token_ids: list[int], failures: EpisodeFailures | None = None,
                 max_seq_len: int = 0) -> None:
        from scalerl_mega.episodes.agent_server import AgentEndpoint
        from scalerl_mega.rewards.custom import resolve_target

        self.fn = resolve_target(target, key="env.agent._target_")
        self.inner, self.target, self.settings, self.pool = engine, target, settings, pool
        self.failures = failures or EpisodeFailures()
        self.endpoint = AgentEndpoint(tokenizer=tokenizer, generate=self._generate, stop_token_ids=stop_token_ids,
                                      max_seq_len=max_seq_len, on_refused=self._refused)
        self.endpoint.__enter__()
        self._next_key = 0
        self._episodes: dict[str, _AgentEpisode] = {}
        self._requests: queue.Queue = queue.Queue()
        self._waiting: dict[str, Future] = {}
        self._closing = threading.Event()
        self._bridge = threading.Lock()

    # ---- RolloutEngine -------------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, sampling: SamplingParams, *, n: int, version: int, first_index: int = 0) -> None:
        task = task_row(prompt)
        for j in range(n):
            key, self._next_key = self._next_key, self._next_key + 1
            ep = _AgentEpisode(key=key, episode_id=f"e{key}", prompt=prompt, version=version, index=first_index + j,
                               submitted_at=self.settings.clock(),
                               sampling=dataclasses.replace(sampling, hold_at=None,
                                                            seed=None if sampling.seed is None else sampling.seed + j))
            self._episodes[ep.episode_id] = ep
            base_url = self.endpoint.open_episode(ep.episode_id)
            ep.call = self.pool.submit(self._run_one, ep, base_url, task)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        self.pool.wake.clear()
        self._forward_requests()
        busy = bool(self._requests.qsize()) or any(ep.call.done for ep in self._episodes.values())
        if not busy and not self._waiting:  # every agent in its own code: wait for one to call or to end
            self.pool.wait(min(timeout_s, 0.05))
            self._forward_requests()
        for c in self.inner.poll(0.0 if busy or not self._waiting else min(timeout_s, 0.05)):
            fut = self._waiting.pop(c.prompt_id, None)
            if fut is not None:
                fut.set_result(c)
        return self._finished()

    def close(self) -> None:
        """Shut down with agents in flight: every call waiting for the engine (queued or submitted) and every
        later call is refused at once (the agent sees a 400 error naming the shutdown); the agents still running
        are abandoned without a report (their threads are daemons); then the endpoint, the engine and the pool
        close."""
        with self._bridge:
            self._closing.set()
        for fut in self._waiting.values():
            fut.set_exception(_shutting_down())
        self._waiting.clear()
        while True:
            try:
                _, fut = self._requests.get_nowait()
            except queue.Empty:
                break
            fut.set_exception(_shutting_down())
        for ep in self._episodes.values():
            ep.call.abandoned = True
        try:
            self.endpoint.close()
            self.inner.close()
        finally:
            self.pool.close()

    @property
    def episodes_in_flight(self) -> int:
        return len(self._episodes)

    # ---- the agents, on the pool ------------------------------------------------------------------------------
    def _run_one(self, ep: _AgentEpisode, base_url: str, task: dict) -> float:
        with self._bridge:
            ep.own_since = self.settings.clock()
        return run_agent(self.fn, self.target, base_url, task)

    def _refused(self, episode_id: str) -> None:
        """The endpoint refused one of the episode's calls (a 4xx: counted in `Completion.refused_calls`)."""
        with self._bridge:
            ep = self._episodes.get(episode_id)
            if ep is not None:
                ep.refused += 1

    # ---- the bridge: endpoint threads -> this thread's engine ----------------------------------------------
    def _generate(self, request: Any) -> Any:
        """The endpoint's `generate` (called on its request threads): queued for `poll`, waited for; the wait
        is not the agent's own time."""
        from scalerl_mega.episodes.calls import GenerateResult

        fut: Future = Future()
        with self._bridge:
            if self._closing.is_set():
                raise _shutting_down()
            ep = self._episodes.get(request.episode_id)
            if ep is not None:
                ep.in_generate += 1
            self._requests.put((request, fut))
        self.pool.wake.set()  # a poll waiting for the agents
        try:
            c = fut.result(timeout=self.settings.episode_timeout_s)
        finally:
            with self._bridge:
                if ep is not None:
                    ep.in_generate -= 1
                    ep.own_since = self.settings.clock()
        return GenerateResult(output_ids=list(c.output_ids), gen_logprobs=list(c.gen_logprobs),
                              weight_versions=list(c.weight_versions), finish_reason=c.finish_reason, routes=c.routes)

    def _forward_requests(self) -> None:
        while True:
            try:
                request, fut = self._requests.get_nowait()
            except queue.Empty:
                return
            ep = self._episodes.get(request.episode_id)
            if ep is None:
                fut.set_exception(ValueError(f"episode {request.episode_id} is over"))
                continue
            if ep.opening is None:
                ep.opening = len(request.prompt_ids)
            st = self.settings
            left = st.budget - (len(request.prompt_ids) - ep.opening)
            if ep.calls >= st.max_turns or left <= 0:
                fut.set_exception(ValueError(f"the episode's budget is spent (env.max_turns={st.max_turns} calls, "
                                             f"env.max_tokens: {st.budget} ids after the first call's prompt)"))
                continue
            sp = dataclasses.replace(ep.sampling, max_new_tokens=min(ep.sampling.max_new_tokens, left,
                                                                     request.sampling.max_new_tokens),
                                     stop_token_ids=sorted(set(ep.sampling.stop_token_ids)
                                                           | set(request.sampling.stop_token_ids)),
                                     interruption_at=None)
            if sp.seed is not None:
                sp.seed += TURN_SEED_STRIDE * ep.calls
            inner_id = f"{ep.prompt.prompt_id}#{ep.key}.{ep.calls}"
            ep.calls += 1
            self._waiting[inner_id] = fut
            self.inner.submit(Prompt(prompt_id=inner_id, text="", task=ep.prompt.task, gold=ep.prompt.gold,
                                     token_ids=list(request.prompt_ids)), sp, n=1, version=ep.version,
                              first_index=ep.index)

    # ---- finished and failed episodes ----------------------------------------------------------------------
    def _finished(self) -> list[Completion]:
        out, st = [], self.settings
        now = st.clock()
        for ep in list(self._episodes.values()):
            call = ep.call
            with self._bridge:
                own = 0.0 if ep.in_generate or ep.own_since is None else now - ep.own_since
            if call.done:
                if call.error is not None:
                    result = self.failures.result("agent_error", error=call.error)
                else:
                    result = (call.value, call.value >= st.correct, "agent")
            elif now - ep.submitted_at > st.episode_timeout_s:
                result = self.failures.result("episode_timeout", detail=f"the episode ran past env.episode_timeout_s="
                                                                        f"{st.episode_timeout_s:g} s")
            elif own > st.step_timeout_s:
                result = self.failures.result("step_timeout", detail=f"{self.target} ran past env.step_timeout_s="
                                                                     f"{st.step_timeout_s:g} s of its own time")
            else:
                continue
            call.abandoned = not call.done
            out.append(self._completion(ep, result))
        return out

    def _completion(self, ep: _AgentEpisode, result: tuple[float, bool, str]) -> Completion:
        """The episode's sample: the last stitched run of its calls (module doc)."""
        from scalerl_mega.episodes.stitch import stitch_calls

        self._episodes.pop(ep.episode_id, None)
        calls = self.endpoint.close_episode(ep.episode_id)
        stitched = stitch_calls(calls, prompt_id=ep.prompt.prompt_id, sample_index_base=ep.index)
        if stitched.samples:
            c = stitched.samples[-1]
            c.sample_index, c.submitted_version = ep.index, ep.version
        else:  # the agent made no call: an empty sample that trains nothing
            c = Completion(prompt_id=ep.prompt.prompt_id, sample_index=ep.index,
                           prompt_ids=list(ep.prompt.token_ids or []), output_ids=[], gen_logprobs=[],
                           weight_versions=[], finish_reason=FinishReason.STOP, submitted_version=ep.version)
        c.turns, c.episode_result, c.broken_prefixes = ep.calls, result, stitched.broken_prefixes
        c.refused_calls = ep.refused
        c.messages = list(calls[-1].messages) if calls else []
        c.env_tokens = len(c.output_ids) - sum(c.mask())
        c.text = ""
        return c
