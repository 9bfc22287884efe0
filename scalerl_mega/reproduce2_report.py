"""Analysis pieces for issue 29's sweep (reproduction/design/README.md): the half-fit predictability check of the
paper's Fig. 1 / Sec. 6 on one run, read from its `metrics.jsonl`.

`half_fit`: fit Eq. 1 on the validation points in the first half of a run's compute (the identification
rule of `scaling.identify`, relative grid, 10% cut of that half), extrapolate to the run's last points, and
compare the error with the binomial noise floor sqrt(2/pi) x mean SE of those points (the mean |error| a
perfect forecast would still show). No forecast is made when A is not identified on the first half (the
rule's "no forecast without A"); the result then says so instead of giving an error.

Compute axis: cumulative generated samples (`samples` of the train lines), so runs with different batch
sizes share one axis (paper Sec. 5 compares batch sizes on compute, not steps).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalerl_mega.scaling.identify import assess, options_for, verdict_text

FINAL_POINTS = 3
"""Validation points at the end of a run on which the extrapolation is scored."""


def read_run(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative generated samples, val_pass_rate, samples per point) of each validation line of
    `run_dir/metrics.jsonl`; a validation at step s counts the samples of train steps 1..s."""
    path = Path(run_dir) / "metrics.jsonl"
    cum: dict[int, float] = {0: 0.0}
    vals = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "train":
                cum[int(rec["step"])] = float(rec["samples"])
            elif rec.get("kind") == "validation":
                vals.append(rec)
    steps = sorted(cum)
    total = dict(zip(steps, np.cumsum([cum[s] for s in steps]).tolist()))
    c, r, n = [], [], []
    for v in vals:
        s = int(v["step"])
        if s not in total:
            raise ValueError(f"{path}: validation at step {s} has no train line for that step")
        c.append(total[s])
        r.append(float(v["val_pass_rate"]))
        n.append(float(v["val_prompts"]) * float(v["val_samples_per_prompt"]))
    if not c:
        raise ValueError(f"{path}: no validation lines")
    return np.asarray(c), np.asarray(r), np.asarray(n)


@dataclass(frozen=True, kw_only=True)
class HalfFit:
    identified: bool
    verdict: str
    """`identify.verdict_text` of the first-half fit."""
    half_compute: float
    final_compute: tuple[float, ...]
    observed: tuple[float, ...]
    predicted: tuple[float, ...] | None
    """None when A is not identified on the first half."""
    mae: float | None
    noise_floor: float
    ratio: float | None
    """mae / noise_floor."""


def half_fit(compute, reward, n_samples, *, final_points: int = FINAL_POINTS) -> HalfFit:
    """Fit on compute <= half the largest compute, predict the last `final_points` points (module docstring)."""
    c, r = np.asarray(compute, dtype=np.float64), np.asarray(reward, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)
    half = 0.5 * float(c.max())
    first = c <= half
    if int(first.sum()) >= c.size - final_points + 1:
        raise ValueError(f"the first half ({int(first.sum())} points) overlaps the last {final_points} points")
    a = assess(c[first], r[first], options=options_for(c[first], grid="relative"), n_samples=n[first])
    fc, fr, fn = c[-final_points:], r[-final_points:], n[-final_points:]
    pred = a.predict(fc)
    p = pred if pred is not None else fr
    floor = math.sqrt(2.0 / math.pi) * float(np.mean(np.sqrt(np.clip(p * (1 - p), 0.0, None) / fn)))
    mae = None if pred is None else float(np.mean(np.abs(pred - fr)))
    return HalfFit(identified=a.identified, verdict=verdict_text(a), half_compute=half,
                   final_compute=tuple(fc.tolist()), observed=tuple(fr.tolist()),
                   predicted=None if pred is None else tuple(pred.tolist()), mae=mae, noise_floor=floor,
                   ratio=None if mae is None else mae / floor)
