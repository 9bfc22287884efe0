"""`scalerl-fit` names runs by run name and seed (distinct), refuses `--same-config` on one run before any work,
never prints A for a run where it is not identified, and says "no rise" of a flat curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import scalerl_mega.scaling.identify as identify
from scalerl_mega.scaling.cli import main


def eq1(c, A, B, C_mid, r0):
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, r0 + (A - r0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), r0)


def write_run(d: Path, r, *, run_name: str | None = None, seed: int = 0, n_samples: int = 800) -> Path:
    """A run folder as scalerl-train writes it: metrics.jsonl (CPU: device-hours) and, when named, run_config.yaml."""
    d.mkdir(parents=True, exist_ok=True)
    c = np.linspace(0.0, 1.0, r.size)
    with (d / "metrics.jsonl").open("w") as fh:
        for k, (ck, rk) in enumerate(zip(c, r)):
            fh.write(json.dumps({"kind": "validation", "step": k, "compute_gpu_hours": 0.0,
                                 "compute_device_hours": float(ck), "val_pass_rate": float(rk),
                                 "val_prompts": n_samples / 4, "val_samples_per_prompt": 4.0}) + "\n")
    if run_name is not None:
        (d / "run_config.yaml").write_text(f"run_name: {run_name}\nseed: {seed}\noutput_dir: {d}\n")
    return d


def rising(seed: int, n: int = 21):
    c = np.linspace(0.0, 1.0, n)
    return np.random.default_rng(seed).binomial(800, eq1(c, 0.7, 2.0, 0.3, 0.2)) / 800


def test_runs_are_labelled_by_run_name_and_seed_and_two_seed0_folders_differ(tmp_path, capsys):
    a = write_run(tmp_path / "a" / "seed0", rising(1))  # no run_config: parent/seed folder
    b = write_run(tmp_path / "b" / "seed0", rising(2))
    named = write_run(tmp_path / "out1", rising(3), run_name="demo", seed=3)
    twin = write_run(tmp_path / "out2", rising(4), run_name="demo", seed=3)
    assert main([str(a), str(b), str(named / "metrics.jsonl"), str(twin), "--holdout", "0", "--json"]) == 0
    names = [r["run"] for r in json.loads(capsys.readouterr().out)["runs"]]
    assert names == ["a/seed0", "b/seed0", f"demo/seed3 ({named})", f"demo/seed3 ({twin})"]
    assert main([str(a), str(b), "--holdout", "0", "--plot-dir", str(tmp_path / "plots")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert any(line.startswith("a/seed0 ") for line in table) and any(line.startswith("b/seed0 ") for line in table)


def test_same_config_refuses_one_run_before_reading_or_fitting_it(tmp_path, capsys, monkeypatch):
    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before refusing")

    monkeypatch.setattr(identify, "assess", no_fit)
    monkeypatch.setattr("scalerl_mega.scaling.cli.assess", no_fit)
    missing = tmp_path / "not_there"  # not even read: the refusal comes from the command line alone
    assert main([str(missing), "--same-config"]) == 2
    assert capsys.readouterr().err.strip() == (f"scalerl-fit: error: --same-config compares seeds of one config: it "
                                               f"needs at least 2 runs, got 1 ({missing})")


def test_per_seed_A_is_printed_only_where_identified(tmp_path, capsys):
    """Two seeds: one long enough to identify A (161 points of 16,000 samples to 5 x C_mid), one cut before its
    knee (A not identified): the seed line gives a number for the first only and no half-range."""
    c = np.linspace(0.0, 1.0, 161)
    good = np.random.default_rng(5).binomial(16000, eq1(c, 0.61, 1.92, 0.2, 0.3)) / 16000
    short = np.random.default_rng(6).binomial(800, eq1(np.linspace(0, 1, 21), 0.61, 1.92, 3.0, 0.3)) / 800
    g = write_run(tmp_path / "r" / "seed0", good, n_samples=16000)
    s = write_run(tmp_path / "r" / "seed1", short)
    assert main([str(g), str(s), "--same-config", "--bootstrap", "4", "--holdout", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ident = [r["identified"] for r in data["runs"]]
    assert ident == [True, False]
    assert data["seeds"]["per_seed_A"] == [data["runs"][0]["A"], None] and data["runs"][0]["A"] is not None
    assert data["seeds"]["half_range_A"] is None
    assert main([str(g), str(s), "--same-config", "--bootstrap", "4", "--holdout", "0"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("seeds of one config"))
    assert (f"A per seed: r/seed0 {data['runs'][0]['A']:.3f}, r/seed1 not identified; no half-range: A identified "
            "for 1 of 2 runs (needs 2)") in line


def test_a_flat_curve_gets_the_plain_reason_no_rise(tmp_path, capsys):
    """A pass rate constant at 0.5 (800 samples a point, binomial noise only): "no rise", not where the data stop
    relative to a C_mid or a gain the curve never showed. A rising curve of the same noise does not get it."""
    flat = np.random.default_rng(1).binomial(800, 0.5, 21) / 800
    assert main([str(write_run(tmp_path / "flat", flat)), "--holdout", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    mean, sd = float(flat.mean()), float(flat.std())
    assert row["reason"].startswith(f"no rise: reward constant within noise (21 points at {mean:.3f} +- {sd:.3f}, "
                                    "as 800 samples a point give)")
    assert "of the fitted gain" not in row["reason"] and "C_mid" not in row["reason"]
    assert main([str(write_run(tmp_path / "up", rising(1))), "--holdout", "0", "--json"]) == 0
    assert "no rise" not in json.loads(capsys.readouterr().out)["runs"][0]["reason"]


def test_no_rise_is_a_chi_square_test_of_the_constant():
    """By hand: 4 points 0.50, 0.52, 0.48, 0.50 of N = 400: chi2 = sum (r - 0.5)^2 / (0.25 / 400) = 1.28 < 7.81
    (chi2_0.95 with 3 df): flat. The same with 0.40, 0.60, 0.40, 0.60 (chi2 = 64): not flat."""
    from scalerl_mega.scaling.fit import FitOptions
    from scalerl_mega.scaling.identify import options_for

    c = np.array([0.0, 1.0, 2.0, 3.0])
    x = np.linspace(0, 3, 8)  # any fit without fit_to: no_rise reads only its range
    fit = options_for(x, grid="relative", base=FitOptions(method="fast")).fit(x, eq1(x, 0.6, 2.0, 1.0, 0.4))
    assert identify.no_rise(c, np.array([0.50, 0.52, 0.48, 0.50]), fit=fit, n_samples=400).startswith("no rise")
    assert identify.no_rise(c, np.array([0.40, 0.60, 0.40, 0.60]), fit=fit, n_samples=400) == ""


@pytest.mark.parametrize("refine", [False, True])
def test_the_refit_never_prints_A_where_it_is_not_identified(tmp_path, capsys, refine):
    short = write_run(tmp_path / "short", np.random.default_rng(6).binomial(
        800, eq1(np.linspace(0, 1, 21), 0.61, 1.92, 3.0, 0.3)) / 800)
    assert main([str(short), "--holdout", "0", "--json", *(["--refine"] if refine else [])]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert not row["identified"] and row["A"] is None
    if refine:
        assert row["refined"]["A"] is None
    assert main([str(short), "--holdout", "0", *(["--refine"] if refine else [])]) == 0
    out = capsys.readouterr().out
    assert "A=" not in out and "A = " not in out
