"""kill -9 the trainer mid-run; `resume=auto` continues from the last checkpoint.

The trainer process (`python -m scalerl_mega.train`, Megatron on CPU) is SIGKILLed after it logged
step 3 (checkpoints every 2 steps). Its engine process is then orphaned: the test records whether it
survived and stops it (the resumed run starts a fresh engine and pushes the checkpoint's weights).
The trained prompt sequence of interrupted + resumed run must equal the uninterrupted run's: no
prompt lost, none repeated, same order (outstanding prompts are re-admitted first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_loop_megatron import REPO, TINY, run_train  # same directory (pytest rootdir import)

pytestmark = pytest.mark.slow

RUN = ["train.steps=6", "train.save_every=2", "train.val_every=0"]


def trained_sequence(out: Path) -> list[str]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 7))
    return [p for r in train for p in r["prompt_ids"]]


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_kill_9_then_resume_auto_same_prompt_sequence(tmp_path):
    import psutil

    full = tmp_path / "full"
    run_train(full, *RUN)
    expected = trained_sequence(full)
    assert len(expected) == 24 and len(set(expected)) == 24

    part = tmp_path / "part"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "scalerl_mega.train", *TINY, f"output_dir={part}", *RUN]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            children = sorted(set(children) | set(_descendants(proc.pid)))
            metrics = part / "metrics.jsonl"
            if metrics.exists() and any(json.loads(x).get("step", 0) >= 3 and json.loads(x)["kind"] == "train"
                                        for x in metrics.read_text().splitlines()):
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("step 3 never logged")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (part / "checkpoints" / "latest").exists()
    # orphaned engine / reward workers: note whether they survived, then stop them (we started them)
    for pid in children:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass

    run_train(part, *RUN, "resume=auto")
    assert trained_sequence(part) == expected
