"""`tools/gpu_check.sh --cpu` killed part-way, as a GPU session's command limit would: summary.json still exists
and names each stage done / killed / running / not reached. The kill points are chosen with the script's hold
hook (GPU_CHECK_HOLD_AT: the script stops at that point, creates <point>.reached and waits), not with delays:
- SIGTERM to the script while it waits at the GPU suite's start: the exit trap records the suite as killed;
- the outer timeout's SIGKILL to the script's whole process group at the same point: no trap runs, the summary
  written at that stage's start says what finished and which stage was running;
- SIGTERM while bench/rl_loop.py waits between run A and the resume (slow: run A trains): the trap stops the
  stage's process group, and rl_loop.json keeps run A's step table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REACHED_WITHIN_S = 600
"""Only a bound for a hung script (the hold point is normally reached in seconds); never a kill delay."""


def _start(tmp_path: Path, point: str) -> tuple[subprocess.Popen, Path]:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.mkdir()
    env = dict(os.environ, GPU_PY=sys.executable, GPU_WHEELS=str(tmp_path / "no-wheels"), TMPDIR=str(tmp_path),
               OMP_NUM_THREADS="1", GPU_CHECK_HOLD_AT=point, GPU_CHECK_HOLD_DIR=str(hold))
    proc = subprocess.Popen(["bash", str(REPO / "tools" / "gpu_check.sh"), "--cpu", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    t0 = time.monotonic()
    while not (hold / f"{point}.reached").exists():
        if proc.poll() is not None or time.monotonic() - t0 > REACHED_WITHIN_S:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"never reached {point}: rc {proc.poll()}\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.05)
    return proc, out


def _statuses(out: Path) -> dict[str, str]:
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] is False and s["mode"] == "cpu"
    return {name: st["status"] for name, st in s["stages"].items()}


def test_sigterm_in_the_gpu_suite_leaves_a_summary_naming_what_finished(tmp_path):
    proc, out = _start(tmp_path, "gpu_suite")
    os.kill(proc.pid, signal.SIGTERM)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, log[-3000:]
    assert _statuses(out) == {"versions": "done", "install": "skipped", "gpu_suite": "killed",
                              "head": "not reached", "rl_loop": "not reached"}
    s = json.loads((out / "summary.json").read_text())
    assert s["versions"]["torch"] and s["gpu_suite"] == {"summary_line": False}
    assert "gpu_suite: killed" in log  # the trap prints the summary's stage line
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("scalerl-gpu-check")] == []  # work dir removed


def test_outer_timeout_sigkill_leaves_the_summary_of_the_last_stage_start(tmp_path):
    proc, out = _start(tmp_path, "gpu_suite")
    os.killpg(proc.pid, signal.SIGKILL)  # `timeout -s KILL` on the whole command: no trap runs
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    assert _statuses(out) == {"versions": "done", "install": "skipped", "gpu_suite": "running",
                              "head": "not reached", "rl_loop": "not reached"}
    s = json.loads((out / "summary.json").read_text())
    assert s["versions"]["torch"] and s["stages"]["gpu_suite"]["limit_s"] > 0
    assert s["gpu_suite"] == {"summary_line": False} and s["head"] == {"measured": False}


@pytest.mark.slow
def test_sigterm_before_the_resume_keeps_run_a_and_stops_the_stage(tmp_path):
    proc, out = _start(tmp_path, "rl_loop.run_b")
    os.kill(proc.pid, signal.SIGTERM)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, log[-3000:]
    assert _statuses(out) == {"versions": "done", "install": "skipped", "gpu_suite": "done", "head": "done",
                              "rl_loop": "killed"}
    s = json.loads((out / "summary.json").read_text())
    rl = s["rl_loop"]
    assert rl["measured"] and rl["steps"] == 4 and rl["params_dtype"] == "bfloat16"
    assert rl["resume"] is None and rl["run_b"] == "not started" and rl["resume_matched"] is None
    assert s["head"]["measured"] and s["head"]["within_bounds"]
    last = json.loads((out / "stages.jsonl").read_text().splitlines()[-1])
    assert last["stage"] == "rl_loop" and last["status"] == "killed"
    # no process of the kit outlives it (the stage ran in its own process group, which the trap stopped)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps
