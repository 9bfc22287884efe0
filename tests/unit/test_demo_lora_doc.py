"""The LoRA demo's committed runs (seeds 0, 1, 2; docs/demo_lora_runs.json, written by tools/demo_lora_runs.py from the
runs' own metrics.jsonl and the base checkpoint): every seed gains, and each step's push carried the adapters alone,
whose bytes are counted here by hand from the demo model's shapes, against the whole model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _doc() -> dict:
    return json.loads((ROOT / "docs" / "demo_lora_runs.json").read_text())


def test_each_push_sends_the_adapters_bytes_a_small_fraction_of_the_model():
    # demo_moe (conf/model/demo_moe.yaml): 4 layers, hidden 128, 4 heads and 2 query groups of 32, shared expert 64;
    # rank 8 on q/k/v (A [8, 128] each, B [128|64|64, 8]), o (A [8, 128], B [128, 8]), shared gate/up (A [8, 128]
    # each, B [64, 8] each), shared down (A [8, 64], B [128, 8]); FP32
    per_layer = 8 * (3 * 128 + 128 + 64 + 64) + 8 * (128 + 128) + 8 * (2 * 128 + 2 * 64) + 8 * (64 + 128)
    adapters = 4 * per_layer * 4
    model = 703_616 * 4  # the demo model's parameters (conf/model/demo_moe.yaml), FP32
    for r in _doc()["runs"]:
        assert r["sync_bytes_per_step"] == [adapters] == [188_416]
        assert r["full_model_bytes"] == model
        assert r["sync_fraction_of_full"] == [round(adapters / model, 5)] and adapters / model < 0.07


def test_three_seeds_each_gain_over_their_first_validation():
    runs = _doc()["runs"]
    assert [r["seed"] for r in runs] == [0, 1, 2]
    for r in runs:
        points = r["validations"]
        assert r["exit_status"] == 0 and [p["step"] for p in points] == list(range(0, 81, 10))
        assert (r["first"], r["last"]) == (points[0]["pass_rate"], points[-1]["pass_rate"])
        assert r["gain"] == pytest.approx(r["last"] - r["first"], abs=1e-4) and r["gain"] >= 0.15


def test_the_running_doc_states_the_committed_runs():
    from tests.unit.test_demo_runs_doc import value_range

    text = " ".join((ROOT / "docs" / "running_scalerl.md").read_text().split())
    runs = _doc()["runs"]
    first, last = value_range([r["first"] for r in runs]), value_range([r["last"] for r in runs])
    gain = "-".join(f"+{g}" for g in value_range([r["gain"] for r in runs]).split("-"))
    assert (f"the validation pass rate rose from {first} to {last} in the demo's 80 RL steps (gain {gain}), and each "
            f"push carried {runs[0]['sync_bytes_per_step'][0]:,} bytes of adapters against "
            f"{runs[0]['full_model_bytes']:,} bytes for the whole model") in text
