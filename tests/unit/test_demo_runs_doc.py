"""The demo's figures in README.md and docs/running_scalerl.md are ranges over repeated runs of the same seed
(one lucky run was the headline), read from the committed per-run summary docs/demo_runs.json, which
tools/demo_runs.py writes after running the demo on a committed revision it records (per run, what
tools/demo_summary.py reads from the run's own summary.json and metrics.jsonl)."""

from __future__ import annotations

import json
import re
import sys
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


def test_the_summary_names_the_committed_revision_and_the_command():
    record = json.loads((ROOT / "docs" / "demo_runs.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]), record["commit"]  # a commit, not a working tree
    assert record["command"] == "scalerl-train experiment=demo seed=0 hydra.run.dir=<run dir>"


def test_readme_states_the_demo_time_as_the_range_over_the_runs():
    minutes = value_range([r["wall_s"] / 60 for r in _runs()], "{:.0f}")
    assert f"(CPU, {minutes} minutes on 2 shared cores)" in (ROOT / "README.md").read_text(), minutes


def test_the_demo_command_of_demo_runs_by_hand(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from demo_runs import COMMAND, demo_command
    finally:
        sys.path.remove(str(ROOT / "tools"))
    argv = demo_command(venv=tmp_path / "v", seed=3, run_dir=tmp_path / "r1")
    assert argv == [str(tmp_path / "v/bin/scalerl-train"), "experiment=demo", "seed=3", f"hydra.run.dir={tmp_path / 'r1'}"]
    assert COMMAND.format(seed=3) == " ".join(["scalerl-train", *argv[1:3], "hydra.run.dir=<run dir>"])


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


def test_demo_summary_by_hand(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from demo_summary import summarise
    finally:
        sys.path.remove(str(ROOT / "tools"))
    run = tmp_path / "run7"
    run.mkdir()
    (run / "run_config.yaml").write_text("run_name: demo\nseed: 3\n")
    (run / "summary.json").write_text(json.dumps({
        "val_points": [[0, 0.1, 0.5], [10, 0.2, 0.8], [20, 0.3, 0.7]], "wall_s": 100.04, "sft_s": 30.0,
        "rl_s": 60.0, "steps": 20}))
    rows = [{"kind": "validation", "step": 0},
            {"kind": "train", "step": 1, "train/onpolicy_tokens": 10.0, "train/onpolicy_abs_log_ratio_sum": 2e-6,
             "train/onpolicy_abs_log_ratio_max": 5e-7},
            {"kind": "train", "step": 2, "train/onpolicy_tokens": 30.0, "train/onpolicy_abs_log_ratio_sum": 6e-6,
             "train/onpolicy_abs_log_ratio_max": 9e-7},
            {"kind": "train", "step": 3, "train/onpolicy_tokens": 0.0}]  # a step with no on-policy token
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = summarise(run)
    assert got == {"run": "run7", "seed": 3, "first": 0.5, "last": 0.7, "peak": 0.8, "peak_step": 10,
                   "val_steps": [0, 10, 20], "wall_s": 100.0, "sft_s": 30.0, "rl_s": 60.0, "rl_steps": 20,
                   "onpolicy_abs_log_ratio_mean": got["onpolicy_abs_log_ratio_mean"],
                   "onpolicy_abs_log_ratio_max": 9e-7}
    assert abs(got["onpolicy_abs_log_ratio_mean"] - 8e-6 / 40) < 1e-18  # token-weighted: (2e-6 + 6e-6) / 40
