"""Engine I/O of the RL loop: admitted prompts waiting for their G completions (`_Pending`), the router that
sends engine completions to them or to a validation collection, the per-sample sampling parameters
(interruption points, paper App. A.10) and the scoring of finished groups (reward pool, length penalty).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerl_mega.episodes.failures import DROPPED, dropped_kind, is_dropped
from scalerl_mega.interfaces import LoopComponents, RolloutEngine
from scalerl_mega.types import Completion, Group, Prompt, SamplingParams, ScoredCompletion

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import LengthConfig, RolloutConfig

log = logging.getLogger("scalerl_mega.loop")


@dataclass(kw_only=True)
class _Pending:
    """One admitted prompt: its G completions arrive over time."""

    seq: int
    """Admission order (global counter)."""
    prompt: Prompt
    version: int
    completions: list[Completion] = field(default_factory=list)


class Preempted(Exception):
    """Raised inside a wait when a stop was requested (SIGTERM): the loop checkpoints and returns."""


# ----------------------------------------------------------------------------- engine I/O
class _Router:
    """Routes engine completions to the pending training groups or to a validation collection."""

    def __init__(self, engine: RolloutEngine, *, group_size: int, poll_timeout_s: float, stall_timeout_s: float = 1800.0,
                 stop_requested: Callable[[], bool] | None = None):
        self.engine = engine
        self.G = group_size
        self.poll_timeout_s = poll_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.stop_requested = stop_requested
        self.last_progress = time.monotonic()
        self.queue: deque[_Pending] = deque()
        self.val: dict[str, list[Completion]] = {}
        """Validation completions so far, per prompt_id submitted by `submit_val`."""
        self.val_index: dict[str, tuple[Prompt, int]] = {}
        """The prompt and its held-out index, per validation prompt_id in `val`."""
        self.in_flight = 0
        """Samples submitted and not yet returned."""

    def submit(self, pending: _Pending, sampling: Sequence[SamplingParams]) -> None:
        """Submit the G samples of an admitted prompt, one request each (each has its own seed and
        interruption point)."""
        self.queue.append(pending)
        self._submit_samples(pending.prompt, sampling, version=pending.version)

    def submit_val(self, prompt: Prompt, sampling: Sequence[SamplingParams], *, version: int, index: int) -> None:
        self.val[prompt.prompt_id] = []
        self.val_index[prompt.prompt_id] = (prompt, index)
        self._submit_samples(prompt, sampling, version=version)

    def _submit_samples(self, prompt: Prompt, sampling: Sequence[SamplingParams], *, version: int) -> None:
        for i, sp in enumerate(sampling):
            self.engine.submit(prompt, sp, n=1, version=version, first_index=i)
        if self.in_flight == 0:
            self.last_progress = time.monotonic()
        self.in_flight += len(sampling)

    def pump(self, timeout_s: float | None = None) -> int:
        """Poll the engine once; route what arrived. Returns the number of completions."""
        if self.stop_requested is not None and self.stop_requested():
            raise Preempted()
        got = self.engine.poll(self.poll_timeout_s if timeout_s is None else timeout_s)
        now = time.monotonic()
        if got:
            self.last_progress = now
        elif self.in_flight > 0 and now - self.last_progress > self.stall_timeout_s:
            raise RuntimeError(f"no completion from the engines for {now - self.last_progress:.0f}s with "
                               f"{self.in_flight} requests in flight (rollout.stall_timeout_s="
                               f"{self.stall_timeout_s:g}): a generator is hung or gone")
        for c in got:
            self.in_flight -= 1
            if c.prompt_id in self.val:
                self.val[c.prompt_id].append(c)
                continue
            for p in self.queue:  # oldest first: the same prompt may be admitted twice
                if (p.prompt.prompt_id == c.prompt_id and p.version == c.submitted_version
                        and len(p.completions) < self.G):
                    p.completions.append(c)
                    break
            else:
                log.warning("dropping a completion for unknown prompt %s", c.prompt_id)
        return len(got)

    def oldest_complete(self, n: int) -> bool:
        if len(self.queue) < n:
            return False
        return all(len(self.queue[i].completions) == self.G for i in range(n))

    def pop(self, n: int) -> list[_Pending]:
        return [self.queue.popleft() for _ in range(n)]


def sampling_params(length: LengthConfig, rollout: RolloutConfig, comps: LoopComponents, rng: random.Random, *,
                    seed: int, n: int) -> list[SamplingParams]:
    """SamplingParams of the n samples of one prompt: temperature, budget, seed + i, and with
    length=interruption an interruption point drawn per sample uniformly in
    [interruption_min, interruption_max] (paper App. A.10)."""
    out = []
    for i in range(n):
        params = SamplingParams(max_new_tokens=length.max_new_tokens, temperature=rollout.temperature,
                                top_p=rollout.top_p, stop_token_ids=list(comps.stop_token_ids), seed=seed + i)
        if length.name == "interruption":
            params.interruption_at = rng.randint(length.interruption_min, length.interruption_max)
            params.interruption_ids = list(comps.interruption_ids)
            params.answer_budget = length.answer_budget
        out.append(params)
    return out


# ----------------------------------------------------------------------------- scoring
def score_groups(pendings: Sequence[_Pending], comps: LoopComponents, length: LengthConfig, *,
                 stop_error_rate: float | None = None, where: str = "") -> list[Group]:
    """Rewards for every completion (batched through the reward pool); length penalty if configured. With
    `stop_error_rate` (`reward.stop_error_rate`), `RewardErrorStop` when at least that share of the samples failed
    to score (`where` names them in the message: "step 3", "the validation at step 0")."""
    prompts, texts, flat, todo = [], [], [], []
    for p in pendings:
        for c in sorted(p.completions, key=lambda c: c.sample_index):
            if c.text is None:
                c.text = comps.decode(c.output_ids)
            if c.episode_result is None:  # an episode's environment scored it (episodes/driver.py)
                todo.append(len(flat))
                prompts.append(p.prompt)
                texts.append(c.text)
            flat.append(c)
    results: list = [c.episode_result for c in flat]
    for i, r in zip(todo, comps.reward_fn(prompts, texts) if todo else []):
        results[i] = r
    rewards = [float(r[0]) for r in results]
    if length.name == "penalty":
        import torch

        from scalerl_mega.objective.length import apply_overlong_penalty

        rewards = apply_overlong_penalty(
            torch.tensor(rewards, dtype=torch.float64), torch.tensor([c.num_tokens for c in flat]),
            torch.tensor([bool(r[1]) for r in results]), l_max=length.penalty_max_len,
            l_cache=length.penalty_cache_len).tolist()
    groups, i = [], 0
    for p in pendings:
        g = Group(prompt=p.prompt, samples=[])
        for _ in p.completions:
            s = ScoredCompletion(completion=flat[i], reward=rewards[i], passed=bool(results[i][1]),
                                 reason=str(results[i][2]))
            (g.dropped if is_dropped(s.reason) else g.samples).append(s)
            i += 1
        groups.append(g)
    if stop_error_rate is not None:
        check_reward_errors(groups, stop_error_rate=stop_error_rate, where=where)
    check_dropped_episodes(groups, stop_error_rate=stop_error_rate, where=where)
    return groups


class RewardErrorStop(SystemExit):
    """`reward.stop_error_rate`: the run ends (exit status 1, the one-line message on stderr, no traceback)."""


def reward_error_counts(groups: Sequence[Group]) -> tuple[Counter[str], int]:
    """(samples per distinct scoring error, `rewards.result.error_key`; number of samples)."""
    from scalerl_mega.rewards.result import error_key

    keys = [error_key(s.reason) for g in groups for s in g.samples]
    return Counter(k for k in keys if k is not None), len(keys)


def reward_error_metrics(groups: Sequence[Group]) -> dict[str, object]:
    """A step's scoring failures (the reward raised or its worker died; a timeout is a verdict): `reward/errors`
    (samples), `reward/error_rate`, `reward/errors_by_kind` ({"ValueError at my_reward.py:3": n}, when any),
    `reward/first_error` (the first failing sample's one-line reason without `error: `, when any; report.md quotes it) and
    `reward/timeouts` (samples past the per-item deadline)."""
    from scalerl_mega.rewards.result import ERROR_PREFIX, error_key

    counts, n = reward_error_counts(groups)
    out: dict[str, object] = {"reward/errors": float(sum(counts.values())),
                              "reward/error_rate": sum(counts.values()) / max(n, 1),
                              "reward/timeouts": float(sum(s.reason == "pool_timeout" for g in groups
                                                           for s in g.samples))}
    if counts:
        out["reward/errors_by_kind"] = dict(counts.most_common())
        first = next(s.reason for g in groups for s in g.samples if error_key(s.reason) is not None)
        out["reward/first_error"] = first.removeprefix(ERROR_PREFIX)
    return out


def check_dropped_episodes(groups: Sequence[Group], *, stop_error_rate: float | None, where: str) -> None:
    """`RewardErrorStop` when at least `stop_error_rate` of the episodes of `groups` were dropped
    (`episodes.failures`: timed out, or their environment / agent raised), with the same one-line message form
    as a reward's errors; with `stop_error_rate` None only when every episode was (nothing is left to train)."""
    dropped = [s.reason for g in groups for s in g.dropped]
    n = len(dropped) + sum(len(g.samples) for g in groups)
    if not n or not dropped or len(dropped) / n < (1.0 if stop_error_rate is None else stop_error_rate):
        return
    rate = ("every episode was dropped: nothing is left to train" if stop_error_rate is None
            else f"or set reward.stop_error_rate=null to train on (reward.stop_error_rate={stop_error_rate:g})")
    kinds = Counter(dropped_kind(r) for r in dropped)
    share = f"all {n}" if len(dropped) == n else f"{len(dropped)} of {n}"
    raise RewardErrorStop(
        f"episode error: {share} episodes of {where or 'a step'} were dropped "
        f"({', '.join(f'{k} {c}' for k, c in kinds.most_common())}), e.g. {dropped[0].removeprefix(DROPPED)}; "
        f"the first of each kind is logged above and in the run's train.log. Fix the environment or agent (or raise "
        f"env.step_timeout_s / env.episode_timeout_s), {rate}")


def check_reward_errors(groups: Sequence[Group], *, stop_error_rate: float, where: str) -> None:
    """`RewardErrorStop` when at least `stop_error_rate` of the samples of `groups` failed to score."""
    from scalerl_mega.config.output_dir import in_log_file

    counts, n = reward_error_counts(groups)
    errors = sum(counts.values())
    if not n or not errors or errors / n < stop_error_rate:
        return
    first = next(s.reason for g in groups for s in g.samples if s.reason.startswith(("error: ", "worker_died")))
    share = f"all {n}" if errors == n else f"{errors} of {n}"
    kinds = f" ({len(counts)} distinct errors)" if len(counts) > 1 else ""
    raise RewardErrorStop(
        f"reward error: {share} samples of {where or 'a step'} failed to score{kinds}, e.g. {first.removeprefix('error: ')}; "
        f"the first traceback of each error is {in_log_file()}. Fix the reward function, "
        f"or set reward.stop_error_rate=null to train on (reward.stop_error_rate={stop_error_rate:g})")
