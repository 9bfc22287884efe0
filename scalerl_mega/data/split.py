"""Deterministic held-out validation split (paper Sec. 2 "Scaling curve on held-out validation":
1,000 random prompts of Polaris-53K held out; the scaling law is fitted on them).

Membership depends only on a hash of each prompt's content and the seed, never on file order, so
reordering or appending to the input keeps every existing prompt on its side whenever the size of
the held-out set is unchanged. Duplicate prompts (same id) are collapsed so none can straddle the split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from scalerl_mega.types import Prompt


def prompt_id_for(task: str, text: str) -> str:
    """Stable prompt id: the first 16 hex digits of sha256(task, raw problem text)."""
    return hashlib.sha256(f"{task}\x00{text}".encode()).hexdigest()[:16]


def _key(seed: int, prompt_id: str) -> str:
    return hashlib.sha256(f"{seed}\x00{prompt_id}".encode()).hexdigest()


MAX_HELD_OUT_FRACTION = 0.2
"""The most of a (tiny) dataset's distinct prompts the held-out split takes (`held_out_size`)."""


def held_out_size(n: int, *, num_val: int, max_fraction: float) -> int:
    """`num_val`, but at most `max_fraction` of the (deduplicated) prompts for tiny sets."""
    if num_val < 0 or not 0.0 <= max_fraction < 1.0:
        raise ValueError(f"split: num_val={num_val} must be >= 0 and max_fraction={max_fraction} in [0, 1)")
    return min(num_val, int(n * max_fraction))


def check_held_out(distinct: int, *, num_val: int) -> None:
    """`data.val_prompts` must leave prompts to train on: ValueError when it is >= the `distinct` prompts (> 0)."""
    if distinct and num_val >= distinct:
        raise ValueError(f"data.val_prompts={num_val} must be smaller than the dataset's {distinct} distinct prompts")


def held_out_split(
    prompts: Sequence[Prompt], *, num_val: int = 1000, seed: int = 0, max_fraction: float = MAX_HELD_OUT_FRACTION
) -> tuple[list[Prompt], list[Prompt]]:
    """(train, val): val holds the `k` prompts with the smallest hash(seed, prompt_id), sorted by that
    hash; train keeps the input order. Disjoint by prompt_id; duplicates keep their first occurrence.

    `num_val` at or above the number of distinct prompts is an error (it would leave nothing, or a
    sliver clamped by `max_fraction`, to train on); below it, tiny sets are clamped to `max_fraction`."""
    seen: set[str] = set()
    unique: list[Prompt] = []
    for p in prompts:
        if p.prompt_id not in seen:
            seen.add(p.prompt_id)
            unique.append(p)
    check_held_out(len(unique), num_val=num_val)
    k = held_out_size(len(unique), num_val=num_val, max_fraction=max_fraction)
    ranked = sorted(unique, key=lambda p: _key(seed, p.prompt_id))
    val = ranked[:k]
    val_ids = {p.prompt_id for p in val}
    train = [p for p in unique if p.prompt_id not in val_ids]
    return train, val
