"""A step's episodes as metrics (`episode/*`) and as `episodes.jsonl` lines (`metrics.dump_episodes`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scalerl_mega.episodes.failures import dropped_kind
from scalerl_mega.jsonvalue import JSON
from scalerl_mega.types import Group


def episode_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """Means over the step's episodes: `episode/turns`, `episode/env_tokens`, `episode/length` (output ids,
    generated and environment), `episode/generated_tokens`; `episode/env_errors`: episodes ended by a failed
    environment call (also counted in `reward/errors` / `reward/timeouts`); `episode/broken_prefixes` (`env=agent`:
    calls that did not extend the previous one); `episode/refused_calls` (`env=agent`: calls the endpoint answered
    with an error); `episode/unknown_ids`: environment ids of the step's episodes that are the tokenizer's unknown
    id (a sum: characters the vocabulary lacks, episodes/coverage.py); `dropped_metrics`."""
    cs = [s.completion for g in groups for s in g.samples]
    n = max(len(cs), 1)
    errors = sum(1 for c in cs if c.episode_result is not None and c.episode_result[2] not in ("env", "agent"))
    return {"episode/turns": sum(c.turns for c in cs) / n, "episode/env_tokens": sum(c.env_tokens for c in cs) / n,
            "episode/length": sum(len(c.output_ids) for c in cs) / n,
            "episode/generated_tokens": sum(sum(c.mask()) for c in cs) / n, "episode/env_errors": float(errors),
            "episode/broken_prefixes": float(sum(c.broken_prefixes for c in cs)),
            "episode/refused_calls": float(sum(c.refused_calls for c in cs)),
            "episode/unknown_ids": float(sum(c.unknown_ids for c in cs)), **dropped_metrics(groups)}


def dropped_metrics(groups: Sequence[Group]) -> dict[str, float | dict[str, int]]:
    """`episode/dropped`: the step's episodes not trained (`episodes.failures`); `episode/dropped_by_reason`
    ({"step_timeout": n, ...}, when any)."""
    kinds = Counter(dropped_kind(s.reason) for g in groups for s in g.dropped)
    out: dict[str, float | dict[str, int]] = {"episode/dropped": float(sum(kinds.values()))}
    if kinds:
        out["episode/dropped_by_reason"] = dict(kinds.most_common())
    return out


def episode_lines(groups: Sequence[Group], *, step: int) -> list[dict[str, JSON]]:
    """One `episodes.jsonl` record per episode: step, prompt_id, turns, reward, ids (opening + output), loss_mask
    (0 on the opening and environment ids, 1 on generated ones), messages (their text), seen (`env=custom`: what the
    model saw of the opening and of each environment splice, the decoded ids: `<unk>` where the text had
    characters the tokenizer lacks)."""
    out = []
    for g in groups:
        for s in g.samples:
            c = s.completion
            out.append({"step": step, "prompt_id": c.prompt_id, "sample_index": c.sample_index, "turns": c.turns,
                        "finish_reason": c.finish_reason.value, "reward": s.reward, "passed": s.passed,
                        "prompt_len": len(c.prompt_ids),
                        "ids": [*c.prompt_ids, *c.output_ids], "loss_mask": [0] * len(c.prompt_ids) + c.mask(), "messages": c.messages or [],
                        "seen": c.seen or []})
    return out
