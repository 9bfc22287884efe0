"""`python -m reproduction.reproduce sweep` (what `make reproduce-sweep` runs) on two tiny points of one seed:
the first recipe runs the warm start and saves it to <sweep>/sft, the second loads it; an identical
second invocation launches nothing (skip-done) and both invocations are recorded in provenance.jsonl.
Then `analyse` collects both runs. Slow: two real trainer + engine runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["sft.steps=3", "train.steps=2", "train.val_every=1", "train.save_every=0", "data.val_prompts=8",
        "data.val_samples=2", "train.prompts_per_step=4", "train.generations_per_prompt=2",
        "rollout.max_batch_size=8", "metrics.tensorboard=false"]


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two real runs and two Hydra launches: ~4 min alone, far more on a loaded machine
def test_sweep_shares_the_warm_start_and_skips_finished_points(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "reproduction.reproduce", "sweep", "--design", "loo", "--sweep-dir", str(sweep),
           "--seeds", "0", "--overlays", "loo_scalerl,loo_dapo", *TINY]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1")
    first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-6000:]
    assert "sft: saved the warm start to" in log and "sft: loaded the shared warm start from" in log
    assert (sweep / "loo_scalerl" / "seed0" / "sft.jsonl").is_file()
    assert not (sweep / "loo_dapo" / "seed0" / "sft.jsonl").exists()  # loaded, not rerun
    for rec in ("loo_scalerl", "loo_dapo"):
        assert json.loads((sweep / rec / "seed0" / "summary.json").read_text())["steps"] == 2
    mtimes = {p: p.stat().st_mtime_ns for p in sweep.glob("loo_*/seed0/metrics.jsonl")}

    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    assert (second.stdout + second.stderr).count("skip seed=0") == 2
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    prov = [json.loads(x) for x in (sweep / "provenance.jsonl").read_text().splitlines()]
    assert [p["rc"] for p in prov] == [0, 0] and all(
        "experiment=reproduction/loo_scalerl,reproduction/loo_dapo" in p["command"] for p in prov)

    from reproduction.common import collect

    assert collect(sweep, tmp_path / "out" / "runs", run_names=("loo_scalerl", "loo_dapo")) == [
        "scalerl/seed0", "dapo/seed0"]


def _train_steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(x).get("kind") == "train"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_killed_sweep_resumes_its_unfinished_point(tmp_path):
    """`make reproduce` in pieces. The whole sweep (process group: sweep -> Hydra -> trainer,
    engine, reward workers) is SIGKILLed once its point has logged step 3 (checkpoints every 2 steps); the
    same command then skips nothing (the point has no summary.json), resumes the point from its checkpoint
    (resume=auto) and finishes it with every step logged exactly once; the run records the commit."""
    import signal
    import time

    sweep = tmp_path / "sweep"
    run = sweep / "predictability" / "seed0"
    cmd = [sys.executable, "-m", "reproduction.reproduce", "sweep", "--design", "predictability", "--sweep-dir",
           str(sweep), "--seeds", "0", *[o for o in TINY if not o.startswith(("train.steps=", "train.save_every="))],
           "train.steps=8", "train.save_every=2", "data.synthetic_num_prompts=2000", "sft.synthetic_num_prompts=1000"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            if (run / "metrics.jsonl").is_file() and any(s >= 3 for s in _train_steps(run)):
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("step 3 never logged")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=600)
    assert not (run / "summary.json").exists() and (run / "checkpoints" / "latest").exists()
    killed_at = max(_train_steps(run))
    assert 3 <= killed_at < 8

    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-6000:]
    assert "skip seed=0" not in log and "resumed from" in log
    assert _train_steps(run) == list(range(1, 9))  # none lost, none repeated
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
    prov = json.loads((run / "provenance.json").read_text())
    assert "experiment=reproduction/predictability" in prov["command"] and prov["finished"] >= prov["started"]
    assert prov["commit"] is None or len(prov["commit"]) == 40  # None outside a checkout
    # the run's own record of its launches (metrics/provenance.py): killed at step k, resumed from its checkpoint
    from scalerl_mega.metrics.provenance import read_segments, trained_by

    segs = read_segments(run)
    assert len(segs) == 2 and segs[0]["steps"][0] == 0 and segs[0]["steps"][1] is None  # the kill left it open
    resumed_from = segs[1]["steps"][0]
    assert 2 <= resumed_from <= killed_at and segs[1]["steps"][1] == 8 and segs[1]["preempted"] is False
    assert [t["steps"] for t in trained_by(segs)] == [[0, resumed_from], [resumed_from, 8]]
