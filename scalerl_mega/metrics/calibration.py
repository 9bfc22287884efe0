"""The per-step fields of the RL loop's metrics lines that `cluster/schedule_calibration.py::calibration_from_records`
fits the cluster simulator on (timing, batch shape, layout, the engines' decode counters)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig
    from scalerl_mega.interfaces import RolloutEngine
    from scalerl_mega.types import Group


GEN_STAT_KEYS = ("busy_s", "decode_steps", "decode_tokens")
"""Engine work counters written per step as `gen/<key>` (differences over the step's wall time,
summed over engines): what `cluster/schedule_calibration.py::calibration_from_records` fits decode speed on."""


def engine_decode_stats(engine: RolloutEngine) -> dict[str, float] | None:
    """Cumulative `GEN_STAT_KEYS` counters of an engine (`decode_stats()`, rollout/local.py), summed
    over the members of an engine set (`.engines`); None when an engine does not report them
    (SGLang servers)."""
    members = getattr(engine, "engines", None)
    members = list(members) if members is not None and not hasattr(engine, "decode_stats") else [engine]
    total = dict.fromkeys(GEN_STAT_KEYS, 0.0)
    for e in members:
        if not hasattr(e, "decode_stats"):
            return None
        st = e.decode_stats()
        for key in GEN_STAT_KEYS:
            total[key] += float(st[key])
    return total


def calibration_fields(cfg: TrainConfig, groups: Sequence[Group], *, train_s: float, sync_s: float,
                       step_s: float) -> dict[str, Any]:
    """The per-step fields `cluster/schedule_calibration.py::calibration_from_records` reads (timing, batch
    shape, layout). The engine-side decode counters (gen/busy_s, gen/decode_steps, gen/decode_tokens)
    are differences of `engine_decode_stats` over the step, written by the loop (loop.py)."""
    comps = [s.completion for g in groups for s in g.samples]
    gen_lengths = [len(c.output_ids) for c in comps]
    prompt_tokens = [len(c.prompt_ids) for c in comps]
    return {
        "timing/train_step_s": train_s, "timing/sync_s": sync_s, "timing/step_wall_s": step_s,
        "batch/tokens": float(sum(gen_lengths) + sum(prompt_tokens)), "batch/gen_lengths": gen_lengths,
        "batch/prompt_tokens_mean": sum(prompt_tokens) / max(len(prompt_tokens), 1),
        "sim/batch_samples": cfg.train.prompts_per_step * cfg.train.generations_per_prompt,
        "sim/num_generators": cfg.rollout.num_engines, "sim/gpus_per_generator": cfg.rollout.sglang_tp_size if cfg.rollout.name == "sglang" else 1,
        "sim/trainer_gpus": cfg.cluster.trainer_devices or int(os.environ.get("WORLD_SIZE", "1")), "sim/max_concurrency": cfg.rollout.max_batch_size,
        "sim/mode": cfg.off_policy.name, "sim/k": cfg.off_policy.k,
    }
