"""Batched reward scoring in worker processes (the RewardFn seam of interfaces.py).

`RewardPool` runs `score_fn(item)` for each item in long-lived worker processes (spawned, so the
trainer's threads and CUDA state never leak into them). Every item has a hard deadline: a worker that
exceeds it is SIGKILLed and replaced, and the item scores incorrect with reason "pool_timeout"; a
worker that dies (segfault, os._exit, OOM kill) is replaced and its item scores "worker_died". The
pool never raises because of an item. Workers ignore SIGTERM/SIGINT (the trainer closes them after
its preemption checkpoint) and exit within a second of the pool's process dying, even by `kill -9`
(`preemption.child_setup`). `TaskRewardFn` is the `RewardFn` seam (interfaces.py): it
dispatches on `Prompt.task` ("math" and "synthetic" -> math verifier, "code" -> sandboxed tests);
math items that the string fast path decides (think/box checks, equal strings, plain integers) are
scored in the caller's process, and only the rest go to the pool.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from scalerl_mega.preemption import child_setup, start_child
from scalerl_mega.rewards.result import RewardResult, RewardValues, error_key, error_result

log = logging.getLogger("scalerl_mega.rewards")


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardConfig:
    """Reward settings (paper App. A.3: +1 / -1)."""

    correct: float = 1.0
    incorrect: float = -1.0
    math_timeout_s: float = 5.0
    require_think: bool = True
    require_boxed: bool = False
    code_time_limit_s: float = 5.0
    code_memory_mb: int = 512
    code_partial_credit: bool = False
    code_scratch_mb: int = 64
    """Private tmpfs behind the sandbox's cwd, /tmp and /dev/shm (rewards.sandbox)."""
    code_hide_paths: tuple[str, ...] = ()
    """Extra paths masked in the code sandbox (only needed under /usr, /lib, ... or the interpreter
    prefix: nothing else of the host is visible there anyway)."""
    num_workers: int = 2
    item_timeout_s: float | None = None
    """Hard per-item deadline enforced by killing the worker; None derives it from the limits above
    (math: timeout + 1 s, the whole deadline of the in-worker verification; code: time limit x
    (tests + 1) + 10 s)."""

    def __post_init__(self) -> None:
        RewardValues(correct=self.correct, incorrect=self.incorrect)
        if self.num_workers < 1:
            raise ValueError(f"rewards.num_workers must be >= 1, got {self.num_workers}")
        for k in ("math_timeout_s", "code_time_limit_s"):
            if getattr(self, k) <= 0:
                raise ValueError(f"rewards.{k} must be > 0, got {getattr(self, k)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardItem:
    task: str
    text: str
    gold: Any
    config: RewardConfig


def score_item(item: RewardItem) -> RewardResult:
    """Score one completion in-process (this is what pool workers run)."""
    from scalerl_mega.rewards.code import score_code
    from scalerl_mega.rewards.math import score_math

    cfg = item.config
    values = RewardValues(correct=cfg.correct, incorrect=cfg.incorrect)
    if item.task in ("math", "synthetic"):
        # in-process: this worker is killed at `item_deadline`, which is the hard timeout
        return score_math(item.text, item.gold, timeout_s=cfg.math_timeout_s, rewards=values,
                          require_think=cfg.require_think, require_boxed=cfg.require_boxed, isolate=False)
    if item.task == "code":
        return score_code(item.text, item.gold, time_limit_s=cfg.code_time_limit_s, memory_mb=cfg.code_memory_mb,
                          rewards=values, partial_credit=cfg.code_partial_credit, require_think=cfg.require_think,
                          scratch_mb=cfg.code_scratch_mb, hide_paths=cfg.code_hide_paths)
    return values.result(False, f"unknown_task: {item.task!r}")


def item_deadline(item: RewardItem) -> float:
    cfg = item.config
    if cfg.item_timeout_s is not None:
        return cfg.item_timeout_s
    if item.task == "code":
        n = len(item.gold) if isinstance(item.gold, list) else 8
        return cfg.code_time_limit_s * (n + 1) + 10.0
    return cfg.math_timeout_s + 1.0  # verified in the worker itself (score_item): no fork to wait for


def warm_up_rewards() -> None:
    """Worker initializer: import math-verify and fill its caches before the first deadline starts."""
    from scalerl_mega.rewards.math import _warm_up

    _warm_up()


def _worker_main(conn: Connection, score_fn: Callable[[Any], RewardResult], init_fn: Callable[[], None] | None,
                 parent_pid: int) -> None:
    child_setup(parent_pid, name="reward worker")  # the trainer coordinates SIGTERM; exit if it is gone
    if init_fn is not None:
        init_fn()
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        idx, item = msg
        try:
            res = score_fn(item)
        except Exception as e:  # noqa: BLE001 - an item's failure is a reward, never a pool failure
            res = error_result(e)
        conn.send((idx, res))


class _Worker:
    def __init__(self, ctx, score_fn, init_fn) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, score_fn, init_fn, os.getpid()), daemon=True)
        start_child(self.proc)
        child.close()
        self.ready = False
        """Set when the worker has started (imports, warm-up): deadlines start only then."""
        self.busy: tuple[int, float] | None = None  # (item index, deadline)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class RewardPool:
    """A pool of scoring processes with per-item hard deadlines; survives crashing/hanging items."""

    def __init__(
        self,
        *,
        num_workers: int = 2,
        score_fn: Callable[[Any], RewardResult] = score_item,
        deadline_fn: Callable[[Any], float] = item_deadline,
        init_fn: Callable[[], None] | None = warm_up_rewards,
        failure_reward: float = -1.0,
        start_method: str = "spawn",
        startup_timeout_s: float = 300.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._ctx = mp.get_context(start_method)
        self._score_fn, self._deadline_fn, self._init_fn = score_fn, deadline_fn, init_fn
        self._failure_reward = failure_reward
        self._startup_timeout_s = startup_timeout_s
        self._workers = [self._new_worker() for _ in range(num_workers)]
        self.replaced = 0
        """Workers replaced so far (killed at a deadline or died)."""
        self.errors_seen: set[str] = set()
        """The distinct scoring errors logged so far (`result.error_key`): each one's first traceback only."""

    def map(self, items: Sequence[Any]) -> list[RewardResult]:
        """Score all items; the result list is in input order."""
        results: list[RewardResult | None] = [None] * len(items)
        todo = list(range(len(items)))[::-1]
        while todo or any(w.busy for w in self._workers):
            self._await_ready(block=not any(w.ready for w in self._workers))
            for w in self._workers:
                if w.ready and w.busy is None and todo:
                    i = todo.pop()
                    try:
                        w.conn.send((i, items[i]))
                        w.busy = (i, time.monotonic() + self._deadline_fn(items[i]))
                    except (OSError, ValueError):
                        todo.append(i)
                        self._replace(w, None, "")
            busy = [w for w in self._workers if w.busy]
            if not busy:
                continue
            timeout = max(0.0, min(w.busy[1] for w in busy) - time.monotonic())
            starting = [w.conn for w in self._workers if not w.ready]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy] + starting, timeout=timeout)
            for w in self._workers:
                if not w.ready and w.conn in ready:
                    w.ready = w.conn.recv() == "ready"
            for w in busy:
                if w.conn in ready:
                    try:
                        idx, res = w.conn.recv()
                        results[idx] = res
                        w.busy = None
                        continue
                    except (EOFError, OSError):
                        pass
                if w.busy and (w.proc.sentinel in ready or w.conn in ready):
                    w.proc.join(5)  # reap it so that the exit code is known
                    self._replace(w, results, f"worker_died: exitcode {w.proc.exitcode}")
                elif w.busy and time.monotonic() >= w.busy[1]:
                    self._replace(w, results, "pool_timeout")
        self._log_first_errors(results)
        return [r for r in results]  # type: ignore[misc]

    def _log_first_errors(self, results: Sequence[RewardResult | None]) -> None:
        """Log the first traceback of each distinct scoring error of this pool (console and run log); later
        ones are only counted (the loop's `reward/errors` metrics)."""
        for r in results:
            key = error_key(r.reason) if r is not None else None
            if key is None or key in self.errors_seen:
                continue
            self.errors_seen.add(key)
            log.error("reward scoring failed: %s (first of its kind: the same error again is only counted, metrics "
                      "reward/errors)\n%s", r.reason, r.detail.rstrip() or "(no traceback: the worker process died)")

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self._score_fn, self._init_fn)

    def _await_ready(self, *, block: bool) -> None:
        """Collect "ready" messages of starting workers; with `block`, wait until one is ready."""
        t_end = time.monotonic() + self._startup_timeout_s
        while True:
            starting = [w for w in self._workers if not w.ready]
            if not starting:
                return
            left = t_end - time.monotonic() if block else 0.0
            if left < 0:
                raise RuntimeError(f"RewardPool: no worker started within {self._startup_timeout_s} s")
            for c in wait([w.conn for w in starting] + [w.proc.sentinel for w in starting], timeout=left):
                for w in starting:
                    if c is w.conn:
                        try:
                            w.ready = w.conn.recv() == "ready"
                        except (EOFError, OSError):
                            raise RuntimeError(f"RewardPool: a worker died while starting "
                                               f"(exitcode {w.proc.exitcode})") from None
                    elif c == w.proc.sentinel and not w.ready and not w.conn.poll():
                        raise RuntimeError(f"RewardPool: a worker died while starting (exitcode {w.proc.exitcode})")
            if not block or any(w.ready for w in self._workers):
                return

    def _replace(self, w: _Worker, results, reason: str) -> None:
        if w.busy is not None and results is not None:
            results[w.busy[0]] = RewardResult(passed=False, reward=self._failure_reward, reason=reason)
        w.kill()
        k = self._workers.index(w)
        self._workers[k] = self._new_worker()
        self.replaced += 1

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.proc.join(2)
            w.kill()

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TaskRewardFn:
    """The `RewardFn` seam: score (prompt, completion text) pairs in a `RewardPool` by `Prompt.task`."""

    def __init__(self, config: RewardConfig = RewardConfig(), *, start_method: str = "spawn") -> None:
        self.config = config
        self._pool = RewardPool(num_workers=config.num_workers, failure_reward=config.incorrect,
                                start_method=start_method)

    def __call__(self, prompts: list, texts: list[str]) -> list[tuple[float, bool, str]]:
        if len(prompts) != len(texts):
            raise ValueError(f"TaskRewardFn: {len(prompts)} prompts but {len(texts)} texts")
        from scalerl_mega.rewards.math import decide_without_verifier

        cfg = self.config
        values = RewardValues(correct=cfg.correct, incorrect=cfg.incorrect)
        results: list[RewardResult | None] = []
        for p, t in zip(prompts, texts):  # string-only decisions (fast path) stay in this process
            quick = None
            if p.task in ("math", "synthetic"):
                quick = decide_without_verifier(t, p.gold, rewards=values, require_think=cfg.require_think,
                                                require_boxed=cfg.require_boxed)
            results.append(quick)
        todo = [i for i, r in enumerate(results) if r is None]
        items = [RewardItem(task=prompts[i].task, text=texts[i], gold=prompts[i].gold, config=cfg) for i in todo]
        for i, r in zip(todo, self._pool.map(items) if items else []):
            results[i] = r
        out = []
        for r in results:
            assert r is not None
            reward = cfg.incorrect if r.reward != r.reward else r.reward  # NaN (error) -> incorrect
            out.append((reward, r.passed, r.reason))
        return out

    def close(self) -> None:
        self._pool.close()
