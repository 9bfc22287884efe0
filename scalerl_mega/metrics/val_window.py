"""Validation spread over a window of steps (`train.val_mode=window`): the pure part.

The paper validates the policy at one step every 100 (Sec. 2.1, App. A.7); at its scale the policy hardly
moves between two neighbouring steps. A tiny model trained at a toy learning rate does move: two
validations a few steps apart differ by several binomial standard errors (the reproduction's pilots:
reproduction/README.md, "Earlier iterations").
In window mode the held-out prompts of one validation point are split into `val_every` contiguous slices
and slice j is generated at step `start + j` of the window, with the weights of that step; the point
recorded at the window's end is the pass rate over all of them: the mean of R over the window's policies
(same prompts, same samples per prompt, same cost as one point validation). Its compute is the window's
centre (`center_step`), where a smooth curve's window mean is R to second order.

This module holds the slicing, the per-sample outcomes a window accumulates (plain lists, so a checkpoint
stores them) and the metrics of a validation line; no engine, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from scalerl_mega.metrics.rollout_stats import domain_key
from scalerl_mega.types import FinishReason, Group

Outcome = list
"""One validation sample: [prompt index, domain, passed (0/1), reward, truncated (0/1), mean weight version,
turns (the assistant turns of its episode; 1 for a single-turn sample)]. Outcomes saved before `turns` was
recorded have six fields and count as one turn."""


def window_slice(num_prompts: int, *, width: int, position: int) -> range:
    """Indices of the held-out prompts generated at `position` (0-based) of a `width`-step window: contiguous
    slices whose sizes differ by at most one and which cover 0..num_prompts-1 exactly once over the window."""
    if width < 1 or not 0 <= position < width:
        raise ValueError(f"window_slice: position {position} outside a window of width {width}")
    return range(position * num_prompts // width, (position + 1) * num_prompts // width)


def center_step(*, end: int, width: int) -> int:
    """The step whose compute a window point is drawn at. Slices are generated at steps end-width+1..end with
    weight versions end-width..end-1 (mean end - (width+1)/2); the centre is rounded up to a whole step
    (end - width//2), at most half a step later than that mean."""
    return end - width // 2


def outcomes(groups: Iterable[Group], *, index_of: dict[str, int]) -> list[Outcome]:
    """The per-sample outcomes of scored validation groups (`index_of`: prompt_id -> held-out index)."""
    out: list[Outcome] = []
    for g in groups:
        for s in g.samples:
            versions = s.completion.weight_versions
            out.append([index_of[g.prompt.prompt_id], g.prompt.task, int(bool(s.passed)), float(s.reward),
                        int(s.completion.finish_reason == FinishReason.LENGTH),
                        sum(versions) / len(versions) if versions else float(s.completion.submitted_version),
                        int(s.completion.turns)])
    return out


def pass_at_turn(episodes: Iterable[tuple[int, bool]], *, max_turns: int) -> dict[str, float]:
    """`episode/pass_at_turn_<t>` for t = 1..max_turns: the share of all `episodes` ((turns, passed) each) that
    passed and ended at turn t. An episode ends when its environment says done, so a passing episode's last turn
    is the turn whose reply passed; the shares sum to the pass rate. Turns beyond `max_turns` count at
    `max_turns` (an episode cannot hold more)."""
    if max_turns < 1:
        raise ValueError(f"pass_at_turn: max_turns={max_turns} must be >= 1")
    eps = list(episodes)
    if not eps:
        raise ValueError("pass_at_turn: no episodes")
    counts = Counter(min(max(int(t), 1), max_turns) for t, ok in eps if ok)
    return {f"episode/pass_at_turn_{t}": counts[t] / len(eps) for t in range(1, max_turns + 1)}


def val_metrics(samples: Sequence[Outcome], *, expected_prompts: int | None = None,
                max_turns: int = 0) -> dict[str, float]:
    """The fields of one validation line from its samples' outcomes: pass rate, reward, truncation, per-domain
    pass rates and counts (`val/<domain>_pass_rate`, `val/<domain>_samples`), the prompts and samples behind it
    (`val_prompts` x `val_samples_per_prompt` = the N of the binomial noise floor, scaling/io.py) and the mean
    weight version of the samples' tokens. Every prompt present has all its samples (a slice is scored only when
    complete); a window that lost slices anyway (the loop regenerates those a stop left in flight) has fewer
    prompts than `expected_prompts` and says so (`val_prompts_missing`): its N is what was scored. `max_turns` > 0
    (episode runs: `env.max_turns`) adds the pass rate by the turn that passed (`pass_at_turn`)."""
    n = len(samples)
    if n == 0:
        raise ValueError("val_metrics: no validation samples")
    passed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for o in samples:
        total[o[1]] += 1
        passed[o[1]] += o[2]
    out: dict[str, float] = {}
    for domain in sorted(total):
        out[domain_key(domain)] = passed[domain] / total[domain]
        out[f"val/{domain}_samples"] = float(total[domain])
    prompts = len({o[0] for o in samples})
    out.update({
        "val_pass_rate": sum(o[2] for o in samples) / n,
        "val_reward_mean": sum(o[3] for o in samples) / n,
        "val_truncation_rate": sum(o[4] for o in samples) / n,
        "val_prompts": float(prompts),
        "val_samples_per_prompt": n / prompts,
        "val_version_mean": sum(o[5] for o in samples) / n,
    })
    if expected_prompts is not None and prompts < expected_prompts:
        out["val_prompts_missing"] = float(expected_prompts - prompts)
    if max_turns:
        out.update(pass_at_turn(((o[6] if len(o) > 6 else 1, bool(o[2])) for o in samples), max_turns=max_turns))
    return out
