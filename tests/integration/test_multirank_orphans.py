"""kill -9 of the torchrun agent of a 2-rank `scalerl-train` job: both ranks notice that their launcher
is gone and exit, and so does every process the controller started (engine, reward worker, Megatron's
checkpoint results-queue managers, multiprocessing resource trackers) -- nothing stays orphaned
waiting out `train.follower_timeout_s` (a follower was found alive 53 minutes after a run)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from multirank_util import COMMON, REPO, TORCHRUN, records
from scalerl_mega.preemption import describe_process, is_running

pytestmark = pytest.mark.slow  # ~60-80 s on 2 cores; tests/unit/test_preemption_children.py is the fast check

BOUND_S = 10.0
"""Rank watch (1 s) -> the controller's children's watch (<= 1 s) -> resource trackers (pipe EOF), with
margin for a loaded 2-core machine."""


def test_kill_nine_torchrun_agent_leaves_no_rank_or_child(tmp_path):
    out = tmp_path / "run"
    saved = out / "checkpoints" / "step_00000001"
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node=2", "-m", "scalerl_mega.train", *COMMON, "sft.steps=0",
           "train.steps=50", "train.save_every=1", f"output_dir={out}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(tmp_path / "job.log", "w") as log:
        agent = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 400
        while not ((out / "metrics.jsonl").exists() and records(out) and saved.is_dir()):
            assert agent.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not save step 1"
            time.sleep(0.2)
        tree = [c.pid for c in psutil.Process(agent.pid).children(recursive=True)]
        names = " ".join(describe_process(p) for p in tree)
        assert names.count("scalerl_mega.train") >= 2 and "resource_tracker" in names, names  # 2 ranks + helpers
        agent.kill()
        killed = time.monotonic()
        agent.wait(timeout=600)
        while (alive := [p for p in tree if is_running(p)]) and time.monotonic() < killed + BOUND_S:
            time.sleep(0.1)
        assert not alive, f"alive {BOUND_S:g} s after the agent's kill -9: {[describe_process(p) for p in alive]}"
    finally:
        for pid in tree:
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()
            agent.wait()
