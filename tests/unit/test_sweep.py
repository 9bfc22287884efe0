"""Sweep tooling: skip-if-done predicate (cluster/sweep.py) and tools/sweep_report.py on synthetic runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from scalerl_mega.cluster.sweep import point_done

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_report", ROOT / "tools/sweep_report.py")
sweep_report = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sweep_report
_spec.loader.exec_module(sweep_report)


def test_point_done(tmp_path):
    assert not point_done(tmp_path, steps=4)  # no summary
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 3}))
    assert not point_done(tmp_path, steps=4)  # interrupted before the last step
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4}))
    assert point_done(tmp_path, steps=4)
    (tmp_path / "summary.json").write_text('{"steps": 4')  # torn write
    assert not point_done(tmp_path, steps=4)


def _sigmoid(C, *, A, B, C_mid, R0):  # paper Eq. 1, written out here independently of scaling/fit.py
    return R0 + (A - R0) / (1.0 + (C_mid / C) ** B)


def _write_run(d: Path, *, A: float, B: float, C_mid: float, R0: float, finished: bool, override: str) -> None:
    d.mkdir(parents=True)
    (d / ".hydra").mkdir()
    (d / ".hydra" / "overrides.yaml").write_text(f"- {override}\n")
    C = np.concatenate([[0.0], np.geomspace(0.05, 20.0, 16)])
    R = np.where(C > 0, _sigmoid(np.maximum(C, 1e-12), A=A, B=B, C_mid=C_mid, R0=R0), R0)
    with open(d / "metrics.jsonl", "w") as f:
        for i, (c, r) in enumerate(zip(C, R)):
            f.write(json.dumps({"kind": "train", "step": i, "compute_device_hours": float(c)}) + "\n")
            f.write(json.dumps({"kind": "validation", "step": i, "val_pass_rate": float(r),
                                "compute_device_hours": float(c)}) + "\n")
    if finished:
        (d / "summary.json").write_text(json.dumps({"steps": 16}))


def test_sweep_report_fits_each_point(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _write_run(sweep / "a", A=0.8, B=1.5, C_mid=2.0, R0=0.1, finished=True, override="experiment=scalerl")
    _write_run(sweep / "b", A=0.6, B=1.0, C_mid=1.0, R0=0.1, finished=False, override="experiment=loo_dapo")
    (sweep / "empty").mkdir()  # not a point
    md, plots, points = sweep_report.write_report(sweep, out_dir=sweep, x="compute_device_hours")
    assert [p.name for p in points] == ["experiment=scalerl", "experiment=loo_dapo"]
    assert [p.finished for p in points] == [True, False]
    a, b = points
    assert a.fit.A == pytest.approx(0.8, abs=0.011) and b.fit.A == pytest.approx(0.6, abs=0.011)
    assert a.fit.C_mid == pytest.approx(2.0, rel=0.1) and b.fit.C_mid == pytest.approx(1.0, rel=0.1)
    assert [p.name for p in plots] == ["sweep_curves.png"] and plots[0].stat().st_size > 1000
    text = md.read_text()
    assert text.count("| experiment=") == 2
    # one identification rule everywhere (scaling.identify.assess): the same verdict as scalerl-fit's
    from scalerl_mega.scaling.cli import main as fit_main

    for p in points:
        assert fit_main([str(p.path), "--x", "compute_device_hours", "--json", "--holdout", "0"]) == 0
        row = json.loads(capsys.readouterr().out)["runs"][0]
        assert p.assessment.identified == row["identified"] and p.assessment.reason == row["reason"]
        cell = f"| {row['A']:.3f} |" if row["identified"] else "| not identified |"
        line = next(x for x in text.splitlines() if x.startswith(f"| {p.name} |"))
        assert cell in line and f"{row['A_interval'][0]:.3f}..{row['A_interval'][1]:.3f}" in line


def test_sweep_report_does_not_call_a_five_point_fit_identified(tmp_path, capsys):
    """A reported case: 5 validation points (4 after C = 0) fit well, but the rule needs >= 8 after the cut: the
    report says "not identified" with that reason, like scalerl-fit and report.md."""
    sweep = tmp_path / "sweep"
    d = sweep / "short"
    d.mkdir(parents=True)
    C = [0.0, 0.5, 1.0, 2.0, 4.0]
    with open(d / "metrics.jsonl", "w") as f:
        for i, c in enumerate(C):
            r = 0.1 + (0.72 - 0.1) / (1 + (1.0 / c) ** 1.5) if c else 0.1
            f.write(json.dumps({"kind": "validation", "step": i, "val_pass_rate": r, "compute_device_hours": c})
                    + "\n")
    md, _, points = sweep_report.write_report(sweep, out_dir=sweep, x="compute_device_hours")
    assert not points[0].assessment.identified and "need >= 8" in points[0].assessment.reason
    line = next(x for x in md.read_text().splitlines() if x.startswith("| short |"))
    assert "| not identified |" in line and "no: " in line and "yes" not in line.split("|")[-2]
    assert sweep_report.main([str(sweep)]) == 0
    assert "x axis: compute_device_hours (--x auto: no run logged GPU-hours" in capsys.readouterr().out


def test_sweep_report_cli_errors(tmp_path, capsys):
    assert sweep_report.main([str(tmp_path / "missing")]) == 2
    assert sweep_report.main([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_skip_done_launcher_launches_only_unfinished(tmp_path):
    from omegaconf import OmegaConf

    from scalerl_mega.cluster.sweep import _SkipDoneLauncher

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"steps": 4}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps({"steps": 2}))  # interrupted

    class Loader:  # composes a point as Hydra's loader would: subdir from the override value
        def load_sweep_config(self, master, overrides):
            name = overrides[0].split("=")[1]
            return OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": name}, "job": {}},
                                     "train": {"steps": 4}})

    class Inner:
        def __init__(self):
            self.calls = []

        def launch(self, job_overrides, initial_job_idx):
            self.calls.append(([list(o) for o in job_overrides], initial_job_idx))
            return ["ret"] * len(job_overrides)

    inner = Inner()
    lau = _SkipDoneLauncher(inner, config_loader=Loader(), config=None)
    assert lau.launch([["p=a"], ["p=b"], ["p=c"]], initial_job_idx=0) == ["ret", "ret"]
    assert inner.calls == [([["p=b"], ["p=c"]], 1)]  # b and c keep job numbers 1 and 2
    assert [ov for ov, _ in lau.skipped] == [["p=a"]]
    assert lau.launch([["p=a"]], initial_job_idx=3) == [] and len(inner.calls) == 1  # nothing to launch
    # a finished point in the middle splits the launch in two, each at its own job index
    inner.calls.clear()
    assert lau.launch([["p=b"], ["p=a"], ["p=c"], ["p=d"]], initial_job_idx=5) == ["ret"] * 3
    assert inner.calls == [([["p=b"]], 5), ([["p=c"], ["p=d"]], 7)]
