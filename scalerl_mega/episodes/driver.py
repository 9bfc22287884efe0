"""The episode driver: multi-turn episodes above any `RolloutEngine` (the engines only "continue these ids").

`EpisodeEngine` is itself a `RolloutEngine`, so the loop, its in-flight groups, validation and checkpoints are
unchanged: `submit` starts episodes, `poll` returns finished ones, one `Completion` per episode (the sample
definition of `types.Completion`). Per episode:

1. `reset(task)` (on the episodes' pool, `episodes.pool`) gives the opening messages, templated once
   (`ChatSplicer.opening`);
2. each turn submits the episode's full id list to the engine (a continuation: SGLang's radix cache and the
   local engine's prefill reuse nothing of the ids' meaning, only the ids) with what is left of the budget;
3. the engine's generated ids, log-probs, versions and routes are kept as they are; the reply text (decoded
   from them) goes to `step` (on the pool); its messages are spliced as the template's prefix-preserving
   difference (`ChatSplicer.environment_ids`), loss mask 0, log-prob 0.0, the preceding token's version.
   The templating (the opening, each splice) and the tokenizer-coverage count run on the pool thread right
   after the episode's own `reset`/`step`, not on the thread that drives the engine: with hundreds of episodes
   in flight, templating their turns one after another there would hold up generation;
4. the episode ends when the environment says done, after `env.max_turns` turns, when the budget
   (`env.max_tokens`) runs out (finish reason `length`: a truncation), or when it fails (`episodes.failures`:
   a call raised, a call ran past `env.step_timeout_s` of its own time, the episode past `env.episode_timeout_s`).

Every episode's environment calls run concurrently with the other episodes' and with generation: `poll` never
waits for a call, it collects the finished ones. Deadlines count a call's own time (from when a pool thread
started it), never its wait for a thread or for the engine.

`env=single` is the one-turn episode of this engine (`episodes.single.OneTurn`): no environment, the opening is
the prompt's own ids (the task's tokenisation; no chat template), one turn, and the reward group scores the
completion (`EpisodeSettings.reward_group`); its calls run inline (`episodes.pool.InlinePool`), so the turn is
submitted to the engine inside `submit`, in submission order, as the engine's own request would be.

Staleness counts from the episode's first token: every turn is submitted at the episode's admission version.
Routes (routing replay) are concatenated: each turn contributes the positions after the previous turn's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.episodes.coverage import UnknownIds
from scalerl_mega.episodes.env import EnvRunner, Environment
from scalerl_mega.episodes.failures import EpisodeFailures
from scalerl_mega.episodes.pool import Call, EpisodePool, InlinePool
from scalerl_mega.episodes.single import OneTurn
from scalerl_mega.episodes.template import ChatSplicer
from scalerl_mega.interfaces import RolloutEngine
from scalerl_mega.types import Completion, FinishReason, Prompt, Routes, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    import torch

TURN_SEED_STRIDE = 7919
"""A turn's sampling seed: the sample's seed + turn x this (turn 0 keeps the single-turn seed)."""


@dataclass(kw_only=True)
class _Episode:
    key: int
    prompt: Prompt
    sampling: SamplingParams
    version: int
    index: int
    env: Any = None
    opened: bool = False
    """`reset` has returned (the episode's calls since are `step`s)."""
    messages: list[dict] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    gen_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    routes: list[tuple[Routes, int]] = field(default_factory=list)
    """Each turn's routes and the first position it contributes."""
    interrupted_at: int | None = None
    """Where the first interruption phrase of its turns starts in `output_ids` (paper Sec. 2)."""
    timings: dict[str, float] = field(default_factory=dict)
    """The turns' engine timings, summed per key."""
    turns: int = 0
    reward: float = 0.0
    env_tokens: int = 0
    finish: FinishReason = FinishReason.STOP
    result: tuple[float, bool, str] | None = None
    submitted_at: float = 0.0
    call: Call | None = None
    """The environment call in flight (reset or step), None while generating."""
    inner_id: str | None = None
    """The engine request of the turn in flight."""
    unknown_ids: int = 0
    seen: list[str] = field(default_factory=list)
    """What the model saw of the opening and of each environment splice (episodes/coverage.py)."""

    def ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass(kw_only=True)
class EpisodeSettings:
    """The driver's settings (from `env.*`, `reward.correct/incorrect`)."""

    max_turns: int
    budget: int
    """Output ids (generated + environment) an episode may hold (`config.env.episode_budget`); 0: no episode
    budget (`env=single`: a turn generates its sampling's `max_new_tokens`)."""
    correct: float = 1.0
    """An episode passes when its reward reaches this (`reward.correct`), like a custom reward."""
    max_seq_len: int = 0
    """The engine's longest sequence (ids of the opening + the output), 0: no limit. The engine is sized from
    the dataset's prompts, but the opening is the environment's `reset` messages templated (e.g. with a system
    message): an episode that reaches it ends truncated, like one that spends its budget."""
    step_timeout_s: float = 10.0
    """`env.step_timeout_s`: one `reset`/`step` call's own time at most."""
    episode_timeout_s: float = 3600.0
    """`env.episode_timeout_s`: an episode's wall clock from its submission at most (generation included)."""
    clock: Callable[[], float] = time.monotonic
    """The deadlines' clock (the pool's own: tests move a manual one)."""
    reward_group: bool = False
    """The reward group scores the episodes (`env=single`): a completion carries no episode result, and
    `inflight.score_groups` scores its text like any sample's."""

@dataclass(kw_only=True)
class _EnvCall:
    """What an episode's call on the pool gives back: the environment's answer and the ids its messages splice
    as, templated on the same thread (`splice`)."""

    env: Any = None
    messages: list[dict] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    ids: list[int] | None = None
    """The opening's or the splice's ids; None when nothing was templated."""
    unknown_ids: int = 0
    seen: str = ""
    error: BaseException | None = None
    """The template's refusal (`TemplateError`), raised on the driving thread."""

    def splice(self, make_ids: Callable[[], list[int]], coverage: UnknownIds) -> None:
        try:
            self.ids = make_ids()
        except Exception as e:  # noqa: BLE001 - the driver raises it (a template problem ends the run)
            self.error = e
            return
        self.unknown_ids = coverage.count(self.ids, self.messages)
        self.seen = coverage.seen(self.ids)


POLL_TICK_S = 0.01
"""`poll`'s longest wait on one side (engine or pool) while both have work in flight."""


class EngineFront:
    """What an episode front (`EpisodeEngine`, `episodes.agent.AgentEngine`) passes to the engine it drives
    (`inner`) unchanged: weight updates, pause/resume and the engine's extras (decode_stats, weights_digest, pids)."""

    inner: RolloutEngine

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        self.inner.update_weights(named_tensors, version=version)

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class EpisodeEngine(EngineFront):
    """A `RolloutEngine` of episodes over `engine` (see the module doc); the environment calls run on `pool`."""

    def __init__(self, engine: RolloutEngine, *, runner: EnvRunner | OneTurn, splicer: ChatSplicer | None,
                 decode: Callable[[list[int]], str], settings: EpisodeSettings, pool: EpisodePool | InlinePool,
                 failures: EpisodeFailures | None = None) -> None:
        self.inner, self.runner, self.splicer, self.decode, self.settings = engine, runner, splicer, decode, settings
        self.pool, self.failures = pool, failures or EpisodeFailures()
        self._next_key = 0
        self._episodes: dict[int, _Episode] = {}
        """Every episode not yet finished, by key."""
        self._running: dict[str, _Episode] = {}
        """Episodes with a turn in the engine, by the turn's request id."""
        self._abandoned: set[str] = set()
        """Turns of failed episodes still in the engine: dropped when they come back."""
        self._calling: dict[int, _Episode] = {}
        """Episodes with an environment call in flight, by key."""
        self._done: list[Completion] = []
        self.coverage = None if splicer is None else UnknownIds(splicer.tokenizer)
        """None without a splicer (`env=single`: no environment ids to look at)."""

    # ---- RolloutEngine -------------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, sampling: SamplingParams, *, n: int, version: int, first_index: int = 0) -> None:
        task = self.runner.task(prompt)
        for j in range(n):
            sp = dataclasses.replace(sampling, seed=None if sampling.seed is None else sampling.seed + j,
                                     stop_token_ids=list(sampling.stop_token_ids))
            ep = _Episode(key=self._next_key, prompt=prompt, sampling=sp, version=version, index=first_index + j,
                          submitted_at=self.settings.clock())
            self._episodes[ep.key] = ep
            self._next_key += 1
            self._call(ep, self._reset, task)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        self.pool.wake.clear()
        self._advance()
        waiting = list(self._calling.values())
        wait_s = 0.0 if self._done else min(timeout_s, self._next_deadline(waiting))
        if self._running or self._abandoned:
            got = self.inner.poll(min(wait_s, POLL_TICK_S) if waiting else wait_s)
        else:
            got = []
            if waiting:
                self.pool.wait(wait_s)
        for c in got:
            self._absorb(c)
        self._advance()
        out, self._done = self._done, []
        return out

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.pool.close()

    @property
    def episodes_in_flight(self) -> int:
        return len(self._episodes)

    @property
    def in_flight_turns(self) -> list[int]:
        """Finished turns of each episode now generating (1 or more: an episode between its turns)."""
        return [ep.turns for ep in self._running.values()]

    # ---- one episode's life ------------------------------------------------------------------------------------
    def _next_deadline(self, waiting: list[_Episode]) -> float:
        """Seconds until the first deadline of a call in flight could pass (a bound on how long to wait)."""
        now, s = self.settings.clock(), self.settings
        oldest = next(iter(self._episodes.values()), None)  # by key: submission order
        left = [] if oldest is None else [s.episode_timeout_s - (now - oldest.submitted_at)]
        left += [s.step_timeout_s - ep.call.running_for(now) for ep in waiting if ep.call.started is not None]
        return max(0.0, min(left, default=float("inf"))) + 1e-3

    def _call(self, ep: _Episode, fn: Callable[..., object], *args: object) -> None:
        """Start an environment call of `ep` on the pool; one that is already done (`InlinePool`) moves the
        episode on at once."""
        ep.call = self.pool.submit(fn, *args)
        self._calling[ep.key] = ep
        if ep.call.done:
            self._settle(ep)

    def _settle(self, ep: _Episode) -> None:
        """`ep`'s finished call moves it on: opened, stepped, or failed when the call raised."""
        call, ep.call = ep.call, None
        del self._calling[ep.key]
        if call.error is not None:
            self._fail(ep, "env_error", error=call.error)
        elif not ep.opened:
            ep.opened = True
            self._opened(ep, call.value)
        else:
            self._stepped(ep, call.value)

    def _advance(self) -> None:
        """Finished environment calls move their episodes on; calls and episodes past their deadlines fail."""
        now = self.settings.clock()
        for ep in list(self._calling.values()):
            call = ep.call
            if call is None:  # failed meanwhile
                continue
            if call.done:
                self._settle(ep)
            elif call.running_for(now) > self.settings.step_timeout_s:
                what = "step" if ep.opened else "reset"
                self._fail(ep, "step_timeout", detail=f"{self.runner.target}.{what} ran past env.step_timeout_s="
                                                      f"{self.settings.step_timeout_s:g} s")
        limit = self.settings.episode_timeout_s
        while self._episodes:  # by key: submission order, so only the oldest few are looked at
            ep = next(iter(self._episodes.values()))
            if now - ep.submitted_at <= limit:
                break
            self._fail(ep, "episode_timeout", detail=f"the episode ran past env.episode_timeout_s={limit:g} s")

    def _reset(self, task: dict | None) -> _EnvCall:
        """On a pool thread: the environment's `reset`, its opening messages templated (`_EnvCall.splice`)."""
        env, messages = self.runner.reset(task)
        out = _EnvCall(env=env, messages=messages)
        if messages:
            out.splice(lambda: self.splicer.opening(messages), self.coverage)
        return out

    def _step(self, env: Environment, reply: str, history: list[dict], more: bool,
              stopped_with: int | None) -> _EnvCall:
        """On a pool thread: the environment's `step` on `reply` (the last message of `history`); when the
        episode goes on (`more`, not done, messages to add) their ids spliced after the reply's turn."""
        messages, reward, done = self.runner.step(env, reply)
        out = _EnvCall(messages=messages, reward=reward, done=done)
        if more and not done and messages:
            out.splice(lambda: self.splicer.environment_ids(history, messages, stopped_with=stopped_with),
                       self.coverage)
        return out

    def _opened(self, ep: _Episode, got: _EnvCall) -> None:
        """The opening: the messages templated once, or with none (`env=single`) the prompt's own ids."""
        ep.env, ep.messages = got.env, list(got.messages)
        if ep.messages:
            ep.prompt_ids = self._note(ep, got)
        else:
            ep.prompt_ids = list(ep.prompt.token_ids)
        if self._left(ep) <= 0:  # the opening alone fills the engine's sequence
            ep.finish = FinishReason.LENGTH
            self._finish(ep)
            return
        self._submit_turn(ep)

    def _left(self, ep: _Episode) -> int:
        """Ids the episode may still hold: its budget's rest, within the engine's sequence length."""
        left = self.settings.budget - len(ep.output_ids) if self.settings.budget else ep.sampling.max_new_tokens
        if self.settings.max_seq_len:
            left = min(left, self.settings.max_seq_len - len(ep.prompt_ids) - len(ep.output_ids))
        return left

    def _submit_turn(self, ep: _Episode) -> None:
        left = self._left(ep)
        sp = ep.sampling  # the episode's own copy: its first turn as sampled unless the budget must shrink
        if ep.turns or sp.max_new_tokens > left:
            sp = dataclasses.replace(sp, max_new_tokens=min(sp.max_new_tokens, left),
                                     stop_token_ids=list(sp.stop_token_ids))
        if ep.turns:
            sp.hold_at = None
            if sp.seed is not None:
                sp.seed += TURN_SEED_STRIDE * ep.turns
            if sp.interruption_at is not None and sp.interruption_at + len(sp.interruption_ids) + sp.answer_budget > left:
                sp.interruption_at = None
        inner_id = f"{ep.prompt.prompt_id}#{ep.key}.{ep.turns}"
        turn_prompt = Prompt(prompt_id=inner_id, text=ep.prompt.text, task=ep.prompt.task, gold=ep.prompt.gold,
                             token_ids=ep.ids())
        self._running[inner_id], ep.inner_id = ep, inner_id
        self.inner.submit(turn_prompt, sp, n=1, version=ep.version, first_index=ep.index)

    def _absorb(self, c: Completion) -> None:
        """Append a finished turn to its episode and start the environment's step on its reply."""
        if c.prompt_id in self._abandoned:
            self._abandoned.discard(c.prompt_id)
            return
        ep = self._running.pop(c.prompt_id, None)
        if ep is None:
            raise RuntimeError(f"episode driver: the engine returned {c.prompt_id!r}, which no episode submitted")
        if list(c.prompt_ids) != ep.ids():
            raise RuntimeError(f"episode driver: the engine continued {c.prompt_id!r} from other ids than submitted")
        ep.inner_id = None
        if c.interrupted_at is not None and ep.interrupted_at is None:
            ep.interrupted_at = len(ep.output_ids) + c.interrupted_at
        for key, v in c.timings.items():
            ep.timings[key] = ep.timings.get(key, 0.0) + v
        ep.output_ids += list(c.output_ids)
        ep.gen_logprobs += list(c.gen_logprobs)
        ep.weight_versions += list(c.weight_versions)
        ep.loss_mask += c.mask()
        if c.routes is not None:
            ep.routes.append((c.routes, ep.routes[-1][0].num_positions if ep.routes else 0))
        ep.turns += 1
        ep.finish = c.finish_reason
        reply = self.decode(list(c.output_ids))
        ep.messages.append({"role": "assistant", "content": reply})
        stopped_with = None if self.splicer is None else self.splicer.stop_id(c.output_ids)
        more = ep.turns < self.settings.max_turns and ep.finish in (FinishReason.STOP, FinishReason.INTERRUPTED)
        self._call(ep, self._step, ep.env, reply, list(ep.messages), more, stopped_with)

    def _stepped(self, ep: _Episode, got: _EnvCall) -> None:
        ep.reward += got.reward
        ep.messages += got.messages
        left = self._left(ep)
        if got.ids is None and got.error is None:  # done, out of turns, cut, or nothing to add
            self._finish(ep)
            return
        if got.error is not None:
            raise got.error  # the template's refusal stops the run (it is no failure of the episode)
        if len(got.ids) >= left:  # no room for the messages and one more generated token: truncated
            ep.finish = FinishReason.LENGTH
            self._finish(ep)
            return
        spliced = self._note(ep, got)
        last_version = ep.weight_versions[-1] if ep.weight_versions else ep.version
        ep.output_ids += spliced
        ep.gen_logprobs += [0.0] * len(spliced)
        ep.weight_versions += [last_version] * len(spliced)
        ep.loss_mask += [0] * len(spliced)
        ep.env_tokens += len(spliced)
        self._submit_turn(ep)

    @staticmethod
    def _note(ep: _Episode, got: _EnvCall) -> list[int]:
        """The ids a pool thread templated for `ep`, their tokenizer coverage noted (episodes/coverage.py); the
        template's refusal is raised here, on the driving thread: it stops the run, it is no failure of the
        episode."""
        if got.error is not None:
            raise got.error
        ep.unknown_ids += got.unknown_ids
        ep.seen.append(got.seen)
        return got.ids

    def _fail(self, ep: _Episode, kind: str, *, error: BaseException | None = None, detail: str = "") -> None:
        """The episode ends here (`episodes.failures`: dropped, or scored incorrect); a call or turn still in
        flight is abandoned."""
        if ep.call is not None:
            ep.call.abandoned, ep.call = True, None
            self._calling.pop(ep.key, None)
        if ep.inner_id is not None:
            self._running.pop(ep.inner_id, None)
            self._abandoned.add(ep.inner_id)
            ep.inner_id = None
        if not ep.prompt_ids:
            ep.prompt_ids = list(ep.prompt.token_ids or [])
        ep.result = self.failures.result(kind, error=error, detail=detail)
        self._finish(ep)

    def _finish(self, ep: _Episode) -> None:
        self._episodes.pop(ep.key, None)
        if ep.result is None and not self.settings.reward_group:
            ep.result = (ep.reward, ep.reward >= self.settings.correct, "env")
        self._done.append(Completion(
            prompt_id=ep.prompt.prompt_id, sample_index=ep.index, prompt_ids=ep.prompt_ids,
            output_ids=ep.output_ids, gen_logprobs=ep.gen_logprobs, weight_versions=ep.weight_versions,
            finish_reason=ep.finish, loss_mask=ep.loss_mask, interrupted_at=ep.interrupted_at,
            submitted_version=ep.version, timings=ep.timings,
            routes=concat_routes(ep.routes), turns=ep.turns, env_tokens=ep.env_tokens, episode_result=ep.result,
            messages=ep.messages, text=ep.messages[-1]["content"] if ep.turns else "",
            unknown_ids=ep.unknown_ids, seen=ep.seen))


def concat_routes(parts: list[tuple[Routes, int]]) -> Routes | None:
    """One episode's routes from its turns' (each turn's routes cover every position of its sequence; turn t
    contributes the positions from where turn t-1's ended, whose own routes produced those tokens)."""
    if not parts:
        return None
    if len(parts) == 1:  # one turn: its routes are the episode's
        return parts[0][0]
    import numpy as np

    first = parts[0][0]
    per = first.num_layers * first.topk
    ids, weights, versions = [], [], []
    for r, start in parts:
        ids.append(np.asarray(r.expert_ids)[start * per:])
        weights.append(np.asarray(r.weights, dtype=np.float32)[start * per:] if len(r.weights) else
                       np.zeros(0, np.float32))
        versions += list(r.versions[start:])
    w = np.concatenate(weights)
    return Routes(num_layers=first.num_layers, topk=first.topk, expert_ids=np.concatenate(ids),
                  weights=w if len(w) == len(versions) * per else np.zeros(0, np.float32), versions=versions)
