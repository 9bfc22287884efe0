"""The FP8 demo's figures in docs/running_scalerl.md are ranges over its committed runs (docs/demo_fp8_runs.json,
written by tools/demo_fp8_runs.py from the runs' own metrics.jsonl, train.log, summary.json and run_config.yaml):
`experiment=demo rollout.quantization=fp8` on seeds 0, 1, 2 with no correction beyond CISPO's own truncated IS
weight, and seed 0 again with masked IS (`loss.is_correction=mis_token`). The runs learn like the bf16 demo (its
committed runs, docs/demo_runs.json: every FP8 run ends above the bf16 runs' first validation by more than half the
bf16 runs' smallest gain), and their mismatch is real and small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_demo_runs_doc import value_range

ROOT = Path(__file__).resolve().parents[2]


def _doc() -> dict:
    return json.loads((ROOT / "docs" / "demo_fp8_runs.json").read_text())


def _plain(doc: dict) -> list[dict]:
    return [r for r in doc["runs"] if r["is_correction"] == "none"]


def test_the_runs_and_their_records_agree_with_themselves():
    doc = _doc()
    assert [r["seed"] for r in _plain(doc)] == [0, 1, 2]
    assert [(r["seed"], r["is_correction"]) for r in doc["runs"] if r["is_correction"] != "none"] == [(0, "mis_token")]
    for r in doc["runs"]:
        points = r["validations"]
        assert r["exit_status"] == 0 and r["quantization"] == "fp8" and len(r["commit"]) == 40
        assert [p["step"] for p in points] == list(range(0, r["rl_steps"] + 1, 10)) and r["rl_steps"] == 80
        assert (r["first"], r["last"]) == (points[0]["pass_rate"], points[-1]["pass_rate"])
        assert r["peak"] == max(p["pass_rate"] for p in points)
        assert r["gain"] == pytest.approx(r["last"] - r["first"], abs=1e-4)
        assert [p["wall_s"] for p in points] == sorted(p["wall_s"] for p in points)
        assert r["sft_s"] + r["rl_s"] < r["wall_s"] < r["launch_to_exit_s"]
        m = r["mismatch"]
        assert m["steps"] == 80 and m["onpolicy_tokens"] > 0 and m["sync_bytes"] > 0
        assert 0 < m["onpolicy_kl"] <= m["onpolicy_kl_max"] and 0 < m["kl_mean"] <= m["kl_max"]
        assert 0 < m["onpolicy_abs_log_ratio_mean"] < m["onpolicy_abs_log_ratio_max"]
        assert 0 <= m["clip_fraction_mean"] <= m["clip_fraction_max"] <= 1
        assert ("is_correction_fraction_mean" in m) == (r["is_correction"] != "none")


def test_fp8_runs_learn_like_the_bf16_demo():
    bf16 = json.loads((ROOT / "docs" / "demo_runs.json").read_text())["runs"]
    first = min(r["first"] for r in bf16)
    least_gain = min(r["last"] - r["first"] for r in bf16)
    for r in _doc()["runs"]:
        assert r["last"] > first + least_gain / 2 and r["gain"] > least_gain / 2, r["run"]


def test_running_doc_states_the_runs_as_ranges():
    doc = _doc()
    plain = _plain(doc)
    mis = next(r for r in doc["runs"] if r["is_correction"] == "mis_token")
    text = " ".join((ROOT / "docs" / "running_scalerl.md").read_text().split())
    rng = lambda key, fmt="{:.2f}": value_range([r[key] for r in plain], fmt)  # noqa: E731
    mm = lambda key, fmt="{:.2g}", runs=plain: value_range([r["mismatch"][key] for r in runs], fmt)  # noqa: E731
    assert (f"validation pass rate {rng('first')} -> {rng('last')} (gain +{rng('gain')}, peak {rng('peak')}) in "
            f"{value_range([r['wall_s'] / 60 for r in plain], '{:.0f}')} minutes") in text
    assert (f"on-policy KL {mm('onpolicy_kl')} per token, mean |log-ratio| {mm('onpolicy_abs_log_ratio_mean')} "
            f"(largest token {mm('onpolicy_abs_log_ratio_max')})") in text
    assert (f"over all trained tokens KL {mm('kl_mean')}, mean |log-ratio| {mm('abs_log_ratio_mean')}, CISPO's "
            f"truncation on {mm('clip_fraction_mean', '{:.1e}')} of the tokens") in text
    assert (f"`loss.is_correction=mis_token`, seed 0): {mis['first']:.2f} -> {mis['last']:.2f} (peak "
            f"{mis['peak']:.2f}; its warm start ended elsewhere, seed 0 without the correction starts at "
            f"{plain[0]['first']:.2f}), {mis['mismatch']['is_correction_fraction_mean']:.1e} of the tokens masked, KL "
            f"over all trained tokens {mis['mismatch']['kl_mean']:.2g}") in text
    bf16 = json.loads((ROOT / "docs" / "demo_runs.json").read_text())["runs"]
    assert (f"the bf16 demo goes {bf16[0]['first']:.2f} -> {value_range([r['last'] for r in bf16])} on seed 0" in text
            and {r["seed"] for r in bf16} == {0})
    assert f"against {value_range([r['onpolicy_abs_log_ratio_mean'] for r in bf16], '{:.1e}')} for the bf16" in text
    assert f"Each push: {plain[0]['mismatch']['sync_bytes']:,.0f} bytes against {_fp32_bytes():,} in FP32" in text
    assert f"sends {_qwen3_moe_fp8_share():.2f} of its FP32 bytes" in text
    assert "[demo_fp8_runs.json](demo_fp8_runs.json)" in text and (ROOT / "docs" / "demo_fp8_runs.png").is_file()


def _fp32_bytes() -> int:
    """The demo model's unquantized push: every tensor the exporter sends, in FP32."""
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.megatron.export import export_plan
    from scalerl_mega.weight_sync.plan import spec_bytes

    return sum(spec_bytes(s) for s in export_plan(load_model_preset("demo_moe"), dtype="float32"))


def _qwen3_moe_fp8_share() -> float:
    """tiny_qwen3_moe at the task's vocabulary (tests/integration/test_fp8_rl.py's run): FP8 push / FP32 push."""
    import dataclasses

    from scalerl_mega.cluster.weight_bytes import model_bytes
    from scalerl_mega.dry_run import model_shape
    from scalerl_mega.model.config import load_model_preset

    m = model_shape(dataclasses.replace(load_model_preset("tiny_qwen3_moe"), vocab_size=48, max_position_embeddings=128))
    return model_bytes(m, dtype_bytes=4, quantization="fp8") / model_bytes(m, dtype_bytes=4)
