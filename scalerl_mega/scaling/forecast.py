"""Live scaling forecast during training (paper Sec. 5: fit early, extrapolate to the target budget).

`forecast(...)` is pure: the validation points so far in, a `Forecast` out; it never raises on too few
points (the training loop should not crash on a forecast), it reports `ok=False` with the reason.
`LiveForecaster` is a small helper that accumulates points and refits every `every` validation points.

Scale: by default the fit has no lower compute cut (`fit_from=None`) and uses `relative_grids` over
[smallest fitted compute, max(largest compute, budget)] (A in 0.005..1.000 step 0.005, C_mid geometric
from 0.1x to 100x of that range, 200 values), with `method="fast"` and no grid widening (an optimum on the edge is reported as not identified; the
relative C_mid grid already reaches 100x the budget): a refit takes tens of milliseconds.
For paper-scale GPU-hour runs pass `fit_from=1500.0` and the paper's grids (`fit.paper_grids()`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from scalerl_mega.scaling.fit import SIGMOID_PARAMS, SigmoidFit, fit_sigmoid, relative_grids


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
    """A is identified: the optimum is inside the grid and the data have passed C_mid."""
    reason: str
    fit: SigmoidFit | None = None


def forecast(compute: Sequence[float], reward: Sequence[float], *, budget: float, r0: float | None = None,
             fit_from: float | None = None, a_grid: Sequence[float] | None = None,
             cmid_grid: Sequence[float] | None = None) -> Forecast:
    """Fit Eq. 1 to the points so far (method="fast") and predict the reward at `budget` compute."""
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    n = int(c.size)
    so_far = float(c.max()) if n else 0.0
    nan = math.nan

    def fail(msg: str) -> Forecast:
        return Forecast(ok=False, n_points=n, compute_so_far=so_far, budget=float(budget), A=nan, B=nan, C_mid=nan,
                        R0=nan, predicted_reward_at_budget=nan, identified=False, reason=msg)

    if not (budget > 0 and math.isfinite(budget)):
        return fail(f"budget must be a positive number, got {budget}")
    mask = c > 0
    if fit_from is not None:
        mask &= c >= fit_from
    if int(mask.sum()) <= len(SIGMOID_PARAMS):
        return fail(f"{int(mask.sum())} point(s) in the fit window; need at least {len(SIGMOID_PARAMS) + 1}")
    if a_grid is None or cmid_grid is None:
        ra, rc = relative_grids(float(c[mask].min()), max(float(c[mask].max()), float(budget)))
        a_grid = ra if a_grid is None else a_grid
        cmid_grid = rc if cmid_grid is None else cmid_grid
    try:
        f = fit_sigmoid(c, r, r0=r0, fit_from=fit_from, method="fast", a_grid=a_grid, cmid_grid=cmid_grid,
                        widen=False)
    except ValueError as e:
        return fail(str(e))
    return Forecast(ok=True, n_points=n, compute_so_far=so_far, budget=float(budget), A=f.A, B=f.B, C_mid=f.C_mid,
                    R0=f.R0, predicted_reward_at_budget=float(f.predict(float(budget))), identified=f.identified,
                    reason=f.reason, fit=f)


@dataclass(kw_only=True)
class LiveForecaster:
    """Accumulate validation points; refit every `every` points (pure otherwise: no I/O, no clocks)."""

    budget: float
    every: int = 5
    r0: float | None = None
    fit_from: float | None = None
    compute: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    latest: Forecast | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def add(self, compute: float, reward: float) -> Forecast | None:
        """Record one validation point; return a new Forecast when this point triggers a refit, else None."""
        if self.compute and compute < self.compute[-1]:
            raise ValueError(f"compute went backwards: {compute} after {self.compute[-1]}")
        self.compute.append(float(compute))
        self.reward.append(float(reward))
        if len(self.compute) % self.every != 0:
            return None
        self.latest = forecast(self.compute, self.reward, budget=self.budget, r0=self.r0, fit_from=self.fit_from)
        return self.latest
