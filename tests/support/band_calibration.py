"""Simulated runs for calibrating `scaling/band.py` out of sample: five families of runs, each fitted
on its first half (relative grid, the cut at 0.1), its band read at every later point (the last at twice the fitted
compute), and coverage of the true expected reward counted pointwise and per run (the whole later curve inside).

Families: `paper` (the paper's scale and shape, binomial noise, 16,000 samples a point), `toy` (the predictability
design's shape, 1,600 samples), `creep` (toy plus a slow rise of 0.012 per doubling after the knee: Eq. 1 is wrong),
and two whose noise is NOT the binomial model the band assumes: `overdispersed` (beta-binomial: each point's pass
rate is itself drawn around the curve, 2.5x the binomial variance, as a policy that moves between validations) and
`drift` (an AR(1) wander of the policy on the logit scale, rho 0.9, SD 0.06: errors correlated over many points).

`choose_constants` picks `band.KAPPA_Z`, `band.KAPPA_FLOOR` and `band.FLOOR_SE` on the design seeds; `coverage` and
`table` give the numbers on the check seeds, never used for any choice; `real_run` reads a committed run for the same
check on real data. `python -m tests.support.band_calibration` prints the docs' table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalerl_mega.scaling.band import Band, forecast_band
from scalerl_mega.scaling.fit import FitOptions
from scalerl_mega.scaling.identify import options_for

DESIGN_SEEDS = tuple(range(16)) + tuple(range(1000, 1032))
"""Seeds on which the band's constants are chosen: 0-15, and 1000-1031, on which an earlier design choice (the
design target) was made; both are design seeds now."""
CHECK_SEEDS = tuple(range(2000, 2032)) + tuple(range(3000, 3032))
"""Seeds on which coverage and width are reported, never used for any choice."""
TARGET = 0.95
"""The band's nominal pointwise coverage."""
DESIGN_TARGET = 0.97
"""Pointwise coverage demanded of every family of `CHOSEN_ON` on the design seeds: two points above TARGET, the
drop from design to fresh seeds seen before (the late creep: 0.96 on seeds 0-15, 0.942 on 1000-1031)."""
CHOSEN_ON = ("paper", "toy", "creep", "overdispersed")
"""The families the constants are chosen on and held to TARGET. `drift` is reported, not held: its errors are
correlated over many points, which the band's noise model (independent points) cannot see."""
Z_GRID = tuple(np.round(np.arange(0.0, 3.01, 0.25), 2))
"""Candidate values of `band.KAPPA_Z` (standard errors above the estimate of kappa^2)."""
FLOOR_GRID = (0.0, 0.005, 0.01, 0.015, 0.02, 0.0275)
"""Candidate values of `band.KAPPA_FLOOR` (the noise-free floor)."""
FLOOR_SE_GRID = tuple(np.round(np.arange(0.0, 4.01, 0.25), 2))
"""Candidate values of `band.FLOOR_SE` (the floor in units of a point's noise SD at the fit's end)."""


def eq1(c, A, B, Cm, R0):
    """Eq. 1 (paper Sec. 2.1) written out here; C = 0 gives R0."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, R0 + (A - R0) / (1.0 + (Cm / np.where(c > 0, c, 1.0)) ** B), R0)


def _toy(c):
    return eq1(c, 0.675, 1.7, 48.7, 0.054)


FAMILIES = {
    "paper": (np.linspace(0.0, 16000.0, 161), 16000, lambda c: eq1(c, 0.61, 1.92, 2542.0, 0.30)),
    "toy": (np.linspace(0.0, 1636.0, 321), 1600, _toy),
    "creep": (np.linspace(0.0, 1636.0, 321), 1600,
              lambda c: eq1(c, 0.665, 1.7, 48.7, 0.054) + 0.012 * np.log2(np.maximum(c, 1.0) / 400.0) * (c > 400)),
    "overdispersed": (np.linspace(0.0, 1636.0, 321), 1600, _toy),
    "drift": (np.linspace(0.0, 1636.0, 321), 1600, _toy),
}
"""(compute points, samples per point, expected reward) per family."""
OVERDISPERSION = 2.5
"""Variance of an `overdispersed` point over the binomial variance (beta-binomial)."""
DRIFT_RHO, DRIFT_SD = 0.9, 0.06
"""`drift`: AR(1) correlation between consecutive points and marginal SD, on the logit of the pass rate."""


def simulate(family: str, seed: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """(compute, observed pass rates, samples per point, true expected reward) of one simulated run."""
    c, n, truth_of = FAMILIES[family]
    truth = np.clip(truth_of(c), 0.0, 1.0)
    rng = np.random.default_rng(seed)
    p = truth
    if family == "overdispersed":  # Beta(p phi, (1 - p) phi): variance inflation 1 + (n - 1) / (phi + 1)
        phi = (n - 1) / (OVERDISPERSION - 1.0) - 1.0
        p = rng.beta(np.maximum(truth * phi, 1e-9), np.maximum((1.0 - truth) * phi, 1e-9))
    elif family == "drift":
        e = np.empty(c.size)
        e[0] = rng.normal(0.0, DRIFT_SD)
        for k in range(1, c.size):
            e[k] = DRIFT_RHO * e[k - 1] + rng.normal(0.0, DRIFT_SD * np.sqrt(1.0 - DRIFT_RHO ** 2))
        q = np.clip(truth, 1e-6, 1 - 1e-6)
        p = 1.0 / (1.0 + np.exp(-(np.log(q / (1 - q)) + e)))
    return c, rng.binomial(n, p) / n, n, truth


@dataclass(frozen=True)
class Run:
    band: Band
    truth: np.ndarray
    """The true expected reward at `band.compute` (the later points)."""


def half_fit_band(family: str, seed: int) -> Run:
    """Fit the first half (relative grid, cut at 0.1 of it), band at every later point."""
    c, r, n, truth = simulate(family, seed)
    first = c <= 0.5 * float(c.max())
    fit = options_for(c[first], grid="relative", base=FitOptions(method="fast")).fit(c[first], r[first])
    band = forecast_band(c[first], r[first], fit=fit, at=c[~first], n_samples=n)
    return Run(band=band, truth=truth[~first])


@dataclass(frozen=True, kw_only=True)
class Coverage:
    pointwise: float
    runs_inside: int
    """Runs whose whole later curve is inside the band."""
    runs: int
    median_half_width_2x: float
    block_half_widths: tuple[float, ...]
    """The median half-width at 2x in each block of `block` consecutive seeds."""

    @property
    def whole_curve(self) -> float:
        """Share of runs whose whole later curve is inside the band."""
        return self.runs_inside / self.runs


Constants = tuple[float, float, float]
"""(KAPPA_Z, KAPPA_FLOOR, FLOOR_SE)."""


def coverage(runs: list[Run], *, constants: Constants | None = None, block: int = 8) -> Coverage:
    """Coverage of the truths by the runs' bands (at band.py's constants, or at `constants`)."""
    inside, total, whole, widths = 0, 0, 0, []
    for run in runs:
        b = run.band if constants is None else run.band.with_kappa(z=constants[0], floor=constants[1],
                                                                   floor_se=constants[2])
        ok = (run.truth >= b.lo) & (run.truth <= b.hi)
        inside, total, whole = inside + int(ok.sum()), total + ok.size, whole + int(ok.all())
        widths.append(float(b.half_width()[-1]))
    blocks = tuple(float(np.median(widths[k:k + block])) for k in range(0, len(widths), block))
    return Coverage(pointwise=inside / total, runs_inside=whole, runs=len(runs),
                    median_half_width_2x=float(np.median(widths)), block_half_widths=blocks)


def choose_constants(design: dict[str, list[Run]]) -> Constants:
    """(KAPPA_Z, KAPPA_FLOOR, FLOOR_SE): among the triples on `Z_GRID` x `FLOOR_GRID` x `FLOOR_SE_GRID` at which
    every family of `CHOSEN_ON` covers >= DESIGN_TARGET of its later points on the design runs, the one with the
    least mean median half-width at 2x (ties: the smaller z, floor, floor_se); the widest when none qualifies."""
    best = None
    for z in Z_GRID:
        for floor in FLOOR_GRID:
            for floor_se in FLOOR_SE_GRID:
                k = (float(z), float(floor), float(floor_se))
                cvs = [coverage(design[f], constants=k) for f in CHOSEN_ON]
                if all(cv.pointwise >= DESIGN_TARGET for cv in cvs):
                    key = (float(np.mean([cv.median_half_width_2x for cv in cvs])), *k)
                    best = key if best is None or key < best else best
    widest = (float(Z_GRID[-1]), float(FLOOR_GRID[-1]), float(FLOOR_SE_GRID[-1]))
    return widest if best is None else best[1:]


def table(rows: dict[str, Coverage]) -> str:
    """A markdown table of coverage per family."""
    out = ["| family | pointwise | whole later curve inside | median half-width at 2x | across seed blocks of 8 |",
           "|---|---|---|---|---|"]
    for fam, cv in rows.items():
        out.append(f"| {fam} | {cv.pointwise:.3f} | {cv.runs_inside} of {cv.runs} ({cv.whole_curve:.1%}) | "
                   f"{cv.median_half_width_2x:.4f} | "
                   f"{min(cv.block_half_widths):.4f}-{max(cv.block_half_widths):.4f} |")
    return "\n".join(out)


@dataclass(frozen=True, kw_only=True)
class RealRun:
    name: str
    band: Band
    observed: np.ndarray
    """The later observed points (at `band.compute`)."""
    se: np.ndarray
    """Their binomial standard errors."""

    def inside(self, *, constants: Constants | None = None) -> int:
        """Later observed points inside the band (at band.py's constants, or at `constants`) widened by 2 binomial
        SE of each point: the band is on the expected reward, an observation adds its own noise."""
        b = self.band if constants is None else self.band.with_kappa(z=constants[0], floor=constants[1],
                                                                     floor_se=constants[2])
        return int(np.sum((self.observed >= b.lo - 2 * self.se) & (self.observed <= b.hi + 2 * self.se)))


def real_run(path, *, x: str = "sum:samples") -> RealRun:
    """A committed run (e.g. reproduction/loo/runs/<recipe>/seed<k>): first half fitted as `half_fit_band` does,
    its band at every later point."""
    from scalerl_mega.scaling.io import read_series

    s = read_series(path, x=x)
    c, r, n = s.compute, s.reward, s.n_samples
    first = c <= 0.5 * float(c.max())
    fit = options_for(c[first], grid="relative", base=FitOptions(method="fast")).fit(c[first], r[first])
    band = forecast_band(c[first], r[first], fit=fit, at=c[~first], n_samples=n[first])
    later = r[~first]
    return RealRun(name=s.name, band=band, observed=later,
                   se=np.sqrt(np.clip(later * (1 - later), 1e-12, None) / n[~first]))


def main() -> None:  # pragma: no cover - the slow test asserts what this prints
    design = {fam: [half_fit_band(fam, s) for s in DESIGN_SEEDS] for fam in FAMILIES}
    print("chosen on the design seeds:", choose_constants(design))
    print(table({fam: coverage([half_fit_band(fam, s) for s in CHECK_SEEDS]) for fam in FAMILIES}))


if __name__ == "__main__":  # pragma: no cover
    main()
