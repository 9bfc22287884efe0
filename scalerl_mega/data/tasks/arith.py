"""Addition of two 1-3 digit numbers with a short chain of thought (the CPU demo, conf/experiment/demo.yaml).

Prompt `Q:47+38=`; target `<think>7+8+0=15 4+3+1=8</think>\\boxed{85}` then EOS: one `x+y+carry=sum`
step per column from the lowest digit (a missing digit is 0), and ` c1` when a final carry remains.
Difficulty is the number of columns (1-3); carries make a problem harder too (recorded in meta).
Answers are checked by the math verifier (`task="synthetic"`), like real data.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from scalerl_mega.data.split import held_out_split, prompt_id_for
from scalerl_mega.interfaces import Tokenizer
from scalerl_mega.types import Prompt

TASK = "synthetic"


def prompt_text(a: int, b: int) -> str:
    return f"Q:{a}+{b}="


def chain_of_thought(a: int, b: int) -> tuple[str, int]:
    """(column steps, number of carries) for a + b."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry, carries = [], 0, 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
        carries += carry
    if carry:
        steps.append("c1")
    return " ".join(steps), carries


def target_text(a: int, b: int) -> str:
    """The SFT target (without EOS, which is a token: append tokenizer.eos_token_id)."""
    cot, _ = chain_of_thought(a, b)
    return f"<think>{cot}</think>\\boxed{{{a + b}}}"


def make_prompt(a: int, b: int) -> Prompt:
    text = prompt_text(a, b)
    _, carries = chain_of_thought(a, b)
    return Prompt(
        prompt_id=prompt_id_for(TASK, text), text=text, task=TASK, gold=str(a + b),
        meta={"a": a, "b": b, "difficulty": max(len(str(a)), len(str(b))), "carries": carries},
    )


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def sample_problems(n: int, *, seed: int, max_digits: int = 3,
                    difficulty_weights: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """`n` distinct (a, b) pairs. Each operand's digit count is drawn from 1..max_digits with
    `difficulty_weights` (default uniform), then the value uniformly within that digit count."""
    if not 1 <= max_digits <= 6:
        raise ValueError(f"max_digits={max_digits} must be in 1..6")
    w = list(difficulty_weights) if difficulty_weights is not None else [1.0] * max_digits
    if len(w) != max_digits or any(x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"difficulty_weights={w!r} must be {max_digits} non-negative numbers with a positive sum")
    space = sum(((10**d - 10 ** (d - 1)) if d > 1 else 10) for d, x in enumerate(w, 1) if x > 0) ** 2
    if n > space // 2:
        raise ValueError(f"cannot draw {n} distinct problems from about {space} with max_digits={max_digits}")
    rng = random.Random(seed)
    digits = list(range(1, max_digits + 1))
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    while len(out) < n:
        a = _operand(rng, rng.choices(digits, w)[0])
        b = _operand(rng, rng.choices(digits, w)[0])
        if (a, b) not in seen:
            seen.add((a, b))
            out.append((a, b))
    return out


def arith_prompts(*, num_train: int, num_val: int, seed: int = 0, max_digits: int = 3,
                  difficulty_weights: Sequence[float] | None = None) -> tuple[list[Prompt], list[Prompt]]:
    """Deterministic, disjoint (train, val) prompts; val is the held-out set (split.py)."""
    pairs = sample_problems(num_train + num_val, seed=seed, max_digits=max_digits,
                            difficulty_weights=difficulty_weights)
    prompts = [make_prompt(a, b) for a, b in pairs]
    return held_out_split(prompts, num_val=num_val, seed=seed, max_fraction=0.999)


def sft_examples(prompts: Sequence[Prompt]) -> list[tuple[str, str]]:
    """(prompt text, target text) warm-start traces for prompts of this task."""
    return [(p.text, target_text(p.meta["a"], p.meta["b"])) for p in prompts]


def sft_token_ids(tokenizer: Tokenizer, prompt: Prompt) -> tuple[list[int], list[int]]:
    """(prompt ids with <bos>, target ids + <eos>) for SFT; the loss goes on the target ids."""
    p_ids = tokenizer(prompt.text)["input_ids"]
    t_ids = tokenizer(target_text(prompt.meta["a"], prompt.meta["b"]), add_special_tokens=False)["input_ids"]
    return p_ids, [*t_ids, tokenizer.eos_token_id]
