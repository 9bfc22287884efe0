"""Paper Eq. 1 and the App. A.4 power law, and the records the fits in `scaling.fit` return.

Eq. 1:   R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

SIGMOID_PARAMS = ("A", "B", "C_mid")
"""Free parameters of the sigmoid fit (R0 is an input); a fit needs more points than this."""


def sigmoid_law(compute, *, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """Eq. 1: R0 + (A - R0) / (1 + (C_mid / C)^B). C = 0 gives R0 (for B > 0)."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        return R0 + (A - R0) / (1.0 + (C_mid / c) ** B)


def power_law(compute, *, A: float, D: float, B: float) -> np.ndarray:
    """App. A.4: R = A - D / C^B (the pre-training form; Eq. 1's limit for C >> C_mid, D = (A-R0) C_mid^B)."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        return A - D / c**B


# --------------------------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True, kw_only=True)
class GridInfo:
    """The grid a fit searched (after any widening)."""

    a_lo: float
    a_hi: float
    n_a: int
    cmid_lo: float
    cmid_hi: float
    n_cmid: int
    cmid_spacing: Literal["linear", "geometric", "irregular"]


@dataclass(frozen=True, kw_only=True)
class RefinedFit:
    """Continuous least-squares refit started at the grid optimum (`refine=True`)."""

    A: float
    B: float
    C_mid: float
    sse: float
    differs: bool
    """True when it moved A by >= one grid step (0.005) or B / C_mid by >= 1% relative."""


@dataclass(frozen=True, kw_only=True)
class SigmoidFit:
    """Result of `fit_sigmoid` / `refit_fixed_A`. A, B, C_mid are the grid optimum (the paper's numbers)."""

    A: float
    B: float
    C_mid: float
    R0: float
    r0_source: str
    """"given", or "reward at smallest compute (C=...)" (the step-0 evaluation of the full series)."""
    sse: float
    n_points: int
    """Points inside the fit window (fit_from <= C <= fit_to, C > 0)."""
    identified: bool
    reason: str
    """Why not identified ("" when identified)."""
    method: str
    fit_from: float | None
    fit_to: float | None
    compute_range: tuple[float, float]
    """Smallest and largest compute inside the fit window."""
    grid: GridInfo
    on_edge: bool
    """Optimum on the edge of the final (possibly widened) grid."""
    widened: tuple[str, ...] = ()
    """Edges the grid was widened at ("A_low", "A_high", "C_mid_low", "C_mid_high"), in order."""
    A_profile_interval: tuple[float, float] = (math.nan, math.nan)
    fixed_A: bool = False
    refined: RefinedFit | None = None

    def predict(self, compute, *, refined: bool = False) -> np.ndarray:
        """Eq. 1 at `compute` with the grid optimum (or the continuous refit when `refined=True`)."""
        if refined:
            if self.refined is None:
                raise ValueError("predict(refined=True) needs a fit made with refine=True")
            p = self.refined
            return sigmoid_law(compute, A=p.A, B=p.B, C_mid=p.C_mid, R0=self.R0)
        return sigmoid_law(compute, A=self.A, B=self.B, C_mid=self.C_mid, R0=self.R0)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class PowerLawFit:
    """App. A.4 power law R = A - D / C^B."""

    A: float
    D: float
    B: float
    sse: float
    n_points: int
    a_at_bound: bool
    """A hit `a_max` (the paper's power-law fit on the 100k run predicted A = 1.0)."""
    fit_from: float | None
    fit_to: float | None

    def predict(self, compute) -> np.ndarray:
        return power_law(compute, A=self.A, D=self.D, B=self.B)


@dataclass(frozen=True, kw_only=True)
class LooTransform:
    """Fig. 7 (LOO): log F(R) vs log C with F(R) = C_mid^B / ((A - R0)/(R - R0) - 1), which equals C^B on Eq. 1.

    Natural logs. Only points with 0 < (R - R0)/(A - R0) < 1 are defined (`valid`). On noisy data the
    slope is a picture, not an estimator."""

    log_C: np.ndarray
    log_F: np.ndarray
    valid: np.ndarray
    slope: float
    intercept: float
