"""The first-half forecast, scored (paper Sec. 6 "Extrapolating Scaling Curves", Fig. 1, App. A.6): fit Eq. 1 on
the validation points up to half of a run's compute, extrapolate to the rest, and compare the error with the noise
a perfect forecast would still show.

`half_fit`: the first half is judged by the project's one identification rule (`identify.assess`, relative grid,
the cut at 0.1 of that half's compute). No forecast is made when A is not identified on the first half (the rule's
"no forecast without A"): `predicted` and `mae` are None, and `unvetted_mae` says what the fit would have missed
by had it been used anyway. The last `final_points` points are scored against the binomial noise floor
sqrt(2/pi) x mean binomial SE of those points (`identify.binomial_noise_floor`).

`score_later`: every point past the half, scored the same way (mean |error| / floor), with the bias (observed -
predicted) and the points inside Eq. 1 at A's 95% interval +- 2 binomial SE.

Where the validation sample counts are unknown (a CSV curve), pass `noise_std`: the floor is then
sqrt(2/pi) x that standard deviation (e.g. the residual SD of the whole run's fit).

Pure math: arrays in, dataclasses and dicts out; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from scalerl_mega.scaling.fit import FitOptions, SigmoidFit, sigmoid_law
from scalerl_mega.scaling.identify import (Assessment, assess, binomial_noise_floor, noise_ratio, options_for,
                                           verdict_text)

FINAL_POINTS = 3
"""Validation points at the end of a run on which the extrapolation is scored."""
NOISE_FLOOR_FACTOR = math.sqrt(2.0 / math.pi)
"""The mean |error| of a perfect forecast of a point with Gaussian noise of SD s is sqrt(2/pi) x s."""


@dataclass(frozen=True, kw_only=True)
class HalfFit:
    identified: bool
    assessment: Assessment
    """The first half's `identify.assess` verdict (its fit is drawn against the second half)."""
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
    unvetted_mae: float
    """Mean |error| at the final points of the first half's best fit used regardless of the rule: what a
    forecast would have missed by where the rule refuses one (and the same as `mae` where it does not)."""


def _arrays(compute, reward, n_samples) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    c, r = np.asarray(compute, dtype=np.float64), np.asarray(reward, dtype=np.float64)
    n = None if n_samples is None else np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)
    return c, r, n


def _floor(p: np.ndarray, n: np.ndarray | None, noise_std: float | None) -> float:
    if n is not None:
        return binomial_noise_floor(p, n)
    if noise_std is None:
        raise ValueError("the validation sample counts are unknown: give noise_std for the noise floor")
    return NOISE_FLOOR_FACTOR * float(noise_std)


def first_half_assessment(compute, reward, n_samples, *, half: float, grid: Literal["paper", "relative"] = "relative",
                          fit_from: float | None | Literal["auto"] = "auto", base: FitOptions = FitOptions()
                          ) -> Assessment:
    """`identify.assess` of the points at or below `half` on their own (by default the relative grid with the
    cut at 0.1 of that half's compute): the fit `half_fit` extrapolates, and the one a registered forecast records."""
    c, r, n = _arrays(compute, reward, n_samples)
    first = c <= half
    opts = options_for(c[first], grid=grid, fit_from=fit_from, base=base)
    return assess(c[first], r[first], options=opts, n_samples=None if n is None else n[first])


def half_fit(compute, reward, n_samples, *, final_points: int = FINAL_POINTS, half_compute: float | None = None,
             noise_std: float | None = None, grid: Literal["paper", "relative"] = "relative",
             fit_from: float | None | Literal["auto"] = "auto", base: FitOptions = FitOptions()) -> HalfFit:
    """Fit on compute <= half the largest compute (or <= `half_compute`: e.g. half a run's planned compute, for a
    run stopped before its end), predict the last `final_points` points (module docstring). ValueError when the
    first half reaches into those points."""
    c, r, n = _arrays(compute, reward, n_samples)
    half = 0.5 * float(c.max()) if half_compute is None else float(half_compute)
    first = c <= half
    if int(first.sum()) >= c.size - final_points + 1:
        raise ValueError(f"the first half ({int(first.sum())} points up to {half:g}) overlaps the last "
                         f"{final_points} points")
    a = first_half_assessment(c, r, n, half=half, grid=grid, fit_from=fit_from, base=base)
    fc, fr = c[-final_points:], r[-final_points:]
    pred = a.predict(fc)
    floor = _floor(pred if pred is not None else fr, None if n is None else n[-final_points:], noise_std)
    mae = None if pred is None else float(np.mean(np.abs(pred - fr)))
    unvetted = float(np.mean(np.abs(a.fit.predict(fc) - fr)))
    return HalfFit(unvetted_mae=unvetted, identified=a.identified, assessment=a, verdict=verdict_text(a),
                   half_compute=half, final_compute=tuple(fc.tolist()), observed=tuple(fr.tolist()),
                   predicted=None if pred is None else tuple(pred.tolist()), mae=mae, noise_floor=floor,
                   ratio=None if mae is None else noise_ratio(mae, floor))


def params(fit: SigmoidFit) -> dict[str, float]:
    """The Eq. 1 parameters of a fit as a plain dict (what a registration records)."""
    return {"A": fit.A, "B": fit.B, "C_mid": fit.C_mid, "R0": fit.R0}


def eq1(compute, p: dict[str, float], *, A: float | None = None) -> np.ndarray:
    """Eq. 1 at `compute` with the parameters `p` (`params`), A replaced by `A` when given."""
    return sigmoid_law(np.asarray(compute, dtype=np.float64), A=p["A"] if A is None else A, B=p["B"],
                       C_mid=p["C_mid"], R0=p["R0"])


def score_later(compute, reward, n_samples, *, half: HalfFit, noise_std: float | None = None) -> dict[str, Any] | None:
    """Every point past `half.half_compute` against the first-half fit (module docstring): points, mae,
    noise_floor, ratio, bias, inside_band, and whether it is a forecast (A identified) or the unvetted fit.
    None when no point lies past the half."""
    c, r, n = _arrays(compute, reward, n_samples)
    later = c > half.half_compute
    if not later.any():
        return None
    p = params(half.assessment.fit)
    pred = eq1(c[later], p)
    err = np.abs(pred - r[later])
    nl = None if n is None else n[later]
    floor = _floor(pred, nl, noise_std)
    lo, hi = (eq1(c[later], p, A=a) for a in half.assessment.A_interval)
    if nl is not None:
        two_se = 2.0 * np.sqrt(np.clip(r[later] * (1 - r[later]), 0, None) / nl)
    else:
        two_se = np.full(int(later.sum()), 2.0 * floor / NOISE_FLOOR_FACTOR)
    return {"points": int(later.sum()), "mae": float(err.mean()), "noise_floor": floor,
            "ratio": noise_ratio(float(err.mean()), floor), "bias": float(np.mean(r[later] - pred)),
            "inside_band": int(np.sum((r[later] >= lo - two_se) & (r[later] <= hi + two_se))),
            "forecast": half.identified}


def overdispersion(fit: SigmoidFit, compute, n_samples) -> dict[str, float]:
    """Point-to-point scatter of a run's validation points around its own Eq. 1 fit against the binomial noise
    the identification rule assumes: the residual SD sqrt(SSE / (n - 3)) of the fitted points, the mean
    binomial SE sqrt(p (1 - p) / N) at those points (p: the fit), and their ratio (about 1 when sampling the
    validation set is the only noise; above 1 when the policy itself moves between validations)."""
    c = np.asarray(compute, dtype=np.float64)
    lo, hi = fit.compute_range
    inside = (c >= lo) & (c <= hi) & (c > 0)
    n = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)[inside]
    p = np.clip(fit.predict(c[inside]), 0.0, 1.0)
    sd = math.sqrt(fit.sse / max(fit.n_points - 3, 1))
    se = float(np.mean(np.sqrt(p * (1 - p) / n)))
    return {"residual_sd": sd, "binomial_se": se, "ratio": sd / se if se > 0 else math.inf}
