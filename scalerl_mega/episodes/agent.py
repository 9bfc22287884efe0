"""`env=agent`: existing agent code as episodes. `fn(base_url, task) -> float` (`env.agent._target_`) runs in the
reward workers' pool (deadline `env.step_timeout_s` for the whole agent run) and talks to its own base url of an
OpenAI-compatible endpoint (`episodes/agent_server.py`, served in this process). Every chat-completions call of
the agent becomes an engine request on exact ids, bridged here to the loop's engine (`AgentEngine._generate`,
answered from `poll`); when the agent returns, its calls are stitched (`episodes/stitch.py`) and the episode's
sample is the last stitched run (a call that did not extend the previous one started a new run: counted in
`Completion.broken_prefixes`, the earlier runs are not trained). The reward is what `fn` returned; it raising,
timing out or killing its worker is reported exactly as a raising reward is.

Sampling is the loop's (temperature, top_p, seed per call: the trainer's log-probs assume the rollout
temperature); an agent's `max_tokens` and `stop` only shorten a call. At most `env.max_turns` calls and
`env.max_tokens` ids after the first call's prompt: a call beyond them is refused (the agent sees an error).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from scalerl_mega.episodes.driver import TURN_SEED_STRIDE, EngineFront
from scalerl_mega.episodes.env import task_row
from scalerl_mega.interfaces import RolloutEngine, Tokenizer
from scalerl_mega.jsonvalue import JSON
from scalerl_mega.types import Completion, FinishReason, Prompt, SamplingParams


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentCall:
    target: str
    base_url: str
    task: dict


@dataclass(kw_only=True, slots=True)
class AgentOutcome:
    reward: float
    reason: str = "agent"
    detail: str = ""


_FNS: dict[str, JSON] = {}


def run_agent_call(call: AgentCall) -> AgentOutcome:
    """What a pool worker runs: the user's agent function, once."""
    fn = _FNS.get(call.target)
    if fn is None:
        from scalerl_mega.rewards.custom import resolve_target

        fn = _FNS[call.target] = resolve_target(call.target, key="env.agent._target_")
    out = fn(call.base_url, dict(call.task))
    reward = float(out)
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise ValueError(f"{call.target} returned the reward {out!r}: not a finite number")
    return AgentOutcome(reward=reward)


@dataclass(kw_only=True)
class _AgentEpisode:
    key: int
    episode_id: str
    prompt: Prompt
    sampling: SamplingParams
    version: int
    index: int
    calls: int = 0
    opening: int | None = None


def _shutting_down() -> ValueError:
    """A call refused because the run is ending (ValueError: the endpoint answers 400, no traceback logged)."""
    return ValueError("the trainer is shutting down")


class AgentEngine(EngineFront):
    """A `RolloutEngine` of agent episodes over `engine` (module doc)."""

    def __init__(self, engine: RolloutEngine, *, tokenizer: Tokenizer, target: str, timeout_s: float, num_workers: int,
                 failure_reward: float, correct: float, max_turns: int, budget: int, stop_token_ids: list[int],
                 start_method: str = "spawn") -> None:
        from scalerl_mega.episodes.agent_server import AgentEndpoint
        from scalerl_mega.rewards.custom import resolve_target
        from scalerl_mega.rewards.pool import RewardPool

        resolve_target(target, key="env.agent._target_")
        self.inner, self.target, self.timeout_s = engine, target, float(timeout_s)
        self.failure_reward, self.correct = float(failure_reward), float(correct)
        self.max_turns, self.budget = int(max_turns), int(budget)
        self._pool = RewardPool(num_workers=num_workers, score_fn=run_agent_call,
                                deadline_fn=lambda _c: float(timeout_s), init_fn=None, failure_reward=failure_reward,
                                start_method=start_method)
        self.endpoint = AgentEndpoint(tokenizer=tokenizer, generate=self._generate, stop_token_ids=stop_token_ids)
        self.endpoint.__enter__()
        self._next_key = 0
        self._episodes: dict[str, _AgentEpisode] = {}
        self._requests: queue.Queue = queue.Queue()
        self._waiting: dict[str, Future] = {}
        self._jobs: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._closing = threading.Event()
        self._bridge = threading.Lock()
        self._thread = threading.Thread(target=self._run_agents, name="agent-episodes", daemon=True)
        self._thread.start()

    # ---- RolloutEngine -------------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, sampling: SamplingParams, *, n: int, version: int, first_index: int = 0) -> None:
        for j in range(n):
            key, self._next_key = self._next_key, self._next_key + 1
            ep = _AgentEpisode(key=key, episode_id=f"e{key}", prompt=prompt, version=version, index=first_index + j,
                               sampling=dataclasses.replace(sampling, hold_at=None,
                                                            seed=None if sampling.seed is None else sampling.seed + j))
            self._episodes[ep.episode_id] = ep
            base_url = self.endpoint.open_episode(ep.episode_id)
            self._jobs.put((ep, AgentCall(target=self.target, base_url=base_url, task=task_row(prompt))))

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        self._forward_requests()
        busy = not self._results.empty() or bool(self._requests.qsize())
        for c in self.inner.poll(0.0 if busy else min(timeout_s, 0.05)):
            fut = self._waiting.pop(c.prompt_id, None)
            if fut is not None:
                fut.set_result(c)
        return self._finished()

    def close(self) -> None:
        """Shut down with agents in flight: every call waiting for the engine (queued or submitted) and every
        later call is refused at once (the agent sees a 400 error naming the shutdown), so the agents end and
        the thread feeding the pool stops (waited for at most `env.step_timeout_s`, a hung agent's deadline);
        then the endpoint, the engine and the pool close."""
        with self._bridge:
            self._closing.set()
        self._jobs.put(None)
        for fut in self._waiting.values():
            fut.set_exception(_shutting_down())
        self._waiting.clear()
        while True:
            try:
                _, fut = self._requests.get_nowait()
            except queue.Empty:
                break
            fut.set_exception(_shutting_down())
        try:
            self._thread.join(self.timeout_s)
            self.endpoint.close()
            self.inner.close()
        finally:
            self._pool.close()

    @property
    def episodes_in_flight(self) -> int:
        return len(self._episodes)

    # ---- the bridge: endpoint threads -> this thread's engine ----------------------------------------------
    def _generate(self, request: Any) -> Any:
        """The endpoint's `generate` (called on its request threads): queued for `poll`, waited for."""
        from scalerl_mega.episodes.calls import GenerateResult

        fut: Future = Future()
        with self._bridge:
            if self._closing.is_set():
                raise _shutting_down()
            self._requests.put((request, fut))
        c = fut.result(timeout=self.timeout_s)
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
            left = self.budget - (len(request.prompt_ids) - ep.opening)
            if ep.calls >= self.max_turns or left <= 0:
                fut.set_exception(ValueError(f"the episode's budget is spent (env.max_turns={self.max_turns} calls, "
                                             f"env.max_tokens: {self.budget} ids after the first call's prompt)"))
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

    # ---- agents in the pool --------------------------------------------------------------------------------
    def _run_agents(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None or self._closing.is_set():
                return
            batch = [first]
            while True:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    return
                batch.append(nxt)
            try:
                results = self._pool.map([call for _, call in batch])
            except (OSError, ValueError, EOFError):
                if self._closing.is_set():  # close() shut the pool under a hung agent: nothing left to report
                    return
                raise
            for (ep, _), res in zip(batch, results):
                self._results.put((ep, res))

    def _finished(self) -> list[Completion]:
        from scalerl_mega.episodes.stitch import stitch_calls

        out = []
        while True:
            try:
                ep, res = self._results.get_nowait()
            except queue.Empty:
                return out
            self._episodes.pop(ep.episode_id, None)
            calls = self.endpoint.close_episode(ep.episode_id)
            stitched = stitch_calls(calls, prompt_id=ep.prompt.prompt_id, sample_index_base=ep.index)
            reward = float(res.reward)
            if isinstance(res, AgentOutcome):
                result = (reward, reward >= self.correct, "agent")
            else:  # the pool's error result: the agent raised, timed out or its worker died
                result = (self.failure_reward if reward != reward else reward, False, str(res.reason))
            if stitched.samples:
                c = stitched.samples[-1]
                c.sample_index, c.submitted_version = ep.index, ep.version
            else:  # the agent made no call: an empty sample that trains nothing
                c = Completion(prompt_id=ep.prompt.prompt_id, sample_index=ep.index,
                               prompt_ids=list(ep.prompt.token_ids or []), output_ids=[], gen_logprobs=[],
                               weight_versions=[], finish_reason=FinishReason.STOP, submitted_version=ep.version)
            c.turns, c.episode_result, c.broken_prefixes = ep.calls, result, stitched.broken_prefixes
            c.messages = list(calls[-1].messages) if calls else []
            c.env_tokens = len(c.output_ids) - sum(c.mask())
            c.text = ""
            out.append(c)
