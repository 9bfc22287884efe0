"""Held-out validation on the generation engines (paper Sec. 2.1: pass rate of `data.val_samples` samples on each
held-out prompt): at one step (`train.val_mode=point`, the paper's) or spread over the `val_every` steps before
the point (`window`, metrics/val_window.py). Both submit through the loop's router, score with the training
reward and give the same validation-line fields (`metrics.val_window.val_metrics`)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.metrics.val_window import Outcome, outcomes, val_metrics, window_slice
from scalerl_mega.inflight import _Pending, _Router, sampling_params, score_groups

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import LengthConfig, RolloutConfig, TrainConfig


def validation_seed(*, version: int, index: int, run_seed: int, paired: bool) -> int:
    """Sampling seed of validation prompt `index` at weight `version` (sample i uses seed + i). It includes
    the run's seed unless `paired` (`data.val_paired_draws`): then every run draws the same numbers."""
    base = 10_000_019 * (version + 1) + 1000 * index
    if paired:
        return base
    return (base + (int(run_seed) + 1) * 0x9E3779B97F4A7C15) % (1 << 62)


@dataclass(frozen=True, kw_only=True)
class HeldoutSpec:
    """What held-out validation reads from the run's config (`HeldoutSpec.of`): not the whole TrainConfig."""

    samples: int
    """Samples per held-out prompt (`data.val_samples`; the paper's mean@16)."""
    paired_draws: bool
    """`data.val_paired_draws`: every run draws the same sampling seeds (`validation_seed`)."""
    run_seed: int
    """`seed`."""
    val_every: int
    """`train.val_every`: a window's width in window mode."""
    length: LengthConfig
    """Budget, interruptions and the length penalty: validation samples as training does."""
    rollout: RolloutConfig
    """Temperature and top_p."""
    stop_error_rate: float | None = None
    """`reward.stop_error_rate`: a validation whose samples fail to score at this rate stops the run."""
    max_turns: int = 0
    """Episode runs (`env` other than single): `env.max_turns`, for the pass rate by turn
    (`val_window.pass_at_turn`); 0: single-turn samples."""

    @classmethod
    def of(cls, cfg: TrainConfig) -> HeldoutSpec:
        return cls(samples=int(cfg.data.val_samples), paired_draws=bool(cfg.data.val_paired_draws),
                   run_seed=int(cfg.seed), val_every=int(cfg.train.val_every), length=cfg.length, rollout=cfg.rollout,
                   stop_error_rate=cfg.reward.stop_error_rate,
                   max_turns=int(cfg.env.max_turns) if cfg.env.name != "single" else 0)


def submit(router: _Router, comps: LoopComponents, spec: HeldoutSpec, indices: Iterable[int], *, version: int,
           rng: random.Random) -> None:
    """Submit `spec.samples` samples of each held-out prompt in `indices` at weight `version`."""
    for i in indices:
        prompt = comps.val_prompts[i]
        if prompt.token_ids is None:
            prompt.token_ids = comps.encode(prompt.text)
        seed = validation_seed(version=version, index=i, run_seed=spec.run_seed, paired=spec.paired_draws)
        sp = sampling_params(spec.length, spec.rollout, comps, rng, seed=seed, n=spec.samples)
        router.submit_val(prompt, sp, version=version, index=i)


def collect(router: _Router, comps: LoopComponents, spec: HeldoutSpec) -> list[Outcome]:
    """Wait for every submitted validation sample, score them and return their outcomes (router emptied)."""
    while any(len(c) < spec.samples for c in router.val.values()):
        router.pump()
    pendings, index_of = [], {}
    for pid in list(router.val):
        prompt, index = router.val_index.pop(pid)
        index_of[pid] = index
        pendings.append(_Pending(seq=-1, prompt=prompt, version=-1, completions=router.val.pop(pid)))
    if not pendings:
        return []
    groups = score_groups(pendings, comps, spec.length, stop_error_rate=spec.stop_error_rate,
                          where="a validation (held-out prompts)")
    return outcomes(groups, index_of=index_of)


def validate(router: _Router, comps: LoopComponents, spec: HeldoutSpec, *, version: int, rng: random.Random
             ) -> dict[str, float]:
    """One validation at weight `version` on every held-out prompt: the fields of its validation line
    (`val_window.val_metrics`) and `val_seconds`, the wait for its generations."""
    submit(router, comps, spec, range(len(comps.val_prompts)), version=version, rng=rng)
    t0 = time.monotonic()
    got = collect(router, comps, spec)
    return {**val_metrics(got, expected_prompts=len(comps.val_prompts), max_turns=spec.max_turns),
            "val_seconds": time.monotonic() - t0}


def submit_window_slice(router: _Router, comps: LoopComponents, spec: HeldoutSpec, *, step: int, version: int,
                        rng: random.Random) -> None:
    """Window mode, at the start of step `step`: submit the held-out prompts of its position in the window."""
    width = spec.val_every
    submit(router, comps, spec, window_slice(len(comps.val_prompts), width=width, position=step % width),
           version=version, rng=rng)
