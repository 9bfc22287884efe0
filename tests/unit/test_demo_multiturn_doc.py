"""The multi-turn demo's figures in README.md and docs/running_scalerl.md are ranges over its three committed runs
(seeds 0, 1, 2; docs/demo_multiturn_runs.json, written by tools/demo_multiturn_runs.py from the runs' own
metrics.jsonl, train.log and summary.json), and the runs meet the demo's bar: a validation gain of +0.15 or more in
every seed, and at the end at least half of the passing validation episodes passing at turn 2 or later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_demo_runs_doc import value_range

ROOT = Path(__file__).resolve().parents[2]


def _doc() -> dict:
    return json.loads((ROOT / "docs" / "demo_multiturn_runs.json").read_text())


def _text(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


def test_the_runs_are_three_seeds_whose_records_agree_with_themselves():
    doc = _doc()
    runs = doc["runs"]
    assert [r["seed"] for r in runs] == [0, 1, 2] and doc["target_gain"] == 0.15
    for r in runs:
        assert r["exit_status"] == 0
        points = r["validations"]
        assert [p["step"] for p in points] == list(range(0, r["rl_steps"] + 1, 10)) and r["rl_steps"] == 30
        for p in points:
            assert p["pass_at_turn_1"] + p["pass_at_turn_2"] == pytest.approx(p["pass_rate"], abs=1e-9)
            assert p["wall_s"] is not None
        assert [p["wall_s"] for p in points] == sorted(p["wall_s"] for p in points)
        assert (r["first"], r["last"]) == (points[0]["pass_rate"], points[-1]["pass_rate"])
        assert r["gain"] == pytest.approx(r["last"] - r["first"], abs=1e-4)
        reached = next(p for p in points if p["pass_rate"] - r["first"] >= 0.15)
        assert (r["gain_reached_step"], r["gain_reached_wall_s"]) == (reached["step"], reached["wall_s"])
        assert r["last_share_of_passes_at_turn_2_or_later"] == pytest.approx(
            points[-1]["pass_at_turn_2"] / r["last"], abs=1e-4)
        assert r["sft_s"] + r["rl_s"] < r["wall_s"] < r["launch_to_exit_s"]


def test_every_seed_gains_and_passes_at_turn_two():
    for r in _doc()["runs"]:
        assert r["gain"] >= 0.15 and r["gain_reached_step"] is not None
        assert r["last_share_of_passes_at_turn_2_or_later"] >= 0.5


def _minutes(values: list[float]) -> str:
    return value_range([v / 60 for v in values], "{:.1f}")


def test_running_doc_and_readme_state_the_runs_as_ranges():
    doc = _doc()
    runs = doc["runs"]
    first, last = value_range([r["first"] for r in runs]), value_range([r["last"] for r in runs])
    gain = value_range([r["gain"] for r in runs])
    steps = value_range([r["gain_reached_step"] for r in runs], "{:.0f}")
    after_launch = _minutes([r["gain_reached_wall_s"] for r in runs])
    after_first = _minutes([r["gain_reached_wall_s"] - r["validations"][0]["wall_s"] for r in runs])
    turn1 = value_range([p["pass_at_turn_1"] for r in runs for p in r["validations"]], "{:.3f}")
    share = value_range([r["last_share_of_passes_at_turn_2_or_later"] for r in runs])
    load = value_range([x for r in runs for x in (r["load_before"], r["load_after"])], "{:.0f}")
    wall = _minutes([r["launch_to_exit_s"] for r in runs])
    sft, rl = value_range([r["sft_s"] for r in runs], "{:.0f}"), value_range([r["rl_s"] for r in runs], "{:.0f}")
    running = _text("docs/running_scalerl.md")
    for part in (f"Measured at `{doc['revision']}`", f"load average {load}",
                 f"the validation pass rate went from {first} to {last} (gain +{gain})",
                 f"first reached +0.15 at RL step {steps}, {after_launch} minutes after the launch "
                 f"({after_first} minutes after the first validation)",
                 f"passed at turn 1: {turn1} of the validation episodes",
                 f"at the end {share} of the passing validation episodes passed at turn 2",
                 f"Each run took {wall} minutes from launch to exit (SFT {sft} s, RL {rl} s)",
                 f"within 10 minutes of the launch for {sum(r['gain_reached_wall_s'] <= 600 for r in runs)} of the "
                 f"{len(runs)} seeds"):
        assert part in running, part
    assert all(p["pass_at_turn_1"] == 0.0 for r in runs for p in r["validations"])  # "every pass at turn 2"
    readme = _text("README.md")
    line = f"validation pass rate {first} -> {last} over seeds 0, 1 and 2, every pass at turn 2"
    assert line in readme, line
