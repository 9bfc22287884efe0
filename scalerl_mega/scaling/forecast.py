"""Live scaling forecast during training (paper Sec. 5: fit early, extrapolate to the target budget).

`forecast(...)` is pure: the validation points so far in, a `Forecast` out; it never raises on too few
points (the training loop should not crash on a forecast), it reports `ok=False` with the reason.
`LiveForecaster` is a small helper that accumulates points and refits every `every` validation points.

The fit and the verdict are `scaling.identify.assess`, the same function `scalerl-fit` and report.md
use, with the same options (`identify.options_for`): on a GPU-hour axis that reaches the paper's scale
(`gpu_hours=True`, compute >= 1.5k) the paper's grids and cut (App. A.5/A.7); otherwise `relative_grids`
over the points after the cut, the cut being `cut_fraction` (default 0.1) x the compute so far, or
`fit_from` when given. `method="fast"` (grid widening on, as in `scalerl-fit`), well under a second a
refit. A and the reward at the budget are reported only when A is identified (identify.py's rule);
otherwise they are NaN, and the interval and the reason are given. Whether or not A is identified, the expected
reward at the budget and at twice the budget comes with its 95% band (`scaling.band`: parameter uncertainty and
the misfit of Eq. 1 measured on the run's own tail), and `plain_line` says all of it in words for the console.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from scalerl_mega.scaling.band import Band, forecast_band
from scalerl_mega.scaling.fit import SIGMOID_PARAMS, FitOptions, SigmoidFit, _as_series
from scalerl_mega.scaling.identify import CUT_FRACTION, Assessment, assess, auto_grid, options_for


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """Predicted scaling curve from the points seen so far."""

    ok: bool
    """A fit was made (False: too few points in the window, or bad input; see `reason`)."""
    n_points: int
    compute_so_far: float
    budget: float
    A: float
    B: float
    C_mid: float
    R0: float
    predicted_reward_at_budget: float
    identified: bool
    """A is identified (`scaling.identify`: interval <= 0.04 wide, enough points after the cut, no misfit)."""
    reason: str
    fit: SigmoidFit | None = None
    A_interval: tuple[float, float] = (math.nan, math.nan)
    """95% interval of A (given whether or not A is identified)."""
    fit_from: float | None = None
    """The cut: points below this compute were not fitted."""
    assessment: Assessment | None = None
    band: Band | None = None
    """The expected reward with its 95% band at `budget` and at 2 x `budget` (None when no fit was made)."""

    def summary(self) -> dict:
        """The fields of a `forecast` line in metrics.jsonl (A and the prediction None unless identified)."""
        def num(v: float):
            return None if isinstance(v, float) and math.isnan(v) else v

        return {"ok": self.ok, "A": num(self.A), "B": num(self.B), "C_mid": num(self.C_mid), "R0": num(self.R0),
                "A_interval": [num(float(v)) for v in self.A_interval], "identified": self.identified,
                "reason": self.reason, "budget": self.budget,
                "predicted_reward_at_budget": num(self.predicted_reward_at_budget), "n_points": self.n_points,
                "fit_from": self.fit_from, "forecast": [] if self.band is None else self.band.rows()}


def forecast(compute: Sequence[float], reward: Sequence[float], *, budget: float, r0: float | None = None,
             fit_from: float | None = None, cut_fraction: float = CUT_FRACTION, gpu_hours: bool = False,
             n_samples=None) -> Forecast:
    """Fit Eq. 1 to the points so far, judge it (`identify.assess`) and, only when A is identified, predict
    the reward at `budget` compute. `n_samples`: validation samples behind each point (noise floor)."""
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    n = int(c.size)
    so_far = float(c.max()) if n else 0.0
    nan = math.nan

    def fail(msg: str, cut=None) -> Forecast:
        return Forecast(ok=False, n_points=n, compute_so_far=so_far, budget=float(budget), A=nan, B=nan, C_mid=nan,
                        R0=nan, predicted_reward_at_budget=nan, identified=False, reason=msg, fit_from=cut)

    if not (budget > 0 and math.isfinite(budget)):
        return fail(f"budget must be a positive number, got {budget}")
    if n == 0:
        return fail(f"0 point(s) in the fit window; need at least {len(SIGMOID_PARAMS) + 1}")
    try:  # NaN/inf and a compute that goes back are named before anything else
        _as_series(c, r)
    except ValueError as e:
        return fail(str(e))
    grid = auto_grid([so_far], gpu_hours=gpu_hours)
    opts = options_for(c, grid=grid, fit_from="auto" if fit_from is None else fit_from, cut_fraction=cut_fraction,
                       base=FitOptions(r0=r0, method="fast"))
    mask = c > 0
    if opts.fit_from is not None:
        mask &= c >= opts.fit_from
    if int(mask.sum()) <= len(SIGMOID_PARAMS):
        return fail(f"{int(mask.sum())} point(s) in the fit window; need at least {len(SIGMOID_PARAMS) + 1}",
                    opts.fit_from)
    try:
        a = assess(c, r, options=opts, n_samples=n_samples)
    except ValueError as e:
        return fail(str(e), opts.fit_from)
    f = a.fit
    pred = float(a.predict(float(budget))) if a.identified else nan
    try:
        band = forecast_band(c, r, fit=f, at=[float(budget), 2.0 * float(budget)], n_samples=n_samples)
    except ValueError:
        band = None
    return Forecast(ok=True, n_points=n, compute_so_far=so_far, budget=float(budget), A=f.A if a.identified else nan,
                    B=f.B, C_mid=f.C_mid, R0=f.R0, predicted_reward_at_budget=pred, identified=a.identified,
                    reason=a.reason, fit=f, A_interval=a.A_interval, fit_from=opts.fit_from, assessment=a, band=band)


def _range(band: Band, k: int) -> str:
    return f"{band.reward[k]:.3f} (95% band {band.lo[k]:.3f}-{band.hi[k]:.3f})"


PLAIN_REASONS = (
    ("no rise", "the reward has not risen above its noise yet"),
    ("points after the cut", "too few validation points yet"),
    ("data stop before C_mid", "the curve has not bent over yet"),
    ("of its gain", "the curve has not bent over yet"),
    ("misfit", "Eq. 1 does not yet fit the latest points within the noise (the curve is still changing)"),
    ("wide", "the points do not pin it to the paper's +-0.02 yet"),
    ("grid's edge", "the points do not bound it yet"),
    ("upper edge", "the points do not bound it from above yet"),
)
"""`identify`'s reasons (a key phrase) in plain words."""


def plain_reason(reason: str) -> str:
    """The first of `identify.assess`'s reasons in plain words, with the advice that holds for all of them."""
    first = reason.split("; ")[0] if reason else ""
    words = next((w for key, w in PLAIN_REASONS if key in first), first or "the points do not pin it down yet")
    return f"{words}: not enough data to forecast the ceiling, run longer"


def ceiling_words(a: Assessment) -> str:
    """The asymptote A in words: its value when identified, else why it is not pinned down yet."""
    lo, hi = a.A_interval
    if a.identified:
        return f"ceiling A = {a.fit.A:.3f} ({lo:.3f}-{hi:.3f})"
    return f"ceiling A somewhere in {lo:.3f}-{hi:.3f}: {plain_reason(a.reason)}"


def plain_line(fc: Forecast, *, unit: str, budget_name: str = "at the end of this run") -> str:
    """One console line at a validation point: what the run should reach at its budget and at twice it, with the
    bands, and where the ceiling stands; or why there is no forecast yet."""
    if not fc.ok:
        return f"forecast: none yet ({fc.reason})"
    words = ceiling_words(fc.assessment) if fc.assessment is not None else ""
    if fc.band is None:
        return f"forecast: {words}"
    return (f"forecast: {budget_name} ({fc.budget:.3g} {unit}) {_range(fc.band, 0)}; with twice that compute "
            f"{_range(fc.band, 1)}; {words}")


@dataclass(kw_only=True)
class LiveForecaster:
    """Accumulate validation points; refit every `every` points (pure otherwise: no I/O, no clocks)."""

    budget: float
    every: int = 5
    r0: float | None = None
    fit_from: float | None = None
    """Fixed cut; None: the `cut_fraction` rule (or the paper's cut on a paper-scale GPU-hour axis)."""
    cut_fraction: float = CUT_FRACTION
    gpu_hours: bool = False
    compute: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    n_samples: list[float] = field(default_factory=list)
    latest: Forecast | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def record(self, compute: float, reward: float, n_samples: float | None = None) -> None:
        """Append one validation point without refitting."""
        if self.compute and compute < self.compute[-1]:
            raise ValueError(f"compute went backwards: {compute} after {self.compute[-1]}")
        self.compute.append(float(compute))
        self.reward.append(float(reward))
        self.n_samples.append(math.nan if n_samples is None else float(n_samples))

    def add(self, compute: float, reward: float, n_samples: float | None = None) -> Forecast | None:
        """Record one validation point (with the number of samples behind it, when known); return a new
        Forecast when this point triggers a refit, else None."""
        self.record(compute, reward, n_samples)
        if len(self.compute) % self.every != 0:
            return None
        ns = None if any(math.isnan(v) for v in self.n_samples) else list(self.n_samples)
        self.latest = forecast(self.compute, self.reward, budget=self.budget, r0=self.r0, fit_from=self.fit_from,
                               cut_fraction=self.cut_fraction, gpu_hours=self.gpu_hours, n_samples=ns)
        return self.latest
