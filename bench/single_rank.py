"""Shared by the in-process trainer benchmark bench/microbatch.py: a Megatron
model of a world of one, and the timing loop. Not a benchmark."""

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


def single_rank_model(model_cfg: Any, *, lr: float = 1e-6) -> tuple[Any, Any, Any, list, Any]:
    """`model_cfg`'s Megatron model in a world of one (gloo on CPU), its DDP chunk and AdamW:
    (MegatronConfig, ParallelConfig, model, chunks, optimizer)."""
    from scalerl_mega.trainer.megatron import models, parallel as par, step, wrap
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig

    parallel = ParallelConfig()
    cfg = MegatronConfig(model=model_cfg, parallel=parallel, optim=OptimConfig(lr=lr, warmup_steps=0))
    par.init_parallel(parallel, model=cfg.model, seed=1)
    model, tcfg = models.build_model(cfg.model, parallel)
    chunks = [wrap.wrap_model(model, tcfg, cfg)]
    step.configure_schedule(tcfg, chunks)
    return cfg, parallel, model, chunks, wrap.build_optimizer(chunks, cfg)
