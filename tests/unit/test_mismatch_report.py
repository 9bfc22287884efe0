"""report.md's section on a quantized generator's mismatch (metrics/mismatch.py, report.py): run-level figures
worked by hand from three steps' metrics, the section's rows, and no section for an unquantized generator."""

from __future__ import annotations

import pytest

from scalerl_mega.metrics.mismatch import mismatch_summary, report_lines
from scalerl_mega.metrics.writer import MetricsWriter
from scalerl_mega.report import write_report

STEPS = [  # step 1 and 2 saw on-policy tokens (100 and 300), step 3 none; step 3 ran the correction on a quarter
    {"train/onpolicy_tokens": 100.0, "rollout/mismatch_kl": 0.01, "train/onpolicy_abs_log_ratio_sum": 5.0,
     "train/onpolicy_abs_log_ratio_max": 0.3, "train/approx_kl": 0.01, "train/abs_log_ratio_mean": 0.05,
     "train/clip_fraction": 0.0, "train/rho_max": 1.5, "sync/bytes": 1000.0},
    {"train/onpolicy_tokens": 300.0, "rollout/mismatch_kl": 0.03, "train/onpolicy_abs_log_ratio_sum": 30.0,
     "train/onpolicy_abs_log_ratio_max": 0.5, "train/approx_kl": 0.04, "train/abs_log_ratio_mean": 0.1,
     "train/clip_fraction": 0.02, "train/rho_max": 3.0, "sync/bytes": 1000.0},
    {"train/onpolicy_tokens": 0.0, "train/approx_kl": 0.07, "train/abs_log_ratio_mean": 0.15,
     "train/clip_fraction": 0.04, "train/rho_max": 2.0, "train/is_correction_fraction": 0.25, "sync/bytes": 900.0},
]


def test_summary_by_hand():
    s = mismatch_summary(STEPS)
    assert s["onpolicy_kl"] == pytest.approx((0.01 * 100 + 0.03 * 300) / 400)  # 0.025, token-weighted
    assert s["onpolicy_abs_log_ratio_mean"] == pytest.approx(35 / 400) and s["onpolicy_abs_log_ratio_max"] == 0.5
    assert (s["onpolicy_steps"], s["onpolicy_tokens"], s["onpolicy_kl_max"]) == (2, 400, 0.03)
    assert (s["kl_mean"], s["kl_max"]) == (pytest.approx(0.04), 0.07)  # plain means over the 3 steps
    assert (s["abs_log_ratio_mean"], s["clip_fraction_mean"]) == (pytest.approx(0.1), pytest.approx(0.02))
    assert (s["is_correction_fraction_mean"], s["rho_max"], s["sync_bytes"]) == (0.25, 3.0, 900.0)
    assert mismatch_summary([{"train/loss": 1.0}]) is None  # an SFT-only record set: nothing measured


def test_section_rows_and_no_section_unquantized():
    lines = report_lines(STEPS, quantization="fp8", is_correction="mis_token")
    assert lines[0] == "## Generator in FP8: the mismatch (rollout.quantization=fp8)"
    assert "| KL(pi_gen, pi_train) per token (k3) | 0.025 (worst step 0.03) | 0.04 (worst step 0.07) |" in lines
    assert "| mean abs log-ratio | 0.0875 (largest token 0.5) | 0.1 (worst step 0.15) |" in lines
    assert "| share of units mis_token truncated or masked | - | 0.25 (worst step 0.25) |" in lines
    assert any("loss.is_correction=mis_token (masked IS per token (IcePop))" in x for x in lines)
    assert lines[-2] == ("Over 3 steps; 400 on-policy tokens in 2 step(s). Largest IS ratio pi_train / pi_gen: 3. "
                         "Bytes per weight push: 900.")
    assert report_lines(STEPS, quantization="none", is_correction="none") == []


def test_write_report_adds_the_section_for_a_quantized_generator(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write("validation", 0, {"val_pass_rate": 0.1, "compute_gpu_hours": 0.0, "compute_device_hours": 0.0})
        for i, r in enumerate(STEPS, start=1):
            w.write("train", i, {**r, "compute_gpu_hours": 0.0, "compute_device_hours": 0.01 * i})
    assert "## Generator in FP8" not in write_report(tmp_path).read_text()
    md = write_report(tmp_path, quantization="fp8").read_text()
    assert "## Generator in FP8: the mismatch" in md and "loss.is_correction=none" in md
