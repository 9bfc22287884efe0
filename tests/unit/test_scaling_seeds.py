"""scaling/seeds.py: the seed-mean curve and the seed-aware leave-one-out rule, on hand-worked numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl_mega.scaling.seeds import (NOT_SEPARABLE, REFERENCE_BETTER, VARIANT_BETTER, compare_recipe, crossing,
                                        half_range, paired_window, seed_mean_curve)


def test_seed_mean_curve_is_pointwise_and_cut_to_the_shortest():
    x, y = seed_mean_curve([([0.0, 1.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.4]), ([0.0, 3.0, 4.0], [0.3, 0.4, 0.5])])
    np.testing.assert_allclose(x, [0.0, 2.0, 3.0])
    np.testing.assert_allclose(y, [0.2, 0.3, 0.4])


def test_seed_mean_curve_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        seed_mean_curve([])
    with pytest.raises(ValueError, match="compute has 2 points but reward 1"):
        seed_mean_curve([([0.0, 1.0], [0.1])])


def test_half_range():
    assert half_range([0.60, 0.63, 0.61]) == pytest.approx(0.015)
    assert half_range([0.5]) == 0.0


def test_A_beyond_the_margin_decides():
    # mean A: reference 0.70, variant 0.64 -> -0.06; noise max(0.02, 0.01, 0.01) = 0.02
    c = compare_recipe(A_ref=[0.69, 0.70, 0.71], A_var=[0.63, 0.64, 0.65], B_ref=[1, 1, 1], B_var=[2, 2, 2])
    assert c.outcome == REFERENCE_BETTER and c.decided_by == "A"
    assert c.delta_A == pytest.approx(-0.06) and c.noise_A == pytest.approx(0.02)


def test_seed_spread_widens_the_margin():
    # same -0.06 difference, but the variant's seeds span 0.58..0.70 (half-range 0.06): not beyond it
    c = compare_recipe(A_ref=[0.69, 0.70, 0.71], A_var=[0.58, 0.64, 0.70], B_ref=[2.0, 2.1, 1.9],
                       B_var=[2.0, 2.1, 1.9])
    assert c.outcome == NOT_SEPARABLE and c.noise_A == pytest.approx(0.06)
    assert c.delta_B == pytest.approx(0.0, abs=1e-12)


def test_B_at_the_common_A_against_welch_se():
    # A equal; B ref 2.0 +- 0.1 (sd 0.1), variant 1.5 +- 0.1: dB = -0.5, SE = sqrt(0.01/3 + 0.01/3) = 0.0816
    c = compare_recipe(A_ref=[0.7, 0.7, 0.7], A_var=[0.7, 0.71, 0.69], B_ref=[1.9, 2.0, 2.1], B_var=[1.4, 1.5, 1.6])
    assert c.outcome == REFERENCE_BETTER and c.decided_by == "B at the common A"
    assert c.delta_B == pytest.approx(-0.5) and c.se_B == pytest.approx(math.sqrt(0.02 / 3))
    # the variant better in B
    c = compare_recipe(A_ref=[0.7, 0.7, 0.7], A_var=[0.7, 0.7, 0.7], B_ref=[1.4, 1.5, 1.6], B_var=[1.9, 2.0, 2.1])
    assert c.outcome == VARIANT_BETTER
    # dB = -0.1 < 2 x 0.0816: not separable
    c = compare_recipe(A_ref=[0.7, 0.7, 0.7], A_var=[0.7, 0.7, 0.7], B_ref=[1.9, 2.0, 2.1], B_var=[1.8, 1.9, 2.0])
    assert c.outcome == NOT_SEPARABLE and "within 2 x SE" in c.reason


def test_unidentified_seeds_are_left_out():
    c = compare_recipe(A_ref=[0.7, math.nan, math.nan], A_var=[0.6, 0.6, 0.6], B_ref=[2, 2, 2], B_var=[1, 1, 1])
    assert c.outcome == NOT_SEPARABLE and c.n_ref == 1 and "identified for 1 reference" in c.reason
    c = compare_recipe(A_ref=[0.7, 0.7, math.nan], A_var=[0.75, 0.76, 0.74], B_ref=[2, 2, math.nan],
                       B_var=[1, 1, 1])
    assert c.outcome == VARIANT_BETTER and c.n_ref == 2  # +0.05 beyond 0.02


def test_compare_means_welch_rule():
    from scalerl_mega.scaling.seeds import compare_means

    # ref 0.70 +- 0.01 (sd 0.01), var 0.78 +- 0.01: delta 0.08, SE sqrt(2e-4/3) = 0.00816
    m = compare_means([0.69, 0.70, 0.71], [0.77, 0.78, 0.79])
    assert m.outcome == VARIANT_BETTER and m.delta == pytest.approx(0.08) and m.se == pytest.approx(math.sqrt(2e-4 / 3))
    assert compare_means([0.69, 0.70, 0.71], [0.70, 0.71, 0.72]).outcome == NOT_SEPARABLE  # 0.01 < 2 x 0.0082
    one = compare_means([0.7], [0.9, 0.8])
    assert one.outcome == NOT_SEPARABLE and one.delta == pytest.approx(0.15) and math.isnan(one.se)


def test_compare_paired_uses_t_at_the_actual_dof():
    from scalerl_mega.scaling.seeds import compare_paired

    # hand-worked: d = (0.03, 0.05, 0.04): mean 0.04, sd 0.01, t_0.975(2) = 4.3027, half-width 0.02484
    ref = {0: 0.70, 1: 0.72, 2: 0.71, 7: 0.5}
    var = {0: 0.73, 1: 0.77, 2: 0.75, 3: 0.9}
    c = compare_paired(ref, var)
    assert c.seeds == (0, 1, 2) and c.dof == 2
    assert c.mean == pytest.approx(0.04) and c.sd == pytest.approx(0.01)
    assert c.t_crit == pytest.approx(4.302653, rel=1e-6)
    assert c.half_width == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-6)
    assert c.outcome == VARIANT_BETTER and c.margin_rule == VARIANT_BETTER
    # the same mean with a spread of differences: the t rule no longer separates, the +-0.02 rule still does
    wide = compare_paired({0: 0.70, 1: 0.72, 2: 0.71}, {0: 0.69, 1: 0.82, 2: 0.74})
    assert wide.mean == pytest.approx(0.04) and wide.half_width > 0.04
    assert wide.outcome == NOT_SEPARABLE and wide.margin_rule == VARIANT_BETTER
    # one common seed: no variance, not separable; NaN values are missing
    one = compare_paired({0: 0.7, 1: math.nan}, {0: 0.6, 1: 0.8})
    assert one.outcome == NOT_SEPARABLE and one.seeds == (0,) and math.isnan(one.t_crit)
    assert one.margin_rule == REFERENCE_BETTER


def test_paired_window_by_hand():
    c = np.array([0.0, 1.0, 2.0, 3.0])
    ref = {0: (c, np.array([0.1, 0.2, 0.3, 0.4])), 1: (c, np.array([0.1, 0.3, 0.3, 0.5]))}
    var = {0: (c, np.array([0.1, 0.3, 0.5, 0.4])), 1: (c, np.array([0.1, 0.35, 0.45, 0.5])), 7: (c, c)}
    w = paired_window(ref, var, lo=1.0, hi=2.0)
    # seed 0: mean(0.3, 0.5) - mean(0.2, 0.3) = 0.15; seed 1: mean(0.35, 0.45) - mean(0.3, 0.3) = 0.1 (seed 7 unpaired)
    assert w.points == 2 and w.paired.seeds == (0, 1)
    assert w.paired.differences == pytest.approx((0.15, 0.1))
    assert w.paired.mean == pytest.approx(0.125)
    # t_0.975(1) = 12.706; sd = 0.0353553; half width = 12.706 * sd / sqrt(2) = 0.31766
    assert w.paired.half_width == pytest.approx(12.7062 * math.sqrt(0.00125) / math.sqrt(2), rel=1e-4)
    assert w.paired.outcome == NOT_SEPARABLE


def _seeds(f, noise, k=3):
    c = np.arange(0, 41, dtype=np.float64)
    return {s: (c, f(c) + noise * (s - 1)) for s in range(k)}


def test_crossing_detects_the_paper_pattern_and_its_reverse():
    small = _seeds(lambda c: 0.2 + 0.5 * c / (c + 5), 0.001)       # fast, low plateau
    large = _seeds(lambda c: 0.2 + 0.7 * c / (c + 15), 0.002)      # slow, high plateau
    x = crossing(small, large)
    assert x["outcome"] == "crossed"
    assert x["early"].paired.outcome == REFERENCE_BETTER and x["late"].paired.outcome == VARIANT_BETTER
    assert x["early"].window == (1e-12, 10.0) and x["late"].window == (30.0, 40.0)
    assert crossing(large, small)["outcome"] == "reversed"
    same = crossing(small, small)
    assert same["outcome"] == f"early: {NOT_SEPARABLE}; late: {NOT_SEPARABLE}"


# ---------------------------------------------------------------- whole analysis on synthetic sweeps
SAMPLES = 256.0  # per reference step


def eq1(c, *, A, B, C_mid, R0=0.2):
    """Eq. 1 (paper Sec. 2.1) in float64, written out independently of scaling.fit."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, R0 + (A - R0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), R0)


TRUTH = {"scalerl": (0.70, 2.0, 60.0), "batch_small": (0.62, 2.0, 40.0), "batch_large": (0.78, 2.0, 90.0),
         "batch_control": (0.70, 2.0, 60.0)}
"""setting -> (A, B, C_mid in reference steps); every setting validates every 20 x 256 samples."""


def write_run(d: Path, *, A, B, C_mid, seed, per_step, steps, every, n=1600):
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(steps + 1):
            if step:
                fh.write(json.dumps({"kind": "train", "step": step, "samples": per_step,
                                     "curriculum/curriculum/epoch": step // 100,
                                     "curriculum/curriculum/active_prompts": 3000 - step}) + "\n")
            if step % every == 0:  # window validation (the sweep's): the point measures R at the window's centre
                centre = step - every // 2 if step else 0
                p = float(eq1(centre * per_step / SAMPLES, A=A, B=B, C_mid=C_mid))
                line = {"kind": "validation", "step": step, "val_pass_rate": p, "val_prompts": 200.0,
                        "val_samples_per_prompt": n / 200.0}
                if step:
                    line["val_pass_rate"] = p + rng.normal(0.0, 0.002)
                    line["val_center_step"] = float(centre)
                fh.write(json.dumps(line) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": steps, "wall_s": 10.0}))
    (d / "provenance.json").write_text(json.dumps({"commit": "abc123def456", "dirty": False}))


SHAPE = {"scalerl": (256.0, 800, 20), "batch_small": (128.0, 1600, 40), "batch_large": (512.0, 400, 10),
         "batch_control": (256.0, 800, 20)}
