"""Recipes run on several seeds: the seed-mean curve and the leave-one-out verdict against the seed noise.

The paper compares leave-one-out variants (Sec. 6, Fig. 7, App. A.5) by A against the +-0.02 seed margin
(three ScaleRL seeds varied A by at most +-0.015) and, within the margin, by B after refitting every
run at the common mean A. With several seeds per recipe the same rule can be applied with the noise
measured instead of assumed:

- A: the difference of the recipes' mean A counts only beyond `max(margin, half-range of A over each
  recipe's seeds)` -- the paper's margin, widened when the seeds here spread more.
- B at the common A: the difference of the mean B counts only beyond `z` standard errors of that
  difference (Welch: sqrt(s_a^2 / n_a + s_b^2 / n_b), sample standard deviations over seeds).

`compare_recipe` returns "reference better", "variant better" or "not separable within noise" with the
numbers it decided on; `compare_means` is its B rule on any per-seed quantity (e.g. the final pass rate,
a model-free check where A is not identified).

`compare_paired` compares by seed: runs of two recipes with the same seed share their warm start, prompt
order and (unless `data.val_paired_draws`) their validation draws, so the per-seed differences
d_s = variant_s - reference_s cancel what the seed shares. Their mean counts only beyond
t_{0.975, k-1} x sd(d) / sqrt(k) over the k seeds both recipes have (Student t at the actual degrees of
freedom: 4.30 for 3 seeds, not the normal 1.96); the paper's +-0.02 rule on the mean difference is
reported next to it.

`paired_window` applies `compare_paired` to the mean of each seed's points inside a compute window (variant minus
reference at the same compute), and `crossing` to the first and last quarter of the common compute: the paper's
"larger batches are slower early and higher late" (Sec. 5) is a crossing of two curves, which no fit of A decides
when the runs stop before their asymptote. Pure math: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from scalerl_mega.scaling.compare import SEED_MARGIN_A

REFERENCE_BETTER = "reference better"
VARIANT_BETTER = "variant better"
NOT_SEPARABLE = "not separable within noise"


def seed_mean_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise mean of several seeds' (compute, reward) series validated at the same steps: point k of
    the result is the mean compute and the mean reward of every seed's point k (series longer than the
    shortest are cut to it: the mean covers only steps that every seed reached)."""
    if not curves:
        raise ValueError("seed_mean_curve needs at least one series")
    n = min(len(c) for c, _ in curves)
    if n == 0:
        raise ValueError("seed_mean_curve: a series has no points")
    for c, r in curves:
        if len(c) != len(r):
            raise ValueError(f"seed_mean_curve: compute has {len(c)} points but reward {len(r)}")
    x = np.mean([np.asarray(c, dtype=np.float64)[:n] for c, _ in curves], axis=0)
    y = np.mean([np.asarray(r, dtype=np.float64)[:n] for _, r in curves], axis=0)
    return x, y


def half_range(values: Sequence[float]) -> float:
    """(max - min) / 2: the paper's seed-margin statistic (App. A.5); 0 for a single value."""
    v = [float(x) for x in values]
    if not v:
        raise ValueError("half_range of no values")
    return (max(v) - min(v)) / 2.0


@dataclass(frozen=True, kw_only=True)
class MeanComparison:
    """Difference of two seed means against `z` Welch standard errors."""

    outcome: str
    delta: float
    """mean(variant) - mean(reference)."""
    se: float
    """sqrt(s_ref^2 / n_ref + s_var^2 / n_var) with sample standard deviations (nan below 2 seeds a side)."""


def compare_means(ref: Sequence[float], var: Sequence[float], *, z: float = 2.0) -> MeanComparison:
    """Variant vs reference by their seed means: `variant better` / `reference better` when the difference
    exceeds `z` Welch standard errors, else not separable (also with fewer than 2 values on a side).
    NaN values are left out."""
    a = [float(x) for x in ref if not math.isnan(float(x))]
    b = [float(x) for x in var if not math.isnan(float(x))]
    if len(a) < 2 or len(b) < 2:
        d = float(np.mean(b) - np.mean(a)) if a and b else math.nan
        return MeanComparison(outcome=NOT_SEPARABLE, delta=d, se=math.nan)
    d = float(np.mean(b) - np.mean(a))
    se = float(math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b)))
    if abs(d) > z * se:
        return MeanComparison(outcome=VARIANT_BETTER if d > 0 else REFERENCE_BETTER, delta=d, se=se)
    return MeanComparison(outcome=NOT_SEPARABLE, delta=d, se=se)


@dataclass(frozen=True, kw_only=True)
class RecipeComparison:
    """A variant against the reference recipe over seeds (module docstring)."""

    outcome: str
    """REFERENCE_BETTER, VARIANT_BETTER or NOT_SEPARABLE."""
    decided_by: str
    """"A", "B at the common A" or "" (not separable, or too few identified seeds)."""
    delta_A: float
    """mean A (variant) - mean A (reference) over identified seeds (nan with fewer than `min_seeds`)."""
    noise_A: float
    """max(margin, both recipes' seed half-ranges of A)."""
    delta_B: float
    """mean B - mean B at the common A (variant - reference)."""
    se_B: float
    """Welch standard error of delta_B (nan with fewer than 2 seeds on a side)."""
    n_ref: int
    n_var: int
    reason: str


def compare_recipe(*, A_ref: Sequence[float], A_var: Sequence[float], B_ref: Sequence[float],
                   B_var: Sequence[float], margin: float = SEED_MARGIN_A, z: float = 2.0,
                   min_seeds: int = 2) -> RecipeComparison:
    """Variant vs reference from per-seed fits: A (own fits; nan = not identified, left out) against
    `max(margin, seed half-ranges)`, then B at the common A (nan = not refit, left out) against `z`
    Welch standard errors. Needs `min_seeds` identified seeds per recipe to decide anything."""
    a_ref = [float(a) for a in A_ref if not math.isnan(float(a))]
    a_var = [float(a) for a in A_var if not math.isnan(float(a))]
    nan = math.nan
    if len(a_ref) < min_seeds or len(a_var) < min_seeds:
        return RecipeComparison(outcome=NOT_SEPARABLE, decided_by="", delta_A=nan, noise_A=nan, delta_B=nan,
                                se_B=nan, n_ref=len(a_ref), n_var=len(a_var),
                                reason=f"A identified for {len(a_ref)} reference and {len(a_var)} variant seeds "
                                       f"(need {min_seeds} each)")
    dA = float(np.mean(a_var) - np.mean(a_ref))
    noise = max(margin, half_range(a_ref), half_range(a_var))
    common = dict(delta_A=dA, noise_A=noise, n_ref=len(a_ref), n_var=len(a_var))
    mb = compare_means(B_ref, B_var, z=z)
    dB, se = (mb.delta, mb.se) if not math.isnan(mb.se) else (nan, nan)
    common.update(delta_B=dB, se_B=se)
    if abs(dA) > noise:
        outcome = VARIANT_BETTER if dA > 0 else REFERENCE_BETTER
        return RecipeComparison(outcome=outcome, decided_by="A", **common,
                                reason=f"delta A {dA:+.3f} beyond the noise {noise:.3f}")
    if math.isnan(dB):
        return RecipeComparison(outcome=NOT_SEPARABLE, decided_by="", **common,
                                reason=f"delta A {dA:+.3f} within {noise:.3f}; B at the common A needs 2 refit "
                                       "seeds per recipe")
    if mb.outcome != NOT_SEPARABLE:
        return RecipeComparison(outcome=mb.outcome, decided_by="B at the common A", **common,
                                reason=f"delta A {dA:+.3f} within {noise:.3f}; delta B {dB:+.3f} beyond "
                                       f"{z:g} x SE {se:.3f}")
    return RecipeComparison(outcome=NOT_SEPARABLE, decided_by="", **common,
                            reason=f"delta A {dA:+.3f} within {noise:.3f}; delta B {dB:+.3f} within {z:g} x SE "
                                   f"{se:.3f}")


@dataclass(frozen=True, kw_only=True)
class PairedComparison:
    """Variant minus reference, paired by seed (module docstring)."""

    outcome: str
    """By the t rule: VARIANT_BETTER, REFERENCE_BETTER or NOT_SEPARABLE."""
    seeds: tuple[int, ...]
    """Seeds both recipes have (with finite values)."""
    differences: tuple[float, ...]
    mean: float
    sd: float
    dof: int
    t_crit: float
    """Two-sided t quantile at `dof` (nan below 2 seeds)."""
    half_width: float
    """t_crit x sd / sqrt(k): the mean counts beyond this."""
    margin_rule: str
    """The paper's rule on the same mean: beyond +-margin (VARIANT_BETTER / REFERENCE_BETTER) or NOT_SEPARABLE."""


def compare_paired(ref: dict[int, float], var: dict[int, float], *, level: float = 0.95,
                   margin: float = SEED_MARGIN_A) -> PairedComparison:
    """Variant vs reference by per-seed differences (module docstring): `ref` and `var` map seed -> value
    (NaN = missing). Fewer than 2 common seeds: not separable (no variance estimate)."""
    from scipy.special import stdtrit  # the Student t quantile (scipy.special imports fast)

    seeds = tuple(sorted(s for s in ref if s in var and math.isfinite(float(ref[s])) and math.isfinite(float(var[s]))))
    d = np.array([float(var[s]) - float(ref[s]) for s in seeds], dtype=np.float64)
    k = d.size
    mean = float(d.mean()) if k else math.nan
    margin_rule = (NOT_SEPARABLE if not (k and abs(mean) > margin + 1e-12)
                   else VARIANT_BETTER if mean > 0 else REFERENCE_BETTER)
    if k < 2:
        return PairedComparison(outcome=NOT_SEPARABLE, seeds=seeds, differences=tuple(d.tolist()), mean=mean,
                                sd=math.nan, dof=max(k - 1, 0), t_crit=math.nan, half_width=math.nan,
                                margin_rule=margin_rule)
    sd = float(d.std(ddof=1))
    t_crit = float(stdtrit(k - 1, 0.5 + level / 2.0))
    hw = t_crit * sd / math.sqrt(k)
    outcome = NOT_SEPARABLE if abs(mean) <= hw else (VARIANT_BETTER if mean > 0 else REFERENCE_BETTER)
    return PairedComparison(outcome=outcome, seeds=seeds, differences=tuple(d.tolist()), mean=mean, sd=sd, dof=k - 1,
                            t_crit=t_crit, half_width=hw, margin_rule=margin_rule)


@dataclass(frozen=True, kw_only=True)
class WindowDifference:
    """Variant minus reference, paired by seed, averaged over the validation points in a compute window."""

    window: tuple[float, float]
    """[lo, hi] of compute (inclusive)."""
    points: int
    """Validation points in the window (per seed; the fewest over the seeds)."""
    paired: PairedComparison


Curves = dict[int, tuple[np.ndarray, np.ndarray]]
"""seed -> (compute, reward) of one recipe's runs."""


def paired_window(ref: Curves, var: Curves, *, lo: float, hi: float) -> WindowDifference:
    """Per seed, the mean over the window's validation points of var - ref at the same compute (points present in
    both runs of that seed), then `compare_paired` over the seeds (t rule at 95%)."""
    ref_w, var_w, counts = {}, {}, set()
    for seed in sorted(set(ref) & set(var)):
        rc, rr = ref[seed]
        vc, vr = var[seed]
        at = {float(c): float(r) for c, r in zip(vc, vr)}
        pairs = [(float(r), at[float(c)]) for c, r in zip(rc, rr) if lo <= c <= hi and float(c) in at]
        if pairs:
            ref_w[seed] = float(np.mean([a for a, _ in pairs]))
            var_w[seed] = float(np.mean([b for _, b in pairs]))
            counts.add(len(pairs))
    return WindowDifference(window=(lo, hi), points=min(counts) if counts else 0, paired=compare_paired(ref_w, var_w))


def crossing(ref: Curves, var: Curves, *, fraction: float = 0.25) -> dict[str, WindowDifference | str]:
    """Paper Sec. 5 ("Global batch size"): a larger batch is worse early and better late. The paired difference
    var - ref over the first `fraction` of the common compute (after step 0) and over the last `fraction`;
    `outcome` is "crossed" when the early difference is significantly negative and the late one significantly
    positive (t rule at 95% over seeds), "reversed" for the opposite, otherwise what each window shows."""
    c_max = min(max(float(c.max()) for c, _ in runs.values()) for runs in (ref, var))
    early = paired_window(ref, var, lo=1e-12, hi=fraction * c_max)
    late = paired_window(ref, var, lo=(1.0 - fraction) * c_max, hi=c_max)
    e, l_ = early.paired.outcome, late.paired.outcome
    if e == REFERENCE_BETTER and l_ == VARIANT_BETTER:
        outcome = "crossed"
    elif e == VARIANT_BETTER and l_ == REFERENCE_BETTER:
        outcome = "reversed"
    else:
        outcome = f"early: {e}; late: {l_}"
    return {"early": early, "late": late, "outcome": outcome}
