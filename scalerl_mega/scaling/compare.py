"""Comparing scaling fits (paper App. A.5). The first-half forecast and its score are `scaling/holdout.py`.

- Leave-one-out table (`compare_loo`, Sec. 6 / App. A.5): A averaged over all runs, every run refit at
  that A, B compared (the paper's LOO table and Fig. 7).
- Seed margin: three independent ScaleRL runs varied A by at most +-0.015, so A's within
  `SEED_MARGIN_A` = 0.02 are indistinguishable. When two runs' A are within the margin, both are refit
  with A fixed at their mean and the higher B "is at least as good in terms of efficient scalability".
- Bootstrap intervals: by points (pairs resampled with replacement) or by seeds (whole runs of one
  config resampled). Point-level intervals are much narrower than the seed margin and understate the
  uncertainty that matters for comparing recipes; they are reported next to
  the margin, never instead of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from scalerl_mega.scaling.fit import FitOptions, SigmoidFit, _as_series

SEED_MARGIN_A = 0.02
"""App. A.5: error margin on A (three seeds varied A by at most +-0.015)."""


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """Percentile intervals of the grid-fit parameters over bootstrap resamples."""

    kind: str
    """"points" or "seeds"."""
    n_boot: int
    n_ok: int
    """Resamples whose fit succeeded (a resample can leave the fit window with too few points)."""
    level: float
    A: tuple[float, float]
    B: tuple[float, float]
    C_mid: tuple[float, float]
    frac_identified: float
    per_seed_A: tuple[float, ...] = ()
    seed_half_range: float = math.nan
    """(max - min) / 2 of the per-seed A: the paper's seed-margin estimate (App. A.5), seeds only."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Outcome of `compare_runs` (App. A.5 rule)."""

    label_a: str
    label_b: str
    fit_a: SigmoidFit
    fit_b: SigmoidFit
    margin: float
    delta_A: float
    """A_b - A_a (grid optima)."""
    within_margin: bool
    A_mean: float
    fixed_a: SigmoidFit | None
    fixed_b: SigmoidFit | None
    B_a_fixed: float
    """B of run a refit at A_mean (continuous refit; nan when not refit)."""
    B_b_fixed: float
    better: str | None
    """Label of the better run, or None (tie or not comparable)."""
    verdict: str
    bootstrap_a: Bootstrap | None = None
    bootstrap_b: Bootstrap | None = None


def _interval(v: np.ndarray, level: float) -> tuple[float, float]:
    if v.size == 0:
        return (math.nan, math.nan)
    q = (1.0 - level) / 2.0
    return (float(np.quantile(v, q)), float(np.quantile(v, 1.0 - q)))


def _summarise(kind: str, fits: list[SigmoidFit], *, n_boot: int, level: float, **extra) -> Bootstrap:
    A = np.array([f.A for f in fits])
    B = np.array([f.B for f in fits])
    cm = np.array([f.C_mid for f in fits])
    ident = float(np.mean([f.identified for f in fits])) if fits else math.nan
    return Bootstrap(kind=kind, n_boot=n_boot, n_ok=len(fits), level=level, A=_interval(A, level),
                     B=_interval(B, level), C_mid=_interval(cm, level), frac_identified=ident, **extra)


def bootstrap_points(compute, reward, *, options: FitOptions = FitOptions(), n_boot: int = 200, seed: int = 0,
                     level: float = 0.95) -> Bootstrap:
    """Pairs bootstrap over the points of one run. R0 is held at the original fit's R0 so that resampling
    the step-0 point does not move it. Uses `options` (use method="fast": each resample is one fit)."""
    c, r = _as_series(compute, reward)
    base = options.fit(c, r)
    opts = replace(options, r0=base.R0, refine=False)
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n_boot):
        idx = np.sort(rng.integers(0, c.size, c.size))
        try:
            fits.append(opts.fit(c[idx], r[idx]))
        except ValueError:
            continue
    return _summarise("points", fits, n_boot=n_boot, level=level)


def bootstrap_seeds(runs: Sequence[tuple[Sequence[float], Sequence[float]]], *, options: FitOptions = FitOptions(),
                    n_boot: int = 200, seed: int = 0, level: float = 0.95) -> Bootstrap:
    """Seed bootstrap over several runs of the same config: resample whole runs with replacement, pool their
    points (sorted by compute), fit. Also reports every run's own A and their half-range (App. A.5's
    margin estimate). R0 is the mean of the runs' R0 unless `options.r0` is given."""
    if len(runs) < 2:
        raise ValueError(f"bootstrap_seeds needs at least 2 runs of the same config, got {len(runs)}")
    series = [_as_series(c, r) for c, r in runs]
    per = [options.fit(c, r) for c, r in series]
    r0 = options.r0 if options.r0 is not None else float(np.mean([f.R0 for f in per]))
    opts = replace(options, r0=r0, refine=False)
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(series), len(series))
        c = np.concatenate([series[k][0] for k in pick])
        r = np.concatenate([series[k][1] for k in pick])
        order = np.argsort(c, kind="stable")
        try:
            fits.append(opts.fit(c[order], r[order]))
        except ValueError:
            continue
    a_seeds = tuple(f.A for f in per)
    return _summarise("seeds", fits, n_boot=n_boot, level=level, per_seed_A=a_seeds,
                      seed_half_range=(max(a_seeds) - min(a_seeds)) / 2.0)


def compare_runs(a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]], *,
                 labels: tuple[str, str] = ("a", "b"), options: FitOptions = FitOptions(),
                 margin: float = SEED_MARGIN_A, n_boot: int = 0, seed: int = 0) -> Comparison:
    """App. A.5: compare A with the seed margin; within the margin refit both at the mean A and compare B.

    `a`, `b` are (compute, reward) series. `n_boot > 0` adds point-bootstrap intervals for both runs
    (reported next to the margin; the margin decides)."""
    la, lb = labels
    fa, fb = options.fit(*a), options.fit(*b)
    boot_a = bootstrap_points(*a, options=options, n_boot=n_boot, seed=seed) if n_boot > 0 else None
    boot_b = bootstrap_points(*b, options=options, n_boot=n_boot, seed=seed + 1) if n_boot > 0 else None
    dA = fb.A - fa.A
    A_mean = round((fa.A + fb.A) / 2.0, 6)
    within = abs(dA) <= margin + 1e-12
    common = dict(label_a=la, label_b=lb, fit_a=fa, fit_b=fb, margin=margin, delta_A=dA, within_margin=within,
                  A_mean=A_mean, bootstrap_a=boot_a, bootstrap_b=boot_b)
    missing = [f"{lab} ({f.reason})" for lab, f in ((la, fa), (lb, fb)) if not f.identified]
    if missing:
        return Comparison(**common, fixed_a=None, fixed_b=None, B_a_fixed=math.nan, B_b_fixed=math.nan,
                          better=None, verdict="not comparable: A not identified for " + "; ".join(missing))
    if not within:
        better = lb if dA > 0 else la
        hi, lo = (fb, fa) if dA > 0 else (fa, fb)
        verdict = (f"A differs beyond the +-{margin:g} seed margin: {better} has the higher asymptote "
                   f"(A={hi.A:.3f} vs {lo.A:.3f})")
        return Comparison(**common, fixed_a=None, fixed_b=None, B_a_fixed=math.nan, B_b_fixed=math.nan,
                          better=better, verdict=verdict)
    xa = options.refit_fixed_A(*a, A=A_mean)
    xb = options.refit_fixed_A(*b, A=A_mean)
    Ba = xa.refined.B if xa.refined is not None else xa.B
    Bb = xb.refined.B if xb.refined is not None else xb.B
    if abs(Ba - Bb) <= 1e-3 * max(abs(Ba), abs(Bb)):
        better, how = None, "equal B"
    else:
        better = la if Ba > Bb else lb
        how = f"{better} has the higher B, so it is at least as efficient"
    verdict = (f"A within the +-{margin:g} seed margin (delta {dA:+.3f}); refit at A={A_mean:.4f}: "
               f"B {la}={Ba:.3f}, {lb}={Bb:.3f}: {how}")
    return Comparison(**common, fixed_a=xa, fixed_b=xb, B_a_fixed=Ba, B_b_fixed=Bb, better=better, verdict=verdict)


@dataclass(frozen=True, kw_only=True)
class LooRun:
    """One run of `compare_loo`: its own fit and its refit at the common A."""

    label: str
    fit: SigmoidFit
    A_offset: float
    """Own A minus the common A (nan when A is not identified)."""
    within_margin: bool
    """|A_offset| <= the seed margin: B at the common A compares like with like."""
    fixed: SigmoidFit | None
    """Refit at the common A (None when A is not identified)."""
    B: float
    """B at the common A (continuous refit; nan when not refit)."""
    C_mid: float


@dataclass(frozen=True, kw_only=True)
class LooComparison:
    """Leave-one-out comparison as the paper computes its table (Sec. 6 "LOO Ablations", App. A.5)."""

    A_mean: float
    """Mean of the identified runs' A: every such run is refit with A fixed at this value."""
    margin: float
    runs: tuple[LooRun, ...]
    best: str | None
    """Label of the highest B at the common A (None when no run could be refit)."""
    excluded: tuple[str, ...]
    """Runs whose A is not identified: not in the mean, not refit."""


def compare_loo(runs: Sequence[tuple[Sequence[float], Sequence[float]]], *, labels: Sequence[str] | None = None,
                options: FitOptions | Sequence[FitOptions] = FitOptions(),
                margin: float = SEED_MARGIN_A, identified: Sequence[bool] | None = None) -> LooComparison:
    """Average A over all runs, refit every run at that A, compare B (Sec. 6: "we average the asymptotic
    reward A across all runs, re-fit the curves with this fixed A, and then compare slopes"; App. A.5).

    `runs` are (compute, reward) series; `options` one FitOptions or one per run. Runs whose A is not
    identified are excluded from the mean and not refit. Each run reports whether its own A is within
    the seed margin of the mean (outside it, B at the common A is not a like-for-like comparison).
    `identified`: one verdict per run (`identify.assess`, the project's rule) instead of each fit's own
    `SigmoidFit.identified`."""
    labels = [f"run{k}" for k in range(len(runs))] if labels is None else list(labels)
    opts = [options] * len(runs) if isinstance(options, FitOptions) else list(options)
    if not runs or len(labels) != len(runs) or len(opts) != len(runs):
        raise ValueError(f"compare_loo: {len(runs)} runs, {len(labels)} labels, {len(opts)} options")
    fits = [o.fit(*r) for o, r in zip(opts, runs)]
    if identified is not None:
        if len(identified) != len(fits):
            raise ValueError(f"compare_loo: {len(runs)} runs but {len(identified)} identified flags")
        fits = [replace(f, identified=bool(ok), reason=f.reason or ("" if ok else "not identified"))
                for f, ok in zip(fits, identified)]
    ident = [f.A for f in fits if f.identified]
    A_mean = round(float(np.mean(ident)), 6) if ident else math.nan
    out = []
    for lab, o, r, f in zip(labels, opts, runs, fits):
        if not f.identified:
            out.append(LooRun(label=lab, fit=f, A_offset=math.nan, within_margin=False, fixed=None, B=math.nan,
                              C_mid=math.nan))
            continue
        x = o.refit_fixed_A(*r, A=A_mean)
        q = x.refined if x.refined is not None else x
        off = f.A - A_mean
        out.append(LooRun(label=lab, fit=f, A_offset=off, within_margin=abs(off) <= margin + 1e-12, fixed=x,
                          B=q.B, C_mid=q.C_mid))
    refit = [r for r in out if r.fixed is not None]
    best = max(refit, key=lambda r: r.B).label if refit else None
    return LooComparison(A_mean=A_mean, margin=margin, runs=tuple(out), best=best,
                         excluded=tuple(r.label for r in out if r.fixed is None))
