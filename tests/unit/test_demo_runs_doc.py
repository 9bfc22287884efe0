"""The demo's figures in README.md and docs/running_scalerl.md are ranges over repeated runs of the same seed
(issue 56: one lucky run was the headline), read from the committed per-run summary docs/demo_runs.json
(written by tools/demo_summary.py from the runs' own summary.json and metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _runs() -> list[dict]:
    return json.loads((ROOT / "docs" / "demo_runs.json").read_text())["runs"]


def value_range(values: list[float], fmt: str = "{:.2f}") -> str:
    """`lo-hi` of the values as the docs print them, or one value when they print alike."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def test_value_range_by_hand():
    assert value_range([0.647, 0.785, 0.7]) == "0.65-0.79"
    assert value_range([0.321, 0.324]) == "0.32"
    assert value_range([1116.5, 1190.0], "{:.0f}") == "1116-1190"


def test_the_summary_holds_several_runs_of_one_seed_and_is_consistent():
    runs = _runs()
    assert len(runs) >= 3 and {r["seed"] for r in runs} == {0}
    for r in runs:
        assert r["val_steps"][0] == 0 and r["val_steps"][-1] == r["rl_steps"] == 80
        assert 0 <= min(r["first"], r["last"]) <= max(r["first"], r["last"]) <= r["peak"] <= 1
        assert r["peak_step"] in r["val_steps"]
        assert r["sft_s"] + r["rl_s"] < r["wall_s"]
        assert 0 < r["onpolicy_abs_log_ratio_mean"] <= r["onpolicy_abs_log_ratio_max"]


def test_readme_states_the_demo_as_the_range_over_the_runs():
    runs = _runs()
    text = " ".join((ROOT / "README.md").read_text().split())
    line = (f"from {value_range([r['first'] for r in runs])} to {value_range([r['last'] for r in runs])} "
            f"over {len(runs)} runs of seed 0 (peak {value_range([r['peak'] for r in runs])}")
    assert line in text, line


def test_running_doc_states_time_and_agreement_as_ranges():
    runs = _runs()
    text = " ".join((ROOT / "docs" / "running_scalerl.md").read_text().split())
    minutes = value_range([r["wall_s"] / 60 for r in runs], "{:.0f}")
    mean = value_range([r["onpolicy_abs_log_ratio_mean"] for r in runs], "{:.0e}")
    worst = value_range([r["onpolicy_abs_log_ratio_max"] for r in runs], "{:.0e}")
    for part in (f"{minutes} minutes over {len(runs)} runs", f"mean {mean}, max {worst}"):
        assert part in text, part
