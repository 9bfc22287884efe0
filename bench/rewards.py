"""Math reward throughput: 1,000 completions scored in-process and through RewardPool with 1 and 2
workers (issue 5). Prints items/s and ratios against the in-process baseline measured in this run.

Two mixes: `synthetic` (arithmetic traces, mostly decided by the fast path) and `latex`
(equivalent forms such as 0.5 vs \\frac{1}{2}: every item goes to math-verify in a forked child).

    .venv/bin/python bench/rewards.py [--n 1000]
"""

from __future__ import annotations

import argparse
import random
import time

from scalerl_mega.rewards.pool import RewardConfig, RewardItem, RewardPool, TaskRewardFn, score_item


def synthetic_items(n: int, cfg: RewardConfig) -> list[RewardItem]:
    from scalerl_mega.data.tasks.arith import arith_prompts, target_text

    rng = random.Random(0)
    prompts, _ = arith_prompts(num_train=n, num_val=0, seed=0)
    items = []
    for p in prompts:
        text = target_text(p.meta["a"], p.meta["b"])
        if rng.random() < 0.5:  # half wrong answers
            text = text.replace("\\boxed{", "\\boxed{1")
        items.append(RewardItem(task="synthetic", text=text, gold=p.gold, config=cfg))
    return items


def latex_items(n: int, cfg: RewardConfig) -> list[RewardItem]:
    rng = random.Random(1)
    items = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(51, 99)
        pred = rf"\frac{{{a}}}{{{b}}}" if i % 3 else rf"\frac{{{2 * a}}}{{{2 * b}}}"
        gold = f"{a}/{b}" if i % 2 else f"{a / b:.12g}" if i % 5 == 0 else rf"\dfrac{{{a}}}{{{b + (i % 7 == 0)}}}"
        items.append(RewardItem(task="math", text=f"<think>...</think>The answer is \\boxed{{{pred}}}.", gold=gold,
                                config=cfg))
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    cfg = RewardConfig()
    for name, make in (("synthetic", synthetic_items), ("latex", latex_items)):
        items = make(args.n, cfg)
        score_item(items[0])  # warm-up (imports, math-verify caches) outside the timing
        t0 = time.perf_counter()
        base = [score_item(it) for it in items]
        base_rate = len(items) / (time.perf_counter() - t0)
        n_pass = sum(r.passed for r in base)
        print(f"[{name}] in-process: {base_rate:8.1f} items/s  (pass rate {n_pass / len(items):.3f}, "
              f"fast path {sum(r.reason == 'fast_path' for r in base)}/{len(items)})")
        for workers in (1, 2):
            with RewardPool(num_workers=workers) as pool:
                pool.map(items[: 4 * workers])  # workers started and warm
                t0 = time.perf_counter()
                res = pool.map(items)
                rate = len(items) / (time.perf_counter() - t0)
            assert [r.passed for r in res] == [r.passed for r in base], "pool and in-process disagree"
            print(f"[{name}] pool, {workers} worker(s): {rate:8.1f} items/s  ({rate / base_rate:.2f}x in-process)")
        # the RewardFn seam: fast-path items stay in the caller, the rest go to the pool
        from scalerl_mega.types import Prompt

        prompts = [Prompt(prompt_id=str(i), text="", task=it.task, gold=it.gold) for i, it in enumerate(items)]
        texts = [it.text for it in items]
        for workers in (1, 2):
            fn = TaskRewardFn(RewardConfig(num_workers=workers))
            try:
                fn(prompts[:8], texts[:8])
                t0 = time.perf_counter()
                out = fn(prompts, texts)
                rate = len(items) / (time.perf_counter() - t0)
            finally:
                fn.close()
            assert [o[1] for o in out] == [r.passed for r in base]
            print(f"[{name}] TaskRewardFn, {workers} worker(s): {rate:8.1f} items/s  ({rate / base_rate:.2f}x in-process)")


if __name__ == "__main__":
    main()
