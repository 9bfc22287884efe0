"""Forecast bands: a 95% band on the expected validation reward at any compute, from a fit of Eq. 1 (paper Sec. 2.1,
Sec. 6 "Extrapolating Scaling Curves", Fig. 1) -- given whether or not A is identified.

The band answers "what will this run reach at compute C?" for the expected reward R(C) (not for one noisy
validation point) and has two parts, combined in quadrature on each side of the forecast f(C):

1. **Parameter uncertainty** (profile likelihood). The parameter sets whose sum of squared residuals on the fitted
   points is within SSE_min (1 + F_0.95(1, n - 3) / (n - 3)) of the best -- the threshold of A's profile interval
   (`fit.A_profile_interval`), applied here to the scalar f(C) -- and the lowest and highest f(C) among them. It is
   computed exactly in A and on a grid in (C_mid, B): for fixed (C_mid, B), Eq. 1 is linear in a = A - R0, so the
   admissible a form an interval (a quadratic inequality), clipped to 0 <= A <= 1, and f(C) = R0 + a s(C) with
   s >= 0 is extreme at its ends. A coarse grid over B in [0.05, 20] and C_mid in [0.05 x, 1000 x] the fitted
   compute locates the near-admissible pairs; the band is read on a fine grid laid over them. Far beyond the data every admissible asymptote is reached: where A is not
   identified the band spreads to the ends of A's interval, never to a bare number. The noise variance comes from
   the residuals, so overdispersion and visible misfit widen it; R0's own binomial error is carried by the hull of
   the bands at R0 and R0 +- 1.96 SE (as `identify.assess` does for A's interval).

2. **Misspecification of Eq. 1**, estimated from the run's own data (a held-out tail). The fitted points are cut at
   50%, 62.5% and 75% of them; Eq. 1 fitted to each prefix (the same grid) forecasts the points after it. Each
   error e at log-compute distance d = log(C / C_cut) has expected square sigma^2 + (kappa d)^2, where sigma^2 is
   the point's noise (binomial p (1 - p) / N, or the residual variance where N is unknown) and kappa d what the
   curve family misses at that distance (plus the prefix fit's own uncertainty: conservative). kappa^2 =
   max(0, sum (e^2 - sigma^2) d^2) / sum d^4 over every held-out point of every cut, raised by `KAPPA_Z` of its
   standard errors; kappa is never below `FLOOR_SE` x the noise SD of a point at the fit's end (nor `KAPPA_FLOOR`):
   Eq. 1 is never exact beyond the data, and a misfit below the noise is one the tails cannot show. Beyond the fitted
   data the band widens by 1.96 kappa log(C / C_end) on each side. A slow rise that continues after the knee (the
   reproduction's late creep, reproduction/predictability/README.md) shows in these tails as errors growing with
   distance; a run that follows Eq. 1 shows errors of the noise's size, and kappa near 0.

Why this method: the profile band is exact for the family and costs one pass over a (C_mid, B) grid; the
misspecification term needs no second model, uses only the run's points, and grows with the distance of the
extrapolation, as the reproduction's misses did. It cannot see a change that starts after the data end (e.g. a
prompt pool that drains); no band can. Calibration out of sample: the constants of part 2 (`KAPPA_Z`,
`KAPPA_FLOOR`, `FLOOR_SE`) are chosen on one set of simulated runs and their coverage is reported on another
never used for any choice (tests/support/band_calibration.py, docs/scaling_science.md).

Pure math: arrays in, a dataclass out; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scalerl_mega.scaling.cells import profile_factor
from scalerl_mega.scaling.records import SigmoidFit

Z95 = 1.959963984540054
"""The two-sided 95% normal quantile."""
KAPPA_Z = 1.0
"""kappa^2 is taken this many standard errors above its estimate (a run's tails are few). Chosen on the design set
of simulated runs (tests/support/band_calibration.py), checked on a disjoint set never used for any choice."""
KAPPA_FLOOR = 0.0
"""The least misfit of Eq. 1 the band assumes whatever the noise, per unit of log compute beyond the data (chosen
with KAPPA_Z and FLOOR_SE: 0, the noise-scaled floor suffices)."""
FLOOR_SE = 2.25
"""The least misfit slope in units of the run's noise: kappa >= FLOOR_SE x `Band.noise_se` per unit of log compute.
A misfit of Eq. 1 that the run's own tails cannot show is one below their noise, so a run with less noise (more
validation samples) is held to a smaller one: the band narrows where the fit is well identified (chosen with
KAPPA_Z)."""
B_RANGE = (0.05, 20.0)
"""B values the band considers."""
CMID_RANGE = (0.05, 1000.0)
"""C_mid values the band considers, as multiples of the smallest and the largest fitted compute."""
COARSE = (41, 100)
"""(B, C_mid) values of the coarse grid (geometric) that locates the near-admissible parameters."""
FINE = (81, 121)
"""(B, C_mid) values of the fine grid laid over them, on which the band is read (a 10x finer grid moves the
band's ends by < 1e-3 on the calibration runs)."""
CUTS = (0.5, 0.625, 0.75)
"""The held-out tails of the misspecification estimate: the fitted points are cut at these shares of them."""
BINS = 3
"""Each held-out tail is averaged in this many consecutive bins before its errors are squared: the noise averages
out, a systematic error does not."""
MIN_PREFIX = 8
"""Fewest points a prefix fit of the misspecification estimate rests on (as `identify.MIN_POINTS`)."""


@dataclass(frozen=True, kw_only=True)
class Band:
    """The forecast of the expected reward at `compute` with its 95% band `[lo, hi]` (module docstring)."""

    compute: np.ndarray
    reward: np.ndarray
    """Eq. 1 of the fit at `compute`."""
    lo: np.ndarray
    hi: np.ndarray
    param_lo: np.ndarray
    """The profile-likelihood band alone (part 1)."""
    param_hi: np.ndarray
    misspecification: np.ndarray
    """Part 2's half-width at `compute` (0 within the fitted data)."""
    kappa: float
    """The misspecification slope per unit of log compute (module docstring)."""
    fit_end: float
    """The largest fitted compute."""
    kappa_sums: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """`kappa_terms`' (num, var, den), from which `with_kappa` recomputes the band at other constants."""
    noise_se: float = 0.0
    """The noise SD of one point at the fit's end (binomial sqrt(p (1 - p) / N) at the fit's value there, or the
    residual SD where N is unknown): the unit of `FLOOR_SE`."""

    def rows(self) -> list[dict[str, float]]:
        """`{"compute", "reward", "lo", "hi"}` per target (`scalerl-fit --json`'s `forecast` rows)."""
        return [{"compute": float(c), "reward": float(r), "lo": float(lo), "hi": float(hi)}
                for c, r, lo, hi in zip(self.compute, self.reward, self.lo, self.hi)]

    def half_width(self) -> np.ndarray:
        return 0.5 * (self.hi - self.lo)

    def with_kappa(self, *, z: float, floor: float, floor_se: float = 0.0) -> Band:
        """The same band with kappa^2 taken `z` standard errors above its estimate and kappa at least
        max(`floor`, `floor_se` x `noise_se`) (how `KAPPA_Z`, `KAPPA_FLOOR` and `FLOOR_SE` are chosen on simulated
        runs without refitting them)."""
        kappa = kappa_bound(*self.kappa_sums, z=z, floor=max(floor, floor_se * self.noise_se))
        return _combine(self.compute, self.reward, self.param_lo, self.param_hi, kappa=kappa, fit_end=self.fit_end,
                        kappa_sums=self.kappa_sums, noise_se=self.noise_se)


def _combine(at, f, p_lo, p_hi, *, kappa: float, fit_end: float, kappa_sums, noise_se: float) -> Band:
    """Parts 1 and 2 in quadrature on each side of the forecast `f`, clipped to [0, 1] (module docstring) and
    always containing `f` (a forecast outside its own band would be a contradiction, whatever the input)."""
    mis = Z95 * kappa * np.maximum(np.log(at / fit_end), 0.0)
    lo = np.minimum(np.clip(f - np.sqrt((f - p_lo) ** 2 + mis ** 2), 0.0, 1.0), f)
    hi = np.maximum(np.clip(f + np.sqrt((p_hi - f) ** 2 + mis ** 2), 0.0, 1.0), f)
    return Band(compute=at, reward=f, lo=lo, hi=hi, param_lo=p_lo, param_hi=p_hi, misspecification=mis, kappa=kappa,
                fit_end=fit_end, kappa_sums=kappa_sums, noise_se=noise_se)


def _expit(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _grid_s(x: np.ndarray, lcm: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """s = expit(B (x - log C_mid)) for every (C_mid, B) pair (log C_mid in `lcm`, log B in `lb`) and every x:
    shape (len(lcm) * len(lb), len(x))."""
    z = np.exp(lb)[None, :, None] * (x[None, None, :] - lcm[:, None, None])
    return _expit(z).reshape(lcm.size * lb.size, x.size)


def _fine_grid(x: np.ndarray, r: np.ndarray, r0: float) -> tuple[np.ndarray, np.ndarray]:
    """(log C_mid, log B) of the fine grid: laid over the coarse grid's pairs whose least SSE is within three times
    the profile threshold's allowance of the best, for the whole fitted set and each prefix of `_kappa` (their
    regions are larger), one coarse step beyond on every side."""
    lcm_all = np.linspace(math.log(CMID_RANGE[0] * math.exp(x.min())), math.log(CMID_RANGE[1] * math.exp(x.max())),
                          COARSE[1])
    lb_all = np.linspace(math.log(B_RANGE[0]), math.log(B_RANGE[1]), COARSE[0])
    s = _grid_s(x, lcm_all, lb_all)
    y = r - r0
    Sys, Sss, syy = np.cumsum(s * y, axis=1), np.cumsum(s * s, axis=1), np.cumsum(y * y)
    keep = np.zeros(s.shape[0], dtype=bool)
    for m in sorted({x.size, *(int(math.floor(q * x.size)) for q in CUTS)}):
        if m < MIN_PREFIX and m != x.size:
            continue
        sy, ss, yy = Sys[:, m - 1], Sss[:, m - 1], float(syy[m - 1])
        a = np.clip(sy / np.where(ss > 0, ss, 1.0), -r0, 1.0 - r0)
        sse = yy - 2.0 * a * sy + a * a * ss
        best = float(sse.min())  # may round below 0 on an exactly fitted prefix: the allowance is never negative
        keep |= sse <= best + abs(best) * 3.0 * (profile_factor(m, 3) - 1.0)
    jm, jb = np.unravel_index(np.flatnonzero(keep), (lcm_all.size, lb_all.size))
    dm, db = lcm_all[1] - lcm_all[0], lb_all[1] - lb_all[0]
    lcm = np.linspace(max(lcm_all[jm.min()] - dm, lcm_all[0]), min(lcm_all[jm.max()] + dm, lcm_all[-1]), FINE[1])
    lb = np.linspace(max(lb_all[jb.min()] - db, lb_all[0]), min(lb_all[jb.max()] + db, lb_all[-1]), FINE[0])
    return lcm, lb


def _admissible(Sys, Sss, syy, T, r0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (C_mid, B) pair: the interval [a_lo, a_hi] of a = A - R0 with SSE(a) <= T and 0 <= A <= 1, and whether
    it is non-empty (SSE(a) = syy - 2 a Sys + a^2 Sss: Eq. 1 is linear in a for fixed C_mid, B)."""
    safe = np.where(Sss > 0, Sss, 1.0)
    disc = Sys * Sys - Sss * (syy - T)
    ok = (disc >= 0) & (Sss > 0)
    root = np.sqrt(np.where(ok, disc, 0.0))
    a_lo = np.maximum((Sys - root) / safe, -r0)
    a_hi = np.minimum((Sys + root) / safe, 1.0 - r0)
    return a_lo, a_hi, ok & (a_lo <= a_hi)


def _sse_min(Sys, Sss, syy, r0) -> float:
    """The least SSE over the grid, A within [0, 1]."""
    a = np.clip(Sys / np.where(Sss > 0, Sss, 1.0), -r0, 1.0 - r0)
    return float(np.min(syy - 2.0 * a * Sys + a * a * Sss))


def _profile(y_by_r0, r0s, s_fit, s_at, sse_min_hint: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Part 1: the lowest and highest f at the targets over the admissible parameter sets, hull over R0 values."""
    n = s_fit.shape[1]
    Sss = np.einsum("pn,pn->p", s_fit, s_fit)
    sums = [(s_fit @ y, float(y @ y)) for y in y_by_r0]
    best = min(_sse_min(Sys, Sss, syy, r0) for (Sys, syy), r0 in zip(sums, r0s))
    if sse_min_hint is not None:  # the fit's continuous optimum may lie between grid cells
        best = min(best, sse_min_hint)
    T = max(best, 1e-300) * profile_factor(n, 3)
    lo = np.full(s_at.shape[1], np.inf)
    hi = np.full(s_at.shape[1], -np.inf)
    for (Sys, syy), r0 in zip(sums, r0s):
        a_lo, a_hi, ok = _admissible(Sys, Sss, syy, T, r0)
        if ok.any():
            sa = s_at[ok]
            lo = np.minimum(lo, r0 + np.min(a_lo[ok, None] * sa, axis=0))
            hi = np.maximum(hi, r0 + np.max(a_hi[ok, None] * sa, axis=0))
    return lo, hi


def kappa_bound(num: float, var: float, den: float, *, z: float, floor: float) -> float:
    """kappa = max(floor, sqrt(max(0, num + z sqrt(var)) / den)): the estimate of kappa^2 (num / den) raised by z of
    its standard errors, never below `floor` (`KAPPA_FLOOR`, also when no held-out tail exists: den = 0)."""
    if den <= 0:
        return floor
    return max(floor, math.sqrt(max(num + z * math.sqrt(var), 0.0) / den))


def kappa_terms(x, r, r0, s_fit, noise_var) -> tuple[float, float, float]:
    """Part 2's sums: Eq. 1 fitted on each prefix of the points (`CUTS`) forecasts the rest; what the errors
    show beyond the points' noise and the prefix fit's own (profile) uncertainty (module docstring), as
    (num, var, den): kappa^2 is estimated by num / den with variance var / den^2."""
    n = x.size
    y = r - r0
    Sys = np.cumsum(s_fit * y[None, :], axis=1)
    Sss = np.cumsum(s_fit * s_fit, axis=1)
    syy = np.cumsum(y * y)
    num = den = var = 0.0
    for q in CUTS:
        m = int(math.floor(q * n))
        if m < MIN_PREFIX or n - m < 2:
            continue
        sy, ss, yy = Sys[:, m - 1], Sss[:, m - 1], float(syy[m - 1])
        a = np.clip(sy / np.where(ss > 0, ss, 1.0), -r0, 1.0 - r0)
        sse = yy - 2.0 * a * sy + a * a * ss
        p = int(np.argmin(sse))
        e = r[m:] - (r0 + a[p] * s_fit[p, m:])
        a_lo, a_hi, ok = _admissible(sy, ss, yy, float(sse[p]) * profile_factor(m, 3), r0)
        ok[p] = True  # the best pair is admissible; rounding can drop it when the prefix is fitted exactly
        a_lo[p], a_hi[p] = min(a_lo[p], a[p]), max(a_hi[p], a[p])
        later = s_fit[ok, m:]
        width = np.max(a_hi[ok, None] * later, axis=0) - np.min(a_lo[ok, None] * later, axis=0)
        v_param = (0.5 * width / Z95) ** 2  # the prefix fit's own uncertainty, as a variance
        d = x[m:] - x[m - 1]
        for idx in np.array_split(np.arange(n - m), min(BINS, n - m)):  # a systematic error survives averaging
            e_b, d_b = float(e[idx].mean()), float(d[idx].mean())
            tau2 = float(noise_var[m:][idx].mean()) / idx.size + float(v_param[idx].mean())
            excess = e_b * e_b - tau2
            num += excess * d_b * d_b
            den += d_b ** 4
            var += (2.0 * tau2 * tau2 + 4.0 * tau2 * max(excess, 0.0)) * d_b ** 4  # Var(e_b^2), e_b ~ N(mu, tau2)
    return num, var, den


def forecast_band(compute, reward, *, fit: SigmoidFit, at, n_samples=None) -> Band:
    """The 95% band on the expected reward at the computes `at` (module docstring) of the run `compute`,
    `reward` (every point; those inside `fit.compute_range` are the fitted ones) and its Eq. 1 fit `fit`.
    `n_samples`: validation samples behind each point (the binomial noise), or None (the residual variance)."""
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    at = np.atleast_1d(np.asarray(at, dtype=np.float64))
    if np.any(at <= 0):
        raise ValueError(f"forecast computes must be > 0, got {at[at <= 0][:3].tolist()}")
    lo_c, hi_c = fit.compute_range
    inside = (c >= lo_c) & (c <= hi_c) & (c > 0)
    if int(inside.sum()) < 4:
        raise ValueError(f"{int(inside.sum())} fitted points: a band needs >= 4")
    order = np.argsort(c[inside], kind="stable")
    cf, rf = c[inside][order], r[inside][order]
    x, r0 = np.log(cf), float(fit.R0)
    lcm, lb = _fine_grid(x, rf, r0)
    s_fit = _grid_s(x, lcm, lb)
    s_at = _grid_s(np.log(at), lcm, lb)
    n_all = None if n_samples is None else np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)
    p_fit = np.clip(fit.predict(cf), 1e-6, 1 - 1e-6)
    if n_all is not None:
        noise_var = p_fit * (1.0 - p_fit) / n_all[inside][order]
    else:
        noise_var = np.full(cf.size, fit.sse / max(fit.n_points - 3, 1))
    r0s = [r0]
    first = int(np.argmin(c))
    if n_all is not None and n_all[first] > 0:  # R0's own binomial error (identify.R0_Z)
        se = math.sqrt(max(r0 * (1.0 - r0), 1e-12) / n_all[first])
        r0s += [min(max(r0 - Z95 * se, 0.0), 1.0), min(max(r0 + Z95 * se, 0.0), 1.0)]
    p_lo, p_hi = _profile([rf - v for v in r0s], r0s, s_fit, s_at, sse_min_hint=fit.sse)
    f = fit.predict(at)
    p_lo, p_hi = np.minimum(p_lo, f), np.maximum(p_hi, f)
    sums = kappa_terms(x, rf, r0, s_fit, noise_var)
    se = math.sqrt(float(noise_var[-1]))
    kappa = kappa_bound(*sums, z=KAPPA_Z, floor=max(KAPPA_FLOOR, FLOOR_SE * se))
    return _combine(at, f, p_lo, p_hi, kappa=kappa, fit_end=float(cf.max()), kappa_sums=sums, noise_se=se)
