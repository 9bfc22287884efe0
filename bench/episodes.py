"""Episodes in flight at once: 256 episodes of 4 turns whose environment sleeps 50 ms per step, on the embedded
model (the in-process local engine, `rollout.in_process`, with the test suite's tiny Llama and the synthetic task's
47-token tokenizer), through the episode driver (`episodes/driver.py`) with `env.concurrency=256` (every episode in
flight) and `env.concurrency=1` (one environment call at a time).

Reports the wall time of each and their ratio, and the engine's generation tokens/s during the concurrent run
against a single-turn run of the same number of requests (1024 one-turn requests of the same budget, submitted at
once): what the episodes' turns cost the engine's batching; and the resident memory a pool thread adds while its
call blocks (`thread_rss_kib`, the cost of `env.concurrency`'s default).

    .venv/bin/python bench/episodes.py                      # prints one JSON line
    .venv/bin/python bench/episodes.py --episodes 32        # a quick look

Random weights, temperature 1: a turn stops on every fourth id of the vocabulary (`STOP_EVERY`; about 4 ids a
turn, at most `--new-tokens`), so that every turn ends with a stop and every episode runs its 4 turns; the figures
are the engine's and the pool's work, not a policy's answers.
"""

from __future__ import annotations

import argparse
import json
import time

SLEEP_S = 0.05
STOP_EVERY = 4


class SleepyEnv:
    """Four turns: each step sleeps 50 ms (a tool's I/O) and answers with the question again."""

    def __init__(self, *, turns: int = 4, sleep_s: float = SLEEP_S) -> None:
        self.turns, self.sleep_s, self.n, self.question = turns, sleep_s, 0, ""

    def reset(self, task: dict) -> list[dict]:
        self.question = task["prompt"]
        return [{"role": "user", "content": self.question}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        time.sleep(self.sleep_s)
        self.n += 1
        if self.n >= self.turns:
            return [], 1.0, True
        return [{"role": "user", "content": " no " + self.question}], 0.0, False


def _engine(*, max_batch: int, max_seq_len: int):
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec

    cfg = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=max_seq_len, tie_word_embeddings=False)
    return InProcessRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="llama", config=cfg, init_seed=0),
                                                    core=CoreConfig(max_batch=max_batch, max_seq_len=max_seq_len)))


def _prompts(tok, n: int):
    from scalerl_mega.types import Prompt

    out = []
    for i in range(n):
        text = f"Q:{i % 97}+{i % 89}="
        out.append(Prompt(prompt_id=f"p{i}", text=text, task="synthetic", gold=str(i % 97 + i % 89),
                          token_ids=tok(text)["input_ids"]))
    return out


def _sampling(tok, new_tokens: int):
    from scalerl_mega.types import SamplingParams

    stops = sorted({tok.eos_token_id, *range(0, len(tok), STOP_EVERY)})
    return SamplingParams(max_new_tokens=new_tokens, temperature=1.0, stop_token_ids=stops, seed=0)


def _drive(eng, tok, *, n: int, new_tokens: int) -> tuple[float, list]:
    """Submit `n` prompts at once, poll until all are back: (wall seconds, completions); closes `eng`."""
    sp = _sampling(tok, new_tokens)
    t0 = time.monotonic()
    for p in _prompts(tok, n):
        eng.submit(p, sp, n=1, version=0)
    out = []
    while len(out) < n:
        out += eng.poll(0.05)
    wall = time.monotonic() - t0
    eng.close()
    return wall, out


def run_episodes(*, episodes: int, concurrency: int, new_tokens: int, max_batch: int) -> dict[str, float]:
    """Wall time and generated tokens of `episodes` 4-turn episodes with `concurrency` environment threads."""
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer
    from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
    from scalerl_mega.episodes.env import EnvRunner
    from scalerl_mega.episodes.pool import EpisodePool
    from scalerl_mega.episodes.template import ChatSplicer

    tok = build_arith_tokenizer()
    eos = tok.eos_token_id
    eng = EpisodeEngine(_engine(max_batch=max_batch, max_seq_len=512),
                        runner=EnvRunner(target="bench.episodes.SleepyEnv", kwargs={}),
                        splicer=ChatSplicer(tok, template="arith", stop_token_ids=[eos]),
                        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                        pool=EpisodePool(size=concurrency),
                        settings=EpisodeSettings(max_turns=4, budget=400, correct=1.0, step_timeout_s=60.0))
    wall, out = _drive(eng, tok, n=episodes, new_tokens=new_tokens)
    turns = [c.turns for c in out]
    if turns != [4] * episodes:
        raise RuntimeError(f"expected {episodes} episodes of 4 turns, got turns {sorted(set(turns))}")
    return {"wall_s": wall, "generated_tokens": float(sum(sum(c.mask()) for c in out))}


def run_single_turn(*, requests: int, new_tokens: int, max_batch: int) -> dict[str, float]:
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    tok = build_arith_tokenizer()
    wall, out = _drive(_engine(max_batch=max_batch, max_seq_len=512), tok, n=requests, new_tokens=new_tokens)
    return {"wall_s": wall, "generated_tokens": float(sum(len(c.output_ids) for c in out))}


def thread_rss_kib(n: int) -> float:
    """Resident memory (KiB) each of `n` pool threads adds while its call blocks (an environment waiting on I/O):
    the process's RSS with the `n` threads started and blocked, minus before, over `n`."""
    import os
    import threading

    from scalerl_mega.episodes.pool import EpisodePool

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

    pool, gate = EpisodePool(size=n), threading.Event()
    before = rss()
    calls = [pool.submit(gate.wait) for _ in range(n)]
    while pool.threads < n or any(c.started is None for c in calls):
        time.sleep(0.01)
    after = rss()
    gate.set()
    pool.close()
    return (after - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=256)
    args = ap.parse_args()
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench.episodes.SleepyEnv` for the runner

    torch.set_num_threads(1)
    kw = dict(new_tokens=args.new_tokens, max_batch=args.max_batch)
    many = run_episodes(episodes=args.episodes, concurrency=args.episodes, **kw)
    one = run_episodes(episodes=args.episodes, concurrency=1, **kw)
    single = run_single_turn(requests=4 * args.episodes, **kw)
    print(json.dumps({
        "episodes": args.episodes, "turns": 4, "env_sleep_s": SLEEP_S, "new_tokens": args.new_tokens,
        "wall_s_concurrency_all": round(many["wall_s"], 2), "wall_s_concurrency_1": round(one["wall_s"], 2),
        "ratio": round(one["wall_s"] / many["wall_s"], 1),
        "gen_tokens_per_s_episodes": round(many["generated_tokens"] / many["wall_s"], 1),
        "gen_tokens_per_s_single_turn": round(single["generated_tokens"] / single["wall_s"], 1),
        "rss_kib_per_blocked_thread": round(thread_rss_kib(args.episodes), 1),
    }))


if __name__ == "__main__":
    main()
