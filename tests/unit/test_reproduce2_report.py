"""reproduce2_report.half_fit on a synthetic run directory with a known Eq. 1 curve (issue 29 item 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalerl_mega.reproduce2_report import half_fit, read_run
from scalerl_mega.scaling.fit import sigmoid_law

A, B, CMID, R0 = 0.80, 2.5, 100.0 * 256, 0.30  # C_mid at step 100 (of 800) at 256 samples per step


def _write_run(d, *, steps=800, every=20, n=1600, noise_seed=None):
    d.mkdir(parents=True)
    rng = np.random.default_rng(noise_seed) if noise_seed is not None else None
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(0, steps + 1):
            if s:
                f.write(json.dumps({"kind": "train", "step": s, "samples": 256.0}) + "\n")
            if s % every == 0:
                c = s * 256.0
                p = R0 if s == 0 else float(sigmoid_law(np.array([c]), A=A, B=B, C_mid=CMID, R0=R0)[0])
                if rng is not None:
                    p = rng.binomial(n, p) / n
                f.write(json.dumps({"kind": "validation", "step": s, "val_pass_rate": p, "val_prompts": 200.0,
                                    "val_samples_per_prompt": 8.0}) + "\n")


def test_read_run_accumulates_samples(tmp_path):
    _write_run(tmp_path / "r", steps=40, every=20)
    c, r, n = read_run(tmp_path / "r")
    assert c.tolist() == [0.0, 20 * 256.0, 40 * 256.0]
    assert r[0] == R0 and n.tolist() == [1600.0] * 3
    assert r[2] == pytest.approx(R0 + (A - R0) / (1 + (CMID / (40 * 256.0)) ** B))


def test_half_fit_of_an_exact_curve_predicts_the_end(tmp_path):
    _write_run(tmp_path / "r")
    c, r, n = read_run(tmp_path / "r")
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
    # 50 steps at 1-sample precision: far before C_mid, A cannot be pinned
    _write_run(tmp_path / "r", steps=60, every=5, n=1600)
    c, r, n = read_run(tmp_path / "r")
    h = half_fit(c, r, n)
    assert not h.identified and h.predicted is None and h.mae is None and "not identified" in h.verdict
    # what the refused fit would have forecast, scored by hand at the last 3 points
    fit = h.assessment.fit
    assert h.unvetted_mae == pytest.approx(np.mean(np.abs(fit.predict(c[-3:]) - r[-3:])))
