"""SIGTERM (what Slurm sends at preemption, time limit and scancel) during an RL run: the trainer
checkpoints at the next safe point, stops the engine and reward workers it started, exits 0, and the
rerun resumes from that checkpoint."""

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
TINY = [
    "experiment=demo", "sft.steps=0", "filter=none", "off_policy.k=2", "data.synthetic_num_prompts=400",
    "data.val_prompts=8", "data.val_samples=2", "train.prompts_per_step=4", "train.generations_per_prompt=4",
    "train.val_every=0", "train.save_every=0", "rollout.max_batch_size=4", "length.max_new_tokens=24",
    "length.interruption_min=12", "length.interruption_max=16", "length.answer_budget=4", "metrics.tensorboard=false",
]


def _train_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if '"kind": "train"' in x]


@pytest.mark.timeout(600)
def test_sigterm_checkpoints_exits_zero_and_resumes(tmp_path):
    import psutil

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "scalerl_mega.train", *TINY, f"output_dir={out}"]
    with open(tmp_path / "first.log", "w") as log:
        job = subprocess.Popen([*cmd, "train.steps=200"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while len(_train_steps(out)) < 2:
            assert job.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.2)
        children = [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
        assert children  # the engine process and reward workers
        job.send_signal(signal.SIGTERM)
        rc = job.wait(timeout=120)  # train.sigterm_grace_s=120 bounds it
    text = (tmp_path / "first.log").read_text()
    assert rc == 0, text[-3000:]
    stopped = _train_steps(out)[-1]
    assert f"preempted: checkpoint saved at step {stopped}" in text
    assert (out / "checkpoints" / f"step_{stopped:08d}").is_dir()  # save_every=0: only the SIGTERM save
    assert json.loads((out / "summary.json").read_text())["preempted"] is True
    deadline = time.monotonic() + 30  # a reaped child may take a moment to vanish on a loaded machine
    while (alive := [p for p in children if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"processes left running 30 s after the trainer exited on SIGTERM: {alive}"
    # rerun: resumes from the SIGTERM checkpoint
    rerun = subprocess.run([*cmd, f"train.steps={stopped + 2}"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"at step {stopped}" in rerun.stdout + rerun.stderr and "resumed from" in rerun.stdout + rerun.stderr
    assert _train_steps(out) == list(range(1, stopped + 3))


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
