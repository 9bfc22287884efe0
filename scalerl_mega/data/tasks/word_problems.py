"""Generated grade-school word problems in the Polaris schema (`problem`, `answer`): data the project
makes itself, for runs on a real pretrained model (`data=polaris` or `data=jsonl`).

One or two arithmetic steps over small integers, phrased in a handful of everyday templates; the
answer is the integer result (scored by the math verifier, paper App. A.3).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ("Tom", "Ana", "Ravi", "Mia", "Lena", "Omar", "Sara", "Ken")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies")


def _one(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 20), rng.randint(2, 12), rng.randint(2, 6)
    kind = rng.randrange(5)
    if kind == 0:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
    if kind == 1:
        a = a + b
        return f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?", a - b
    if kind == 2:
        return f"{name} buys {c} boxes with {b} {item} in each box. How many {item} is that in total?", b * c
    if kind == 3:
        total = b * c
        return (f"{name} shares {total} {item} equally among {c} friends. How many {item} does each friend "
                f"get?", b)
    return (f"{name} has {a} {item}, buys {c} packs of {b} {item}, then gives away {b}. How many {item} does "
            f"{name} have?", a + b * c - b)


def word_problems(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """`n` distinct problems as Polaris rows {"problem": ..., "answer": ...} (deterministic in `seed`)."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        problem, answer = _one(rng)
        if problem not in seen:
            seen.add(problem)
            rows.append({"problem": problem, "answer": str(answer)})
    return rows


def write_word_problems(path: str | Path, n: int, *, seed: int = 0) -> Path:
    """`word_problems(n, seed=seed)` as a JSONL file at `path`."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in word_problems(n, seed=seed)))
    return path
