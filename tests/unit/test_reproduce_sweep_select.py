"""`python -m scalerl_mega.reproduce sweep --sweep ...`: the selected sweep's overlays and directory reach the
Hydra multirun, and every run finished by an invocation gets that invocation's provenance.json (issue 29
item 4). The multirun itself is replaced by a fake that finishes one point and leaves another unfinished;
the real skip-done/resume path is tests/integration/test_reproduce_sweep.py."""

from __future__ import annotations

import json
from pathlib import Path

import scalerl_mega.reproduce as rep
import scalerl_mega.reproduce_report as rep_report


def _fake_sweep(calls: list, finish: list[str]):
    def call(cmd, env=None):
        calls.append(cmd)
        sweep_dir = Path(next(a for a in cmd if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
        for point in finish:
            d = sweep_dir / point
            d.mkdir(parents=True, exist_ok=True)
            (d / "summary.json").write_text(json.dumps({"steps": 800}))
            (d / "run_config.yaml").write_text("train:\n  steps: 800\n")
        for point, summary in (("repro3_no_npr/seed0", None),                             # killed: no summary
                               ("repro3_batch_large/seed0", {"steps": 171, "preempted": True})):  # SIGTERM
            d = sweep_dir / point
            if (d / "summary.json").is_file() and point in finish:
                continue
            d.mkdir(parents=True, exist_ok=True)
            (d / "run_config.yaml").write_text("train:\n  steps: 400\n")
            if summary:
                (d / "summary.json").write_text(json.dumps(summary))
        return 0
    return call


def test_repro3_selects_its_overlays_and_stamps_finished_runs_once(tmp_path, monkeypatch):
    calls: list = []
    sweep = tmp_path / "sw"
    monkeypatch.setattr(rep.subprocess, "call", _fake_sweep(calls, ["repro3_scalerl/seed0"]))
    monkeypatch.setattr(rep, "_git", lambda *a: "abc123" if a[0] == "rev-parse" else " M file.py")
    assert rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert ("experiment=repro3_scalerl,repro3_batch_small,repro3_batch_large,repro3_batch_control,repro3_no_npr"
            in calls[0])
    first = json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())
    assert first["commit"] == "abc123" and first["dirty"] is True
    assert not (sweep / "repro3_no_npr" / "seed0" / "provenance.json").exists()
    assert not (sweep / "repro3_batch_large" / "seed0" / "provenance.json").exists()  # preempted: not finished

    # The second invocation (another commit) finishes the other point; the first keeps its own stamp.
    monkeypatch.setattr(rep.subprocess, "call", _fake_sweep(calls, ["repro3_no_npr/seed0"]))
    monkeypatch.setattr(rep, "_git", lambda *a: "def456" if a[0] == "rev-parse" else "")
    assert rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())["commit"] == "abc123"
    second = json.loads((sweep / "repro3_no_npr" / "seed0" / "provenance.json").read_text())
    assert second["commit"] == "def456" and second["dirty"] is False
    assert [json.loads(x)["commit"] for x in (sweep / "provenance.jsonl").read_text().splitlines()] == [
        "abc123", "def456"]


def test_default_sweep_is_the_leave_one_out_one(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rep.subprocess, "call", _fake_sweep(calls, []))
    assert rep.main(["sweep", "--seeds", "0"]) == 0
    assert f"experiment={','.join(rep.RECIPE_RUN_NAMES)}" in calls[0]
    assert "hydra.sweep.dir=outputs/reproduce" in calls[0]


def test_recipe_name_strips_either_prefix():
    assert rep_report.recipe_name("repro_dapo") == "dapo"
    assert rep_report.recipe_name("repro3_batch_small") == "batch_small"
    assert rep_report.recipe_name("demo") == "demo"
