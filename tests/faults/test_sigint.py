"""Ctrl-C (SIGINT to the run's process group, as a terminal sends it) is handled like SIGTERM: the run
checkpoints at its next safe point and exits 130 without a traceback, and the rerun resumes there; a second
Ctrl-C exits at once, without a checkpoint and without leaving a process; Ctrl-C before the RL loop (nothing to
checkpoint yet) stops with one line. A finished run launched again trains nothing and keeps its report.md and
summary.json. The signal is sent by a hook at a known step (tests/faults/signal_driver.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.test_sigterm import TINY, _train_steps

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "faults" / "signal_driver.py"


def _launch(out: Path, *args: str, log: Path) -> tuple[int, str, int]:
    """Run the driver (or plain `scalerl-train` with args[0] == "-") in a session of its own; returns (exit status,
    console, process group id)."""
    head, overrides = ([sys.executable, "-m", "scalerl_mega.train"], args[1:]) if args[0] == "-" else \
        ([sys.executable, str(DRIVER), *args[:4]], args[4:])
    cmd = [*head, *TINY, *overrides, f"output_dir={out}", f"hydra.run.dir={out}"]  # later overrides win
    return run_in_session(cmd, log=log)


def run_in_session(cmd: list[str], *, log: Path) -> tuple[int, str, int]:
    """Run `cmd` from the repository in a session (process group) of its own, console to `log`; returns (exit
    status, console, process group id). The timeout is a safety net that kills the group, not an assertion."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(log, "w") as fh:
        job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = job.wait(timeout=600)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
    return rc, log.read_text(), job.pid


def _group_left(pgid: int) -> list[int]:
    """Processes still in the run's process group, once they had up to 30 s to go (a loaded machine)."""
    import psutil

    deadline = time.monotonic() + 30
    while True:
        left = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.timeout(600)
def test_ctrl_c_checkpoints_at_the_next_safe_point_and_exits_130_without_a_traceback(tmp_path):
    out = tmp_path / "run"
    rc, text, pgid = _launch(out, "rl", "2", "INT", "1", "train.steps=50", log=tmp_path / "run.log")
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "interrupted: checkpoint saved at step 2; rerun the same command to resume" in text
    assert (out / "checkpoints" / "step_00000002").is_dir() and _train_steps(out) == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["preempted"] is True and summary["stop_signal"] == "SIGINT" and summary["exit_status"] == 130
    assert not _group_left(pgid)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resumed_runs_sum_their_launches_and_a_finished_rerun_keeps_its_report(tmp_path):
    """Ctrl-C at step 2, the rerun finishes step 3 (its report sums both launches' timings), a third launch of
    the finished run trains nothing and rewrites nothing (save_every=0: the stop's checkpoint makes the last step
    saved too, loop._validate_save_or_stop)."""
    out = tmp_path / "run"
    rc, text, _ = _launch(out, "rl", "2", "INT", "1", "train.steps=3", log=tmp_path / "first.log")
    assert rc == 130, text[-3000:]
    rc, text, _ = _launch(out, "-", "train.steps=3", log=tmp_path / "rerun.log")
    assert rc == 0 and "resumed from" in text and "at step 2" in text, text[-3000:]
    assert _train_steps(out) == [1, 2, 3] and (out / "checkpoints" / "step_00000003").is_dir()
    summary = json.loads((out / "summary.json").read_text())
    launches = summary["launches"]  # the report's timings are the sums over the two launches that trained
    assert [x["steps"] for x in launches] == [[0, 2], [2, 3]] and [x["preempted"] for x in launches] == [True, False]
    assert summary["rl_s"] == pytest.approx(sum(x["rl_s"] for x in launches))
    assert "wall time (setup excluded, 2 launches)" in (out / "report.md").read_text()

    kept = {name: (out / name).read_bytes() for name in ("report.md", "summary.json", "metrics.jsonl")}
    rc, text, _ = _launch(out, "-", "train.steps=3", log=tmp_path / "again.log")
    assert rc == 0, text[-3000:]
    assert "already finished at step 3 (train.steps=3): nothing to train; report.md and summary.json kept" in text
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert "trainer built" not in text  # nothing was built


@pytest.mark.timeout(600)
def test_a_second_ctrl_c_exits_at_once_without_a_checkpoint_or_a_process_left(tmp_path):
    out = tmp_path / "run"
    rc, text, pgid = _launch(out, "rl", "2", "INT", "2", "train.steps=50", log=tmp_path / "run.log")
    assert rc == 130, text[-3000:]
    assert "interrupted: second Ctrl-C after SIGINT, exiting now without a checkpoint" in text
    assert "Traceback" not in text, text[-3000:]
    assert not (out / "checkpoints").exists()  # train.save_every=0 and no stop checkpoint
    assert not _group_left(pgid)


@pytest.mark.timeout(600)
def test_ctrl_c_during_the_warm_start_stops_with_one_line(tmp_path):
    out = tmp_path / "run"
    rc, text, pgid = _launch(out, "sft", "1", "INT", "1", "sft.steps=50", "sft.batch_size=4", "train.steps=3",
                             log=tmp_path / "run.log")
    assert rc == 130, text[-3000:]
    assert text.rstrip().endswith("interrupted (Ctrl-C) before the RL loop started: nothing saved by this launch; "
                                  "rerun the same command to start again"), text[-3000:]
    assert "Traceback" not in text
    assert not (out / "checkpoints").exists() and not _train_steps(out)
    assert not _group_left(pgid)
