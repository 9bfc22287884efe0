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

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalerl_mega.reproduce_report import Axis, recipe_name
from scalerl_mega.scaling.identify import Assessment, assess, binomial_noise_floor, options_for, verdict_text
from scalerl_mega.scaling.seeds import REFERENCE_BETTER, VARIANT_BETTER, PairedComparison, compare_paired

FINAL_POINTS = 3
"""Validation points at the end of a run on which the extrapolation is scored."""
REPRO3_RUN_NAMES = ("repro3_scalerl", "repro3_batch_small", "repro3_batch_large", "repro3_batch_control",
                    "repro3_no_npr")
"""Issue 29's sweep (reproduction/design/README.md): reference recipe, batch-size axis with its same-maths control,
No-Positive-Resampling over several passes; the first is the reference recipe."""
REFERENCE = recipe_name(REPRO3_RUN_NAMES[0])
CONTROL = "batch_control"
CONTROLLED_VARIANTS = ("batch_large", "batch_small", "no_npr")
"""The settings also compared with the same-maths control (paired by seed): the batch-size axis and
No-Positive-Resampling off. The control is a rerun of the reference recipe, so an effect that is real shows
against both."""
EXPECTED_SEEDS = (0, 1, 2)
MIN_SEEDS = 2
"""Fewest finished seeds per setting for a verdict (the seed rules need a spread)."""
SAMPLES_AXIS = Axis(key="sum:samples", slug="samples", label="Generated samples trained on (cumulative, thousands)",
                    unit="k samples", scale=1e-3)


@dataclass(frozen=True, kw_only=True)
class Setting:
    title: str
    paper: str


SETTINGS = {
    "scalerl": Setting(title="reference: 32 prompts x 8, 1,600 steps", paper="-"),
    "batch_small": Setting(title="batch 16 prompts x 8, 3,200 steps",
                           paper="smaller batches may look better early but are overtaken (Sec. 5)"),
    "batch_large": Setting(title="batch 64 prompts x 8, 800 steps",
                           paper="larger batches: slower early, higher asymptote A (Sec. 5, batch-size figure)"),
    "batch_control": Setting(title="reference batch in ~8 micro-batches (same maths)",
                             paper="control: no effect expected"),
    "no_npr": Setting(title="No-Positive-Resampling off, ~2.1 passes",
                      paper="LOO variants reach a similar A; ScaleRL the highest B (Sec. 6, Fig. 7)"),
}



def read_run(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(cumulative generated samples, val_pass_rate, samples per point) of each validation line of
    `run_dir/metrics.jsonl` (`scaling.io.read_series` on `SAMPLES_AXIS`'s key, unscaled): a validation at
    step s counts the samples of train steps 1..s."""
    from scalerl_mega.scaling.io import read_series

    s = read_series(run_dir, x=SAMPLES_AXIS.key, y="val_pass_rate")
    return s.compute, s.reward, s.n_samples


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


def read_curve(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`read_run` on the analyses' axis (`SAMPLES_AXIS`: thousands of samples), with the samples per point given
    for every point. ValueError when the validation lines do not record them."""
    c, r, n = read_run(run_dir)
    if n is None:
        raise ValueError(f"{run_dir}: its validation lines do not record val_prompts x val_samples_per_prompt")
    return c * SAMPLES_AXIS.scale, r, np.broadcast_to(np.asarray(n, dtype=np.float64), c.shape).copy()


def first_half_assessment(compute, reward, n_samples, *, half: float) -> Assessment:
    """`identify.assess` of the points at or below `half` on their own (the relative grid): the fit `half_fit`
    extrapolates, and the one a registered forecast records."""
    c = np.asarray(compute, dtype=np.float64)
    first = c <= half
    n = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)
    return assess(c[first], np.asarray(reward, dtype=np.float64)[first], options=options_for(c[first], grid="relative"),
                  n_samples=n[first])


def half_fit(compute, reward, n_samples, *, final_points: int = FINAL_POINTS,
             half_compute: float | None = None) -> HalfFit:
    """Fit on compute <= half the largest compute (or <= `half_compute`: half a run's planned compute, for a run
    stopped before its end), predict the last `final_points` points (module docstring)."""
    c, r = np.asarray(compute, dtype=np.float64), np.asarray(reward, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), c.shape)
    half = 0.5 * float(c.max()) if half_compute is None else float(half_compute)
    first = c <= half
    if int(first.sum()) >= c.size - final_points + 1:
        raise ValueError(f"the first half ({int(first.sum())} points) overlaps the last {final_points} points")
    a = first_half_assessment(c, r, n, half=half)
    fc, fr, fn = c[-final_points:], r[-final_points:], n[-final_points:]
    pred = a.predict(fc)
    p = pred if pred is not None else fr
    floor = binomial_noise_floor(p, fn)
    mae = None if pred is None else float(np.mean(np.abs(pred - fr)))
    unvetted = float(np.mean(np.abs(a.fit.predict(fc) - fr)))
    return HalfFit(unvetted_mae=unvetted, identified=a.identified, assessment=a, verdict=verdict_text(a),
                   half_compute=half,
                   final_compute=tuple(fc.tolist()), observed=tuple(fr.tolist()),
                   predicted=None if pred is None else tuple(pred.tolist()), mae=mae, noise_floor=floor,
                   ratio=None if mae is None else mae / floor)


@dataclass(frozen=True, kw_only=True)
class WindowDifference:
    """Variant minus reference, paired by seed, averaged over the validation points in a compute window."""

    window: tuple[float, float]
    """[lo, hi] of compute (inclusive)."""
    points: int
    """Validation points in the window (per seed)."""
    paired: PairedComparison


def paired_window(ref: dict[int, tuple[np.ndarray, np.ndarray]], var: dict[int, tuple[np.ndarray, np.ndarray]], *,
                  lo: float, hi: float) -> WindowDifference:
    """Per seed, the mean over the window's validation points of var - ref at the same compute (points
    present in both runs of that seed), then `seeds.compare_paired` over the seeds (t rule at 95%)."""
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
    return WindowDifference(window=(lo, hi), points=min(counts) if counts else 0,
                            paired=compare_paired(ref_w, var_w))


def crossing(ref: dict[int, tuple[np.ndarray, np.ndarray]], var: dict[int, tuple[np.ndarray, np.ndarray]], *,
             fraction: float = 0.25) -> dict[str, WindowDifference | str]:
    """Paper Sec. 5 ("Global batch size"): a larger batch is worse early and better late. The paired
    difference var - ref over the first `fraction` of the common compute (after step 0) and over the last
    `fraction`; `outcome` is "crossed" when the early difference is significantly negative and the late one
    significantly positive (t rule at 95% over seeds), "reversed" for the opposite, otherwise a description
    of what each window shows."""
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


def overdispersion(fit, compute, n_samples) -> dict[str, float]:
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


def irregular_points(steps, n_samples, *, every: int, last_step: int) -> list[str]:
    """What a run's validation points lack or mix against its schedule (a point every `every` steps from 0 to
    `last_step`, each of the run's usual sample count, the median of `n_samples`): the steps without a point
    and the points with another number of samples (a window that lost slices, or one that took in another's).
    Empty for a regular run."""
    got = [int(s) for s in steps]
    missing = sorted(set(range(0, int(last_step) + 1, int(every))) - set(got))
    notes = [f"no point at step {s}" for s in missing]
    if n_samples is not None and len(n_samples):
        usual = float(np.median(np.asarray(n_samples, dtype=np.float64)))
        notes += [f"step {s}: {n:g} samples (usual {usual:g})" for s, n in zip(got, n_samples) if float(n) != usual]
    return notes
