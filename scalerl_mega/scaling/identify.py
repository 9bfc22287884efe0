"""When is A identified? The one rule used by `scalerl-fit`, the live forecast and report.md.

A fit of Eq. 1 (paper Sec. 2.1, App. A.5) reports A as a number only when all of these hold:

1. **Enough points after the cut**: at least `MIN_POINTS` = 8 validation points inside the fit window
   (5 residual degrees of freedom for the 3 parameters).
2. **A is pinned to the paper's +-0.02**: A's 95% profile-likelihood interval is at most `MAX_A_WIDTH`
   = 0.04 wide. The interval (`fit.SigmoidFit.A_profile_interval`) uses the small-sample threshold
   SSE <= SSE_min (1 + F_0.95(1, n - 3) / (n - 3)). Profile likelihood rather than a bootstrap: it costs
   one grid fit (the grid already holds every A's best SSE), it follows the curvature of the nonlinear
   model (a bootstrap of a 3-parameter fit on 8-20 points resamples the few points past C_mid and is
   erratic), and its noise variance comes from the residuals, so misfit widens it. When the interval
   touches the end of a grid that is narrower than [0, 1] (the paper's 0.45..0.80) the A grid is widened
   to 0.005..1.000 before the interval is read.
3. **The fit's own checks pass** (`SigmoidFit.identified`): optimum inside the grid, data past C_mid and
   past 70% of the fitted gain.
4. **No misfit**: fit on all but the last `HOLDOUT_FRACTION` (>= 2 points) of the window, predict the
   held-out tail with that fit's continuous refit (`refine=True`: the grid's 0.005 step in A would itself
   exceed the noise floor of a large run); the mean absolute error must be at most `MISFIT_RATIO` = 2x the noise floor
   sqrt(2/pi) x mean binomial SE sqrt(p (1 - p) / N) of the held-out points (p: the full fit's value,
   N: validation samples per point, `val_prompts x val_samples_per_prompt` of each validation line).
   When N is unknown the residual std of the full fit stands in (and the reason says so).
5. **A rise** (`no_rise`): the points from R0 to the fit's end are not all their mean within noise. A flat curve
   gets the plain reason "no rise: reward constant within noise" instead of condition 3's notes (where a curve
   stands relative to a C_mid or a gain it never showed says nothing).

Otherwise the output says "not identified" with every failed condition, still gives the interval, and
gives no point value of A and no predicted reward at a larger budget (`Assessment.A` is None).

The fit cut (`fit_cut`): on paper-scale GPU-hour axes the paper's 1.5k GPU-hours (App. A.5/A.7); for any
other axis or a smaller run, points below `CUT_FRACTION` = 0.1 of the largest compute are excluded (the
paper's 1.5k of a 16k GPU-hour run is 0.094 of it: about one epoch), configurable.

Pure math: numbers in, dataclasses out; no I/O, no config objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Sequence

import numpy as np

from scalerl_mega.scaling.fit import PAPER_FIT_FROM, FitOptions, SigmoidFit, _as_series, relative_options

MIN_POINTS = 8
"""Fewest validation points after the cut for A to be identified."""
MAX_A_WIDTH = 0.04
"""Widest 95% interval of A that counts as identified: the paper's +-0.02 seed margin (App. A.5)."""
HOLDOUT_FRACTION = 0.25
"""Share of the fitted points (the last ones, at least 2) held out by the misfit check."""
MISFIT_RATIO = 2.0
"""Held-out mean |error| above this multiple of the noise floor is a misfit."""
CUT_FRACTION = 0.1
"""Fit cut for axes that are not paper-scale GPU-hours: exclude compute below this share of the largest."""
R0_Z = 1.96
"""R0 is the first evaluation, itself noisy: the interval is the hull of the intervals at R0 and at
R0 +- R0_Z binomial SE of that point (when its sample count is known and R0 was not given)."""
FULL_A_GRID = np.round(np.arange(0.005, 1.0 + 1e-9, 0.005), 3)
"""A grid used to read an interval that reaches the end of a narrower grid (the paper's 0.005 step)."""

GridKind = Literal["paper", "relative"]


def auto_grid(max_computes: Sequence[float], *, gpu_hours: bool) -> GridKind:
    """`paper` only for a GPU-hour axis on which every run reaches the paper's 1.5k cut; else `relative`."""
    return "paper" if gpu_hours and all(float(m) >= PAPER_FIT_FROM for m in max_computes) else "relative"


def fit_cut(compute_max: float, *, grid: GridKind, cut_fraction: float = CUT_FRACTION) -> float | None:
    """Lower compute bound of the fit: 1500 on the paper grid; else `cut_fraction` x the largest compute
    (None when `cut_fraction` is 0: no cut)."""
    if grid == "paper":
        return PAPER_FIT_FROM
    if not 0.0 <= cut_fraction < 1.0:
        raise ValueError(f"cut_fraction must be in [0, 1), got {cut_fraction}")
    return cut_fraction * float(compute_max) if cut_fraction > 0 else None


def options_for(compute, *, grid: GridKind, fit_from: float | None | Literal["auto"] = "auto",
                cut_fraction: float = CUT_FRACTION, base: FitOptions = FitOptions()) -> FitOptions:
    """The fit options of one series: `base` with the cut (`fit_cut` of the largest compute fitted, i.e. up to
    `base.fit_to`, when fit_from="auto") and the grid
    (paper grids as in `base`, or `fit.relative_grids` over the compute inside the window)."""
    c = np.asarray(compute, dtype=np.float64)
    if fit_from == "auto":  # the cut is a share of the compute fitted: within `base.fit_to` when it is set
        window = c if base.fit_to is None else c[c <= base.fit_to]
        fit_from = fit_cut(float(window.max()) if window.size else 0.0, grid=grid, cut_fraction=cut_fraction)
    opts = replace(base, fit_from=fit_from)
    return relative_options(c, opts) if grid == "relative" else opts


@dataclass(frozen=True, kw_only=True)
class HoldoutCheck:
    """The misfit check: fit without the last points, predict them (module docstring, condition 4)."""

    n_fit: int
    n_heldout: int
    split_compute: float
    """Largest compute of the points fitted."""
    mae: float
    noise_floor: float
    ratio: float
    noise_source: str
    passed: bool
    A_interval: tuple[float, float]
    """The partial fit's interval: on a misfit the reported interval is the hull of both fits' intervals
    (the data do not say which part of the curve to believe)."""


@dataclass(frozen=True, kw_only=True)
class Assessment:
    """A fit with its interval and the identification verdict (module docstring)."""

    fit: SigmoidFit
    identified: bool
    reason: str
    """Every failed condition ("" when identified)."""
    A_interval: tuple[float, float]
    n_points: int
    fit_from: float | None
    holdout: HoldoutCheck | None

    @property
    def A(self) -> float | None:
        """The grid optimum of A, only when identified."""
        return self.fit.A if self.identified else None

    @property
    def B(self) -> float:
        return self.fit.B

    @property
    def C_mid(self) -> float:
        return self.fit.C_mid

    def predict(self, compute) -> np.ndarray | None:
        """Eq. 1 at `compute`, or None when A is not identified (no forecast without it)."""
        return self.fit.predict(compute) if self.identified else None

    def summary(self) -> dict:
        """The fields every output carries: A (None unless identified), B, C_mid, A_interval, identified,
        reason, and the cut and points behind them."""
        return {"A": self.A, "B": self.fit.B, "C_mid": self.fit.C_mid, "A_interval": list(self.A_interval),
                "identified": self.identified, "reason": self.reason, "R0": self.fit.R0,
                "n_points": self.n_points, "fit_from": self.fit_from}


def verdict_text(a: Assessment, *, digits: int = 3) -> str:
    """One line: "A = 0.612 (95% interval 0.598..0.625)" or "A not identified (95% interval ...): reason"."""
    lo, hi = a.A_interval
    iv = f"95% interval {lo:.{digits}f}..{hi:.{digits}f}"
    if a.identified:
        return f"A = {a.fit.A:.{digits}f} ({iv})"
    return f"A not identified ({iv}): {a.reason}"


def _noise_se(p: np.ndarray, n_samples: np.ndarray) -> np.ndarray:
    q = np.clip(p, 0.5 / n_samples, 1.0 - 0.5 / n_samples)
    return np.sqrt(q * (1.0 - q) / n_samples)


def binomial_noise_floor(p, n_samples) -> float:
    """sqrt(2/pi) x the mean binomial SE of points whose true pass rates are `p`, each the mean of `n_samples`
    samples: the mean |error| a perfect forecast of those points would still show."""
    p = np.asarray(p, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), p.shape)
    return math.sqrt(2.0 / math.pi) * float(np.mean(_noise_se(p, n)))


def noise_ratio(mae: float, floor: float) -> float:
    """mae / floor, where a zero floor (a constant curve at 0 or 1, or an exact fit) gives 0 for no error and inf
    for any error."""
    return mae / floor if floor > 0 else (math.inf if mae > 0 else 0.0)


def holdout_check(compute, reward, *, fit: SigmoidFit, options: FitOptions, n_samples=None,
                  holdout_fraction: float = HOLDOUT_FRACTION, misfit_ratio: float = MISFIT_RATIO) -> HoldoutCheck:
    """Condition 4 of the module docstring for the full fit `fit` made with `options` (raises ValueError
    when the part left to fit has too few points)."""
    c, r = _as_series(compute, reward)
    lo = fit.compute_range[0]
    win = (c >= lo) & (c <= fit.compute_range[1]) & (c > 0)
    idx = np.flatnonzero(win)
    k = max(2, int(math.ceil(holdout_fraction * idx.size)))
    if idx.size - k < 4:
        raise ValueError(f"{idx.size} points in the window leave {idx.size - k} to fit after holding out {k}")
    split = float(c[idx[-k - 1]])
    part = options.fit(c, r, r0=fit.R0, fit_to=split, refine=True)
    held = idx[-k:]
    # the continuous refit predicts: the grid's 0.005 step in A alone can exceed a large run's noise floor
    err = np.abs(part.predict(c[held], refined=True) - r[held])
    if n_samples is None:
        s = math.sqrt(fit.sse / max(fit.n_points - 3, 1))
        floor, src = math.sqrt(2.0 / math.pi) * s, "residual std of the full fit (validation sample count unknown)"
    else:
        ns = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)[held]
        if np.any(~np.isfinite(ns)) or np.any(ns < 1):
            raise ValueError(f"n_samples must be >= 1 per point, got {ns.min()}")
        floor = binomial_noise_floor(fit.predict(c[held]), ns)
        src = "binomial SE of each held-out point"
    mae = float(np.mean(err))
    ratio = noise_ratio(mae, floor)
    return HoldoutCheck(n_fit=part.n_points, n_heldout=int(k), split_compute=split, mae=mae, noise_floor=floor,
                        ratio=ratio, noise_source=src, passed=ratio <= misfit_ratio,
                        A_interval=_interval(c, r, part, options, r0=fit.R0, fit_to=split))


def _interval(c, r, fit: SigmoidFit, options: FitOptions, **overrides) -> tuple[float, float]:
    """`fit`'s profile interval, read again on `FULL_A_GRID` when it reaches the end of a narrower grid."""
    lo, hi = fit.A_profile_interval
    g = fit.grid
    narrow_lo = g.a_lo > FULL_A_GRID[0] + 1e-9 and lo <= g.a_lo + 1e-9
    narrow_hi = g.a_hi < FULL_A_GRID[-1] - 1e-9 and hi >= g.a_hi - 1e-9
    if not (narrow_lo or narrow_hi):
        return lo, hi
    return options.fit(c, r, a_grid=tuple(FULL_A_GRID), refine=False, **overrides).A_profile_interval


def _r0_band(c, r, fit: SigmoidFit, options: FitOptions, n_samples, z: float) -> list[float]:
    """R0 +- z SE when R0 is the (noisy) first evaluation and its sample count is known; else []."""
    if options.r0 is not None or n_samples is None or z <= 0:
        return []
    n0 = float(np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)[int(np.argmin(c))])
    se = float(_noise_se(np.array([fit.R0]), np.array([n0]))[0])
    return [fit.R0 - z * se, fit.R0 + z * se]


FLAT_LEVEL = 0.95
"""A curve whose points (from R0 to the fit's end) a constant explains at this level is flat: "no rise"."""


def no_rise(c: np.ndarray, r: np.ndarray, *, fit: SigmoidFit, n_samples=None, level: float = FLAT_LEVEL) -> str:
    """"" when the run rises, else the reason in plain words: every point from the first to the fit's end (R0
    included: a curve that has reached its ceiling still rose to it) is its mean within noise. With the samples
    per point known, a chi-square test of the constant against the binomial noise; without, an F-test of Eq. 1
    (3 parameters) against the constant on the same points."""
    from scipy import stats

    keep = c <= (fit.compute_range[1] if fit.fit_to is not None else np.inf)
    x, y = c[keep], r[keep]
    if y.size < 4:
        return ""
    mean = float(y.mean())
    sse0 = float(np.sum((y - mean) ** 2))
    if n_samples is not None:
        ns = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)[keep]
        var = np.clip(mean * (1.0 - mean), 0.25 / ns, None) / ns
        if float(np.sum((y - mean) ** 2 / var)) > stats.chi2.ppf(level, y.size - 1):
            return ""
        return (f"no rise: reward constant within noise ({y.size} points at {mean:.3f} +- "
                f"{float(np.std(y)):.3f}, as {float(ns.mean()):.0f} samples a point give)")
    sse1 = float(np.sum((y - fit.predict(x)) ** 2))
    if y.size <= 3 or sse1 <= 0 or ((sse0 - sse1) / 2.0) / (sse1 / (y.size - 3)) > stats.f.ppf(level, 2, y.size - 3):
        return ""
    return f"no rise: reward constant within noise ({y.size} points at {mean:.3f} +- {float(np.std(y)):.3f})"


def assess(compute, reward, *, options: FitOptions, n_samples=None, min_points: int = MIN_POINTS,
           max_width: float = MAX_A_WIDTH, holdout_fraction: float = HOLDOUT_FRACTION,
           misfit_ratio: float = MISFIT_RATIO, r0_z: float = R0_Z) -> Assessment:
    """Fit Eq. 1 with `options` and decide identification by the module docstring's rule.

    `n_samples`: validation samples behind each point (a number or one per point of the full series), for
    the binomial noise floor of the misfit check. Raises ValueError when no fit is possible (fewer than 4
    points in the window, bad input). `r0_z`: see `R0_Z`."""
    c, r = _as_series(compute, reward)
    fit = options.fit(c, r)
    lo, hi = _interval(c, r, fit, options)
    for r0 in _r0_band(c, r, fit, options, n_samples, r0_z):
        alt = options.fit(c, r, r0=r0, refine=False)
        a_lo, a_hi = _interval(c, r, alt, options, r0=r0)
        lo, hi = min(lo, a_lo), max(hi, a_hi)
    reasons = []
    n = fit.n_points
    if n < min_points:
        cut = "-" if options.fit_from is None else f"{options.fit_from:.4g}"
        reasons.append(f"{n} points after the cut (fit from {cut}; need >= {min_points})")
    flat = no_rise(c, r, fit=fit, n_samples=n_samples)
    if flat:  # where the curve stands relative to C_mid or its gain says nothing about a curve that does not rise
        reasons.append(flat)
    elif not fit.identified:  # its grid-only profile-range note is superseded by the interval check below
        own = [x for x in fit.reason.split("; ") if x and not x.startswith("A's 95% profile range")]
        reasons += own
    ho = None
    try:
        ho = holdout_check(c, r, fit=fit, options=options, n_samples=n_samples, holdout_fraction=holdout_fraction,
                           misfit_ratio=misfit_ratio)
    except ValueError as e:
        if n >= min_points:
            reasons.append(f"misfit check not possible: {e}")
    if ho is not None and not ho.passed:
        part_lo, part_hi = ho.A_interval
        lo, hi = min(lo, part_lo), max(hi, part_hi)
        reasons.append(f"misfit: fitted without the last {ho.n_heldout} points it predicts them with mean |error| "
                       f"{ho.mae:.4f} = {ho.ratio:.1f}x the noise floor {ho.noise_floor:.4f} (limit {misfit_ratio:g}x)")
    if not hi - lo <= max_width + 1e-9:
        reasons.append(f"A's 95% interval {lo:.3f}..{hi:.3f} is {hi - lo:.3f} wide (need <= {max_width:g}, the "
                       "paper's +-0.02)")
    return Assessment(fit=fit, identified=not reasons, reason="; ".join(reasons), A_interval=(float(lo), float(hi)),
                      n_points=n, fit_from=options.fit_from, holdout=ho)
