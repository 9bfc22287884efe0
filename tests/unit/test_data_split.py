"""Held-out split: deterministic, disjoint, stable under reordering, size rules."""

from __future__ import annotations

import hashlib
import random

import pytest

from scalerl_mega.data.split import held_out_size, held_out_split, prompt_id_for
from scalerl_mega.types import Prompt


def prompts(n: int) -> list[Prompt]:
    return [Prompt(prompt_id=prompt_id_for("math", f"problem {i}"), text=f"problem {i}", task="math", gold=str(i))
            for i in range(n)]


def test_prompt_id_is_a_content_hash():
    expected = hashlib.sha256(b"math\x00What is 2+2?").hexdigest()[:16]
    assert prompt_id_for("math", "What is 2+2?") == expected
    assert prompt_id_for("code", "What is 2+2?") != expected


def test_disjoint_deterministic_and_sized():
    ps = prompts(3000)
    train, val = held_out_split(ps, num_val=1000, seed=0, max_fraction=0.5)
    assert len(val) == 1000 and len(train) == 2000
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in val}
    train2, val2 = held_out_split(ps, num_val=1000, seed=0, max_fraction=0.5)
    assert [p.prompt_id for p in val2] == [p.prompt_id for p in val]
    # train keeps the input order
    order = {p.prompt_id: i for i, p in enumerate(ps)}
    assert [order[p.prompt_id] for p in train] == sorted(order[p.prompt_id] for p in train)
    # a different seed gives a different held-out set
    _, val_s1 = held_out_split(ps, num_val=1000, seed=1, max_fraction=0.5)
    assert {p.prompt_id for p in val_s1} != {p.prompt_id for p in val}


def test_val_is_the_smallest_hashes():
    ps = prompts(50)
    _, val = held_out_split(ps, num_val=5, seed=7)
    keys = sorted(hashlib.sha256(f"7\x00{p.prompt_id}".encode()).hexdigest() for p in ps)[:5]
    assert [hashlib.sha256(f"7\x00{p.prompt_id}".encode()).hexdigest() for p in val] == keys


def test_stable_under_reordering():
    ps = prompts(500)
    shuffled = ps[:]
    random.Random(3).shuffle(shuffled)
    _, a = held_out_split(ps, num_val=100, seed=0)
    _, b = held_out_split(shuffled, num_val=100, seed=0)
    assert {p.prompt_id for p in a} == {p.prompt_id for p in b}


def test_duplicates_cannot_straddle_the_split():
    ps = prompts(100)
    dup = ps + [Prompt(prompt_id=p.prompt_id, text=p.text, task="math", gold=p.gold) for p in ps[:50]]
    train, val = held_out_split(dup, num_val=20, seed=0)
    ids_t, ids_v = [p.prompt_id for p in train], [p.prompt_id for p in val]
    assert len(ids_t) + len(ids_v) == 100 and len(set(ids_t)) == len(ids_t) and not set(ids_t) & set(ids_v)


def test_fraction_for_tiny_sets():
    assert held_out_size(53000, num_val=1000, max_fraction=0.2) == 1000
    assert held_out_size(100, num_val=1000, max_fraction=0.2) == 20
    train, val = held_out_split(prompts(10), num_val=9, max_fraction=0.2)
    assert (len(train), len(val)) == (8, 2)
    # a held-out set as large as the dataset is an error, not a silent shrink
    with pytest.raises(ValueError, match="data.val_prompts=10 must be smaller than the dataset's 10"):
        held_out_split(prompts(10), num_val=10, max_fraction=0.2)
    with pytest.raises(ValueError, match="max_fraction"):
        held_out_size(10, num_val=1, max_fraction=1.0)
