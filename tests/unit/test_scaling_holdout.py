"""scaling/holdout.py: the first-half forecast scored against the binomial noise floor, on synthetic runs of a known
Eq. 1 curve (written out here in float64) read back through `scaling.io` as `scalerl-fit` reads them."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from scalerl_mega.scaling.holdout import half_fit, overdispersion, score_later
from scalerl_mega.scaling.io import read_series

A, B, CMID, R0 = 0.80, 2.5, 100.0 * 256, 0.30  # C_mid at step 100 (of 800) at 256 samples per step


def eq1(c):
    c = np.asarray(c, dtype=np.float64)
    return R0 + (A - R0) / (1.0 + (CMID / c) ** B)


def _write_run(d, *, steps=800, every=20, n=1600, noise_seed=None, bend=None):
    d.mkdir(parents=True)
    rng = np.random.default_rng(noise_seed) if noise_seed is not None else None
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(0, steps + 1):
            if s:
                f.write(json.dumps({"kind": "train", "step": s, "samples": 256.0}) + "\n")
            if s % every == 0:
                c = s * 256.0
                p = R0 if s == 0 else float(eq1(c))
                if bend is not None and s:
                    p = bend(c, p)
                if rng is not None:
                    p = rng.binomial(n, p) / n
                f.write(json.dumps({"kind": "validation", "step": s, "val_pass_rate": p, "val_prompts": 200.0,
                                    "val_samples_per_prompt": n / 200.0}) + "\n")


def _read(d):
    s = read_series(d, x="sum:samples", y="val_pass_rate")
    return s.compute, s.reward, s.n_samples


def test_the_series_accumulates_samples(tmp_path):
    _write_run(tmp_path / "r", steps=40, every=20)
    c, r, n = _read(tmp_path / "r")
    assert c.tolist() == [0.0, 20 * 256.0, 40 * 256.0]
    assert r[0] == R0 and n.tolist() == [1600.0] * 3
    assert r[2] == pytest.approx(R0 + (A - R0) / (1 + (CMID / (40 * 256.0)) ** B))


def test_half_fit_of_an_exact_curve_predicts_the_end(tmp_path):
    _write_run(tmp_path / "r")
    c, r, n = _read(tmp_path / "r")
    h = half_fit(c, r, n)
    assert h.half_compute == 400 * 256.0
    assert h.final_compute == (760 * 256.0, 780 * 256.0, 800 * 256.0)
    # noise floor by hand at the last points: sqrt(2/pi) * mean sqrt(p(1-p)/1600), p = the prediction
    p = np.asarray(h.predicted)
    assert h.noise_floor == pytest.approx(np.sqrt(2 / np.pi) * np.mean(np.sqrt(p * (1 - p) / 1600)))
    assert h.identified, h.verdict
    assert h.predicted == pytest.approx(r[-3:].tolist(), abs=0.005)
    assert h.mae < 0.005 and h.ratio < 1.0
    assert h.unvetted_mae == pytest.approx(h.mae)  # identified: the forecast is the fit


def test_half_fit_without_identified_A_makes_no_forecast(tmp_path):
    # 60 steps: far before C_mid, A cannot be pinned
    _write_run(tmp_path / "r", steps=60, every=5, n=1600)
    c, r, n = _read(tmp_path / "r")
    h = half_fit(c, r, n)
    assert not h.identified and h.predicted is None and h.mae is None and "not identified" in h.verdict
    # what the refused fit would have forecast, scored by hand at the last 3 points
    fit = h.assessment.fit
    assert h.unvetted_mae == pytest.approx(np.mean(np.abs(fit.predict(c[-3:]) - r[-3:])))


def test_score_later_measures_a_fall_after_the_half_by_hand(tmp_path):
    """The run falls linearly by up to 0.1 over its second half: the mean error, the bias and the noise floor of
    the second-half points are the hand-computed ones."""
    half = 400 * 256.0
    _write_run(tmp_path / "r", bend=lambda c, p: p - (0.1 * (c - half) / half if c > half else 0.0))
    c, r, n = _read(tmp_path / "r")
    h = half_fit(c, r, n)
    s = score_later(c, r, n, half=h)
    later = c > half
    drop = 0.1 * (c[later] - half) / half
    assert s["points"] == 20 and s["forecast"] is True
    f = h.assessment.fit  # the forecast, Eq. 1 written out with the first-half fit's parameters
    pred = f.R0 + (f.A - f.R0) / (1.0 + (f.C_mid / c[later]) ** f.B)
    assert s["bias"] == pytest.approx(float(np.mean(r[later] - pred)), rel=1e-9)
    assert s["mae"] == pytest.approx(float(np.mean(np.abs(r[later] - pred))), rel=1e-9)
    assert s["bias"] == pytest.approx(-float(np.mean(drop)), abs=0.01)  # the fall, up to the first half's fit error
    p = pred
    assert s["noise_floor"] == pytest.approx(math.sqrt(2 / math.pi) * float(np.mean(np.sqrt(p * (1 - p) / 1600))),
                                             rel=1e-9)
    assert s["ratio"] == pytest.approx(s["mae"] / s["noise_floor"])
    # inside A's band +- 2 binomial SE: only the first few points of the fall
    assert s["inside_band"] < 10
    assert score_later(c[c <= half], r[c <= half], n[c <= half], half=h) is None


def test_unknown_sample_counts_take_the_given_noise_sd(tmp_path):
    _write_run(tmp_path / "r")
    c, r, _ = _read(tmp_path / "r")
    with pytest.raises(ValueError, match="noise_std"):
        half_fit(c, r, None)
    h = half_fit(c, r, None, noise_std=0.01)
    assert h.noise_floor == pytest.approx(math.sqrt(2 / math.pi) * 0.01)
    assert score_later(c, r, None, half=h, noise_std=0.01)["noise_floor"] == pytest.approx(h.noise_floor)


def test_overdispersion_by_hand():
    fit = SimpleNamespace(sse=0.0063, n_points=10, compute_range=(1.0, 10.0),
                          predict=lambda c: np.full(np.shape(c), 0.5))
    od = overdispersion(fit, np.arange(0.0, 11.0), 1600.0)
    assert od["residual_sd"] == pytest.approx(0.03)              # sqrt(0.0063 / 7)
    assert od["binomial_se"] == pytest.approx(0.0125)            # sqrt(0.25 / 1600)
    assert od["ratio"] == pytest.approx(2.4)
