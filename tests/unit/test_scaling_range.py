"""`scalerl-fit` refuses what cannot be a pass rate and fits a declared range on its own scale; the forecast is
always inside its band (a property test over generated curves: no traceback, band contains centre, centre monotone
in compute)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl_mega.scaling.band import forecast_band
from scalerl_mega.scaling.cli import main
from scalerl_mega.scaling.fit import FitOptions
from scalerl_mega.scaling.identify import options_for


def eq1(c, A, B, C_mid, r0):
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, r0 + (A - r0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), r0)


def write_csv(path: Path, c, r) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["compute", "reward"])
        w.writerows(zip(c.tolist(), r.tolist()))
    return path


def pass_rates(seed: int = 0):
    c = np.linspace(0.0, 100.0, 41)
    return c, np.random.default_rng(seed).binomial(800, eq1(c, 0.7, 2.0, 30.0, 0.2)) / 800


def test_a_reward_outside_0_1_is_refused_naming_file_line_and_value(tmp_path, capsys):
    c, r = pass_rates()
    r[5], r[9] = 1.5, -0.25
    path = write_csv(tmp_path / "run.csv", c, r)
    assert main([str(path), "--x", "compute", "--y", "reward"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # row k of the curve is line k + 2 of the CSV (the header is line 1): the first bad one is row 5, line 7
    assert err == [f"scalerl-fit: error: {path}:7: reward = 1.5 is outside [0, 1] (a pass rate is in [0, 1]; "
                   "declare another metric's range with --y-range LO HI; 2 of 41 points outside)"]


def test_a_bad_run_among_good_ones_is_named_and_the_others_are_fitted(tmp_path, capsys):
    c, r = pass_rates()
    good = write_csv(tmp_path / "good.csv", c, r)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    with (bad_dir / "metrics.jsonl").open("w") as fh:
        for k, (ck, rk) in enumerate(zip(c, r)):
            fh.write(json.dumps({"kind": "validation", "step": k, "compute_device_hours": ck,
                                 "val_pass_rate": 1.0 + rk if k == 3 else rk}) + "\n")
    assert main([str(good), str(bad_dir), "--x", "compute_device_hours", "--json"]) == 2  # good.csv lacks that x
    assert main([str(bad_dir / "metrics.jsonl"), "--x", "compute_device_hours"]) == 2
    assert f"{bad_dir / 'metrics.jsonl'}:4: val_pass_rate = {1.0 + r[3]:g} is outside [0, 1]" in capsys.readouterr().err


def test_a_declared_range_is_fitted_on_its_own_scale_and_reported_in_its_units(tmp_path, capsys):
    """A metric in [-1, 1] that is 2 p - 1 of a pass rate p: under --y-range -1 1 every reward-valued figure is
    2 v - 1 of the pass rate's figure v, errors are 2 x, B and C_mid are the same."""
    c, p = pass_rates()
    args = ["--x", "compute", "--y", "reward", "--json", "--forecast-at", "150", "300"]
    assert main([str(write_csv(tmp_path / "p.csv", c, p)), *args]) == 0
    ref = json.loads(capsys.readouterr().out)["runs"][0]
    assert main([str(write_csv(tmp_path / "m.csv", c, 2 * p - 1)), *args]) == 2  # not a pass rate: refused
    capsys.readouterr()
    assert main([str(tmp_path / "m.csv"), *args, "--y-range", "-1", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = out["runs"][0]
    assert out["y_range"] == [-1.0, 1.0]
    assert got["R0"] == pytest.approx(2 * ref["R0"] - 1) and got["R0"] == pytest.approx(2 * p[0] - 1)
    assert got["A_interval"] == pytest.approx([2 * v - 1 for v in ref["A_interval"]])
    assert (got["B"], got["C_mid"]) == pytest.approx((ref["B"], ref["C_mid"]))
    for g, f in zip(got["forecast"], ref["forecast"], strict=True):
        assert [g[k] for k in ("reward", "lo", "hi")] == pytest.approx([2 * f[k] - 1 for k in ("reward", "lo", "hi")])
        assert g["lo"] <= g["reward"] <= g["hi"]
    assert got["holdout"]["later"]["mae"] == pytest.approx(2 * ref["holdout"]["later"]["mae"])
    assert got["holdout"]["later"]["ratio"] == pytest.approx(ref["holdout"]["later"]["ratio"])
    assert main([str(tmp_path / "m.csv"), "--x", "compute", "--y", "reward", "--y-range", "-0.5", "1"]) == 2
    assert "reward = -0.6" in capsys.readouterr().err  # outside the declared range: refused too


@pytest.mark.parametrize("lo_hi", [("1", "0"), ("0", "0"), ("0", "inf")])
def test_a_range_that_is_not_one_is_refused(tmp_path, capsys, lo_hi):
    c, p = pass_rates()
    assert main([str(write_csv(tmp_path / "p.csv", c, p)), "--x", "compute", "--y", "reward",
                 "--y-range", *lo_hi]) == 2
    assert "--y-range needs two finite numbers LO < HI" in capsys.readouterr().err


def test_the_forecast_is_inside_its_band_even_for_a_curve_outside_0_1():
    """The library function, fed a fit whose curve leaves [0, 1] (what the CLI now refuses): the band is clipped
    to [0, 1] but still contains the forecast (the case of a forecast -0.31 with band 0.00..0.00)."""
    c = np.linspace(0.0, 100.0, 21)
    r = eq1(c, 0.6, 2.0, 30.0, 0.1) - 0.5
    fit = options_for(c, grid="relative", base=FitOptions(method="fast", r0=-0.4)).fit(c, r)
    band = forecast_band(c, r, fit=fit, at=[1.0, 150.0, 400.0])
    assert band.reward[0] < 0.0  # near R0 = -0.4: below the clipped band of the old code (0.00..0.00)
    assert np.all(band.lo <= band.reward) and np.all(band.reward <= band.hi)


curves = st.fixed_dictionaries({
    "A": st.floats(0.05, 1.0), "R0": st.floats(0.0, 0.6), "B": st.floats(0.3, 5.0), "cm": st.floats(5.0, 500.0),
    "n": st.integers(6, 40), "N": st.sampled_from([50, 400, 5000]), "seed": st.integers(0, 2 ** 16),
    "end": st.floats(0.2, 20.0),
})


def simulate(g):
    c = np.linspace(0.0, g["end"] * g["cm"], g["n"])
    truth = np.clip(eq1(c, g["A"], g["B"], g["cm"], g["R0"]), 0.0, 1.0)
    return c, np.random.default_rng(g["seed"]).binomial(g["N"], truth) / g["N"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(curves)
def test_property_band_contains_its_centre_and_the_centre_is_monotone(g):
    """Any binomial curve of Eq. 1 (any A above or below R0, any knee, 6-40 points): the band at later computes
    lies in [0, 1], contains the forecast, and the forecast moves one way with compute (Eq. 1 is monotone)."""
    c, r = simulate(g)
    fit = options_for(c, grid="relative", base=FitOptions(method="fast")).fit(c, r)
    at = np.geomspace(c.max() * 0.5, c.max() * 8.0, 12)
    try:
        band = forecast_band(c, r, fit=fit, at=at, n_samples=g["N"])
    except ValueError as e:  # too few points after the cut: a plain reason, never another exception
        assert "a band needs >= 4" in str(e)
        return
    assert np.all((0.0 <= band.lo) & (band.lo <= band.reward) & (band.reward <= band.hi) & (band.hi <= 1.0))
    d = np.diff(band.reward)
    assert np.all(d >= -1e-12) or np.all(d <= 1e-12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(curves, st.booleans())
def test_property_the_cli_answers_every_curve_without_a_traceback(tmp_path, capsys, g, spoil):
    """`scalerl-fit` on any generated curve (some with a value pushed outside [0, 1]) returns 0 with forecast rows
    inside their bands, or 2 with one `scalerl-fit: error:` line; it never raises."""
    c, r = simulate(g)
    if spoil:
        r[len(r) // 2] = 1.0 + 0.5 * r[len(r) // 2] + 0.01
    path = write_csv(tmp_path / f"g{g['seed']}.csv", c, r)
    rc = main([str(path), "--x", "compute", "--y", "reward", "--json", "--val-samples", str(g["N"])])
    out, err = capsys.readouterr()
    if spoil:
        assert rc == 2 and err.count("\n") == 1 and "is outside [0, 1]" in err
        return
    if rc == 2:
        assert err.startswith("scalerl-fit: error: ") and err.count("\n") == 1
        return
    assert rc == 0
    rows = json.loads(out)["runs"][0].get("forecast", [])
    assert all(f["lo"] <= f["reward"] <= f["hi"] and 0.0 <= f["lo"] and f["hi"] <= 1.0 for f in rows)
