"""Re-running a finished run rewrote its report.md and summary.json with the resume's timings
(wall 13 s, SFT 0 s, RL 2 s). A launch whose checkpoint is at `train.steps` builds nothing and keeps both files; a
resumed run that trains reports the sums over its launches (the end-to-end run: tests/faults/test_sigint.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl_mega.train import launch_timings, run_job
from tests.support.fake_checkpoint import save_fake_checkpoint


def _checkpoint(out: Path, step: int) -> None:
    """What `checkpoint.loadable_step` reads: `latest` -> a step directory that verifies."""
    save_fake_checkpoint(out / "checkpoints", step)


def _config(out: Path, steps: int):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", f"output_dir={out}", f"train.steps={steps}"], preflight=False)


def test_a_finished_run_launched_again_builds_nothing_and_keeps_its_files(tmp_path, monkeypatch, caplog):
    import logging

    import scalerl_mega.build as build

    monkeypatch.setattr(build, "build_task", lambda *_: pytest.fail("a finished run must not build anything"))
    _checkpoint(tmp_path, 80)
    saved = {"steps": 80, "wall_s": 412.0, "sft_s": 130.0, "rl_s": 240.0, "preempted": False}
    (tmp_path / "summary.json").write_text(json.dumps(saved))
    (tmp_path / "report.md").write_text("# the run's own report\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with caplog.at_level(logging.INFO, logger="scalerl_mega.train"):
        summary = run_job(_config(tmp_path, 80))
    assert summary == {**saved, "exit_status": 0}
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert "already finished at step 80 (train.steps=80): nothing to train" in caplog.text


def test_a_run_with_steps_left_is_not_finished(tmp_path):
    from scalerl_mega.train import _finished_run

    _checkpoint(tmp_path, 80)
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 80}))
    assert _finished_run(_config(tmp_path, 120), out=tmp_path) is None  # train.steps raised: train on
    assert _finished_run(_config(tmp_path / "elsewhere", 80), out=tmp_path / "elsewhere") is None  # no checkpoint


def test_launch_timings_add_this_launch_to_the_saved_ones():
    first = {"wall_s": 400.0, "sft_s": 130.0, "rl_s": 200.0, "steps": [0, 40], "preempted": True}
    second = {"wall_s": 220.0, "sft_s": 0.0, "rl_s": 190.0, "steps": [40, 80], "preempted": False}
    assert launch_timings(None, first) == [first]
    assert launch_timings({"launches": [first], "wall_s": 400.0}, second) == [first, second]
    # a summary.json written before launches were recorded counts as one launch
    old = {"wall_s": 400.0, "sft_s": 130.0, "rl_s": 200.0, "steps": 40}
    assert launch_timings(old, second) == [{"wall_s": 400.0, "sft_s": 130.0, "rl_s": 200.0, "steps": [None, 40]},
                                           second]
