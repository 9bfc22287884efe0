"""SIGTERM (what Slurm sends at preemption, time limit and scancel) during an RL run: the trainer
checkpoints at the next safe point, stops the engine and reward workers it started, exits 0, and the
rerun resumes from that checkpoint. Slurm signals every process of the step, so the signal goes to the
run's whole process group (`kill -TERM -<pgid>`): the children ignore it and leave the stop to the
trainer. After `kill -9` of the trainer no process it started outlives it by more than 5 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerl_mega.preemption import describe_process, is_running

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


def _start(cmd: list[str], log_path: Path, out: Path, *, steps_before) -> tuple[subprocess.Popen, list[int]]:
    """Start the run as its own process group (as `srun`/a shell job would); once
    `steps_before(logged train steps)` holds, return it with the pids of all its descendants."""
    import psutil

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(log_path, "w") as log:
        job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not steps_before(_train_steps(out)):
            assert job.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.2)
        return job, [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
    except BaseException:
        _kill_group(job)
        raise


def _kill_group(job: subprocess.Popen) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


@pytest.mark.timeout(600)
def test_group_sigterm_checkpoints_exits_zero_resumes_and_kill_9_leaves_no_process(tmp_path):
    """SIGTERM to the run's process group mid-run: exit 0 with a checkpoint, nothing lost. The rerun
    resumes at that step; it is then `kill -9`ed after a save (so Megatron's results-queue manager
    exists): engine, reward worker, that manager and the multiprocessing resource tracker are all gone
    within 5 s (one test: each phase needs a fresh run, ~25 s on 2 cores)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "scalerl_mega.train", *TINY, f"output_dir={out}", "train.steps=200"]
    job, children = _start(cmd, tmp_path / "first.log", out, steps_before=lambda steps: len(steps) >= 2)
    try:
        assert children  # the engine process and reward workers
        os.killpg(job.pid, signal.SIGTERM)  # every process of the run, as Slurm does
        rc = job.wait(timeout=600)  # train.sigterm_grace_s=120 bounds it
    finally:
        if job.poll() is None:
            _kill_group(job)
    text = (tmp_path / "first.log").read_text()
    assert rc == 0, text[-3000:]
    stopped = _train_steps(out)[-1]
    assert f"preempted: checkpoint saved at step {stopped}" in text
    assert (out / "checkpoints" / f"step_{stopped:08d}").is_dir()  # save_every=0: only the SIGTERM save
    assert json.loads((out / "summary.json").read_text())["preempted"] is True
    deadline = time.monotonic() + 30  # a reaped child may take a moment to vanish on a loaded machine
    while (alive := [p for p in children if is_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"processes left running 30 s after the trainer exited on SIGTERM: {alive}"

    # rerun: resumes from the SIGTERM checkpoint; kill -9 it once it has trained and saved one more step
    saved = out / "checkpoints" / f"step_{stopped + 1:08d}"
    job, children = _start([*cmd, "train.save_every=1"], tmp_path / "rerun.log", out,
                           steps_before=lambda steps: len(steps) > stopped and saved.is_dir())
    try:
        names = " ".join(describe_process(p) for p in children if is_running(p))
        assert "resource_tracker" in names and names.count("spawn_main") >= 3, names  # engine, reward, manager
        job.kill()
        killed = time.monotonic()
        job.wait(timeout=600)
        while (alive := [p for p in children if is_running(p)]) and time.monotonic() < killed + 5.0:
            time.sleep(0.05)
        assert not alive, f"still running 5 s after the trainer's kill -9: {[describe_process(p) for p in alive]}"
    finally:
        for pid in children:  # whatever survived: we started it
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        _kill_group(job)
    rerun = (tmp_path / "rerun.log").read_text()
    assert f"at step {stopped}" in rerun and "resumed from" in rerun, rerun[-3000:]
    steps = _train_steps(out)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > stopped  # nothing lost, nothing repeated

