"""Shared timing loop of the in-process benchmarks (bench/head_pass.py, bench/microbatch.py). Not a benchmark."""

from __future__ import annotations

import time
from typing import Any, Callable


def best_of_rounds(names: list[str], run_one: Callable[[str, int], Any], *, rounds: int
                   ) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
    """`run_one(name, round)` for every variant, `rounds` + 1 times (round 0 warms up), the order rotated
    every round so that no variant always runs first. Returns the best wall and process-CPU seconds per
    name (rounds 1..`rounds`) and each name's last result."""
    best = {k: float("inf") for k in names}
    best_cpu = {k: float("inf") for k in names}
    last: dict[str, Any] = {}
    for r in range(rounds + 1):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0, c0 = time.perf_counter(), time.process_time()
            last[name] = run_one(name, r)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if r:
                best[name], best_cpu[name] = min(best[name], dt), min(best_cpu[name], dc)
    return best, best_cpu, last
