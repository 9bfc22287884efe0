"""No fit path raises on a curve: `identify.assess` (scalerl-fit, report.md, the sweep report),
the forecast band, the first-half check (`scalerl-fit --holdout`), the live forecast and scalerl-fit's multi-run mode,
over random and adversarial curves drawn by hypothesis (cut early, flat, constant 0 and 1, falling, one jump, very
steep, two points, repeated compute, compute scales 1e-9 to 1e12) on both grids. A curve that cannot be fitted gets a
ValueError (or a row, a line) in plain words; NaN/inf are refused naming the point or the file's line.

Hypothesis runs derandomized (a fixed sequence of examples, no example database) with few examples: the same cases in
every CI run, in seconds."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scalerl_mega.scaling.band import forecast_band
from scalerl_mega.scaling.cli import main
from scalerl_mega.scaling.fit import FitOptions, _refine, fit_sigmoid
from scalerl_mega.scaling.forecast import forecast, plain_line
from scalerl_mega.scaling.holdout import half_fit, score_later
from scalerl_mega.scaling.identify import assess, options_for
from tests.support.band_calibration import eq1

FEW = settings(derandomize=True, database=None, deadline=None, max_examples=10,
               suppress_health_check=list(HealthCheck))
FEWER = settings(FEW, max_examples=5)
"""The paths that fit each curve twice or more (the first-half check, the live forecast's band)."""

KINDS = ("sigmoid", "cut_early", "flat", "zeros", "ones", "falling", "jump", "steep", "two_points", "repeated")
SCALES = (1e-9, 1.0, 1e4, 1e12)
INTERNALS = re.compile(r"zero-size|identity|math range|division|Traceback|numpy|overflow", re.IGNORECASE)
"""Words of Python's and numpy's own errors: a message for a user names the curve's problem instead."""


def make_curve(kind: str, *, n: int, scale: float, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """One curve of `kind` on compute 0..scale (`n` points) with Gaussian noise of SD `noise` (clipped to [0, 1])."""
    rng = np.random.default_rng(seed)
    u = np.linspace(0.0, 1.0, n)
    if kind == "repeated":  # every compute value three times (several evaluations at one step)
        u = np.repeat(np.linspace(0.0, 1.0, max(2, math.ceil(n / 3))), 3)[:n]
    A, R0 = 0.3 + 0.6 * rng.random(), 0.3 * rng.random()
    truth = {
        "sigmoid": lambda: eq1(u, A, 0.5 + 3 * rng.random(), 0.05 + 0.5 * rng.random(), R0),
        "cut_early": lambda: eq1(u, A, 1.0 + 2 * rng.random(), 5.0 + 50 * rng.random(), R0),  # C_mid far beyond
        "flat": lambda: np.full(u.size, R0 + 0.2),
        "zeros": lambda: np.zeros(u.size),
        "ones": lambda: np.ones(u.size),
        "falling": lambda: A - 0.3 * u,
        "jump": lambda: np.where(u > 0.2 + 0.6 * rng.random(), A, R0),
        "steep": lambda: eq1(u, A, 30.0 + 70 * rng.random(), 0.2 + 0.6 * rng.random(), R0),
        "two_points": lambda: np.array([R0, A])[: u.size],
    }.get(kind, lambda: eq1(u, A, 2.0, 0.3, R0))
    with np.errstate(over="ignore"):
        truth = truth()
    r = truth if kind in ("zeros", "ones") else np.clip(truth + rng.normal(0.0, noise, u.size), 0.0, 1.0)
    return u * scale, r


@st.composite
def curves(draw, kinds=KINDS):
    kind = draw(st.sampled_from(kinds))
    n = 2 if kind == "two_points" else draw(st.integers(4, 30))
    c, r = make_curve(kind, n=n, scale=draw(st.sampled_from(SCALES)), seed=draw(st.integers(0, 2 ** 16)),
                      noise=draw(st.sampled_from((0.0, 0.01, 0.05))))
    return kind, c, r


def plain(e: Exception) -> bool:
    return isinstance(e, ValueError) and str(e) != "" and not INTERNALS.search(str(e))


def checked_assess(c, r, *, grid: str, n_samples):
    """`identify.assess` as scalerl-fit calls it; None (after checking the message) when the curve cannot be fitted."""
    try:
        return assess(c, r, options=options_for(c, grid=grid, base=FitOptions(method="fast")), n_samples=n_samples)
    except ValueError as e:
        assert plain(e), str(e)
        return None


@FEW
@given(curve=curves(), grid=st.sampled_from(("relative", "paper")), n_samples=st.sampled_from((None, 64, 16000)))
def test_assess_and_the_band_never_raise(curve, grid, n_samples):
    kind, c, r = curve
    a = checked_assess(c, r, grid=grid, n_samples=n_samples)
    if a is None:
        return
    f = a.fit
    assert all(math.isfinite(v) for v in (f.A, f.B, f.C_mid, f.R0, *a.A_interval)), (kind, f)
    assert a.A_interval[0] <= a.A_interval[1] and (a.identified or a.reason)
    try:
        band = forecast_band(c, r, fit=f, at=[c.max(), 2.0 * c.max()], n_samples=n_samples)
    except ValueError as e:
        assert plain(e) and "a band needs >= 4" in str(e), str(e)
        return
    assert np.all(np.isfinite(band.lo)) and np.all(np.isfinite(band.hi)) and math.isfinite(band.kappa)
    assert np.all((0.0 <= band.lo) & (band.lo <= band.hi) & (band.hi <= 1.0)), (kind, band)


ZEROS = ("zeros", *make_curve("zeros", n=41, scale=10.0, seed=0, noise=0.0))
CUT_EARLY = ("cut_early", *make_curve("cut_early", n=21, scale=5.0, seed=3, noise=0.01))


@FEWER
@given(curve=curves(), grid=st.sampled_from(("relative", "paper")), n_samples=st.sampled_from((None, 256)))
@example(curve=ZEROS, grid="relative", n_samples=None)  # was ZeroDivisionError: a zero noise floor
@example(curve=CUT_EARLY, grid="relative", n_samples=None)
def test_the_first_half_check_never_raises(curve, grid, n_samples):
    """What `scalerl-fit --holdout 0.5` runs (the path of the reported OverflowError: a run cut before its
    midpoint, refitted continuously on the relative grid)."""
    kind, c, r = curve
    whole = checked_assess(c, r, grid=grid, n_samples=n_samples)
    if whole is None:
        return
    noise_std = None if n_samples is not None else math.sqrt(whole.fit.sse / max(whole.fit.n_points - 3, 1))
    try:
        h = half_fit(c, r, n_samples, half_compute=0.5 * float(c.max()), noise_std=noise_std, grid=grid)
    except ValueError as e:
        assert plain(e), str(e)
        return
    later = score_later(c, r, n_samples, half=h, noise_std=noise_std)
    assert later is None or (later["ratio"] >= 0 and not math.isnan(later["ratio"])), (kind, later)
    assert h.ratio is None or (h.ratio >= 0 and not math.isnan(h.ratio))


@FEWER
@given(curve=curves(), gpu_hours=st.booleans())
def test_the_live_forecast_never_raises(curve, gpu_hours):
    kind, c, r = curve
    fc = forecast(c, r, budget=2.0 * float(c.max()) or 1.0, gpu_hours=gpu_hours, n_samples=128)
    line = plain_line(fc, unit="GPU-hours")
    assert line.startswith("forecast: ")
    if not fc.ok:
        assert fc.reason and not INTERNALS.search(fc.reason), fc.reason


def test_a_run_cut_long_before_its_midpoint_refits_without_overflow():
    """The continuous refit of a curve that has not started to bend (C_mid far beyond the data, or a flat curve at
    R0) keeps C_mid finite: the refit's log C_mid stays within e^40 of the data (fit.LOG_CMID_REACH)."""
    c = np.linspace(1.0, 10.0, 12)
    for r in (np.full(12, 0.2), 0.2 + 1e-4 * c, 0.2 - 1e-3 * c):
        A, B, cm, sse = _refine(c, r, 0.2, A0=0.5, B0=1.0, cm0=1e6, fixed_A=None)
        assert math.isfinite(cm) and cm <= 10.0 * math.exp(40.0) * (1 + 1e-9) and sse >= 0
        fit = fit_sigmoid(c, r, r0=0.2, fit_from=None, method="fast", refine=True,
                          cmid_grid=np.geomspace(0.1, 1000.0, 50))
        assert math.isfinite(fit.refined.C_mid) and not fit.identified


def test_a_constant_curve_scores_its_forecast_without_dividing_by_zero():
    """All 0 (or all 1) with the sample count unknown: the residual SD is 0, so the noise floor is 0; a perfect
    forecast scores 0x the floor instead of raising ZeroDivisionError."""
    c = np.linspace(0.0, 10.0, 41)
    for level in (0.0, 1.0):
        r = np.full(41, level)
        h = half_fit(c, r, None, noise_std=0.0)
        later = score_later(c, r, None, half=h, noise_std=0.0)
        assert h.noise_floor == 0.0 and later["mae"] == 0.0 and later["ratio"] == 0.0


# --------------------------------------------------------------------------------------------------------------
# scalerl-fit: one bad run does not take the others down; NaN/inf named by file and line


def write_csv(path, c, r) -> str:
    lines = ["compute_device_hours,val_pass_rate"] + [f"{float(x)!r},{float(y)!r}" for x, y in zip(c, r)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


GOOD = make_curve("sigmoid", n=30, scale=10.0, seed=1, noise=0.005)


@settings(derandomize=True, database=None, deadline=None, max_examples=4, suppress_health_check=list(HealthCheck))
@given(curve=curves(kinds=("zeros", "jump", "steep", "two_points", "cut_early", "falling")))
def test_multi_run_mode_keeps_every_run_that_fits(tmp_path_factory, capsys, curve):
    kind, c, r = curve
    d = tmp_path_factory.mktemp("multi")
    good, bad = write_csv(d / "good.csv", *GOOD), write_csv(d / "bad.csv", c, r)
    assert main([good, bad, "--x", "compute_device_hours", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"][0]["run"] == "good" and out["runs"][0]["n_points"] > 0
    names = [row["run"] for row in out["runs"]] + [row["run"] for row in out["not_fitted"]]
    assert sorted(names) == ["bad", "good"]
    for row in out["not_fitted"]:
        assert row["source"] == bad and row["error"].startswith(bad) and not INTERNALS.search(row["error"])


def test_multi_run_table_says_why_a_run_was_not_fitted_and_no_fit_at_all_exits_2(tmp_path, capsys):
    good = write_csv(tmp_path / "good.csv", *GOOD)
    two = write_csv(tmp_path / "two.csv", [0.0, 1.0], [0.1, 0.2])
    nan = tmp_path / "nan.csv"
    nan.write_text("compute_device_hours,val_pass_rate\n0,0.1\n1,0.2\n2,nan\n3,0.4\n")
    assert main([good, two, str(nan), "--x", "compute_device_hours"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"two: not fitted: .*two\.csv: fit window .* holds 1 point", out), out
    assert re.search(r"nan: not fitted: .*nan\.csv:4: val_pass_rate is nan \(NaN/inf values cannot be fitted\)",
                     out), out
    assert re.search(r"^good\s+\d+", out, re.MULTILINE)
    assert main([two, str(nan), "--x", "compute_device_hours"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("scalerl-fit: error: none of the 2 runs could be fitted")
    assert "two.csv: fit window" in err and "nan.csv:4:" in err


@FEW
@given(n=st.integers(4, 30), where=st.data(), bad=st.sampled_from((math.nan, math.inf, -math.inf)),
       column=st.sampled_from(("compute", "reward")))
@example(n=4, where=None, bad=math.nan, column="reward")
def test_nan_and_inf_are_refused_naming_the_point(n, where, bad, column):
    c, r = make_curve("sigmoid", n=n, scale=5.0, seed=n, noise=0.01)
    i = n - 1 if where is None else where.draw(st.integers(0, n - 1))
    (c if column == "compute" else r)[i] = bad
    with pytest.raises(ValueError, match=rf"^{column}\[{i}\] is {bad} \(not finite\)"):
        assess(c, r, options=FitOptions(fit_from=None, method="fast"))
    fc = forecast(c, r, budget=10.0)
    assert not fc.ok and (f"{column}[{i}]" in fc.reason or "compute" in fc.reason), fc.reason


def test_report_md_and_the_sweep_report_say_why_instead_of_raising(tmp_path):
    """report.md and tools/sweep_report.py on adversarial runs: each gets a fit or a line saying why, never an
    exception, and the sweep keeps the runs that fit."""
    import importlib.util
    import sys
    from pathlib import Path

    from scalerl_mega.metrics.writer import MetricsWriter
    from scalerl_mega.report import write_report

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("sweep_report_robust", root / "tools" / "sweep_report.py")
    sweep_report = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sweep_report
    spec.loader.exec_module(sweep_report)
    kinds = {"good": GOOD, "zeros": make_curve("zeros", n=30, scale=1.0, seed=0, noise=0.0),
             "jump": make_curve("jump", n=30, scale=1.0, seed=2, noise=0.0),
             "two": make_curve("two_points", n=2, scale=1.0, seed=0, noise=0.0)}
    for name, (c, r) in kinds.items():
        with MetricsWriter(tmp_path / "sweep" / name) as w:
            for k, (x, y) in enumerate(zip(c, r)):
                w.write("validation", k, {"val_pass_rate": float(y), "compute_gpu_hours": 0.0,
                                          "compute_device_hours": float(x)})
        md = write_report(tmp_path / "sweep" / name, title=name).read_text()
        fitted = "## Fitted scaling curve" in md
        assert fitted or "No fit:" in md or "Fit failed:" in md, md
        assert not INTERNALS.search(md), md
        assert fitted == (name != "two"), (name, md)
    _, _, points = sweep_report.write_report(tmp_path / "sweep", out_dir=tmp_path / "out", x="compute_device_hours")
    by_name = {p.name: p for p in points}
    assert sorted(by_name) == sorted(kinds)
    assert by_name["good"].assessment is not None and by_name["two"].error.startswith("1 validation point(s)")
    assert all(p.assessment is not None or (p.error and not INTERNALS.search(p.error)) for p in points)
