"""End to end: a custom reward that raises (`return float(completion)`) made every sample score -1 and the
run "succeed" without one trained step, the exception in no console line, log or metrics row. Now the run stops at
the first step whose samples all fail, with one line (exit status 1, no traceback of its own), and the reward's
first traceback is in the console and in the run's train.log (named by its path: under output_dir), once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.test_sigterm import TINY, _train_steps

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_a_raising_custom_reward_stops_the_run_with_one_line_and_its_traceback_logged_once(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "scalerl_mega.train", *TINY, "train.steps=5",
                        "reward=custom_example", "reward.custom._target_=tests.faults.raising_reward.score",
                        f"output_dir={out}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=500)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    m = re.match(r"reward error: all 16 samples of step (\d+) failed to score, e.g. ValueError at raising_reward.py:6: "
                 r"could not convert string to float: .*reward.stop_error_rate=null to train on", last)
    assert m, last
    assert f"the first traceback of each error is logged above and in {out / 'train.log'}." in last  # its real path
    console = r.stdout + r.stderr
    assert console.count("Traceback (most recent call last)") == 1  # the reward's, logged once; none for the stop
    assert "return float(completion)" in console
    log = (out / "train.log").read_text()
    assert "reward scoring failed: error: ValueError at raising_reward.py:6" in log and "return float(completion)" in log
    # the steps before it (a random policy sometimes writes a number) were trained with their errors counted
    stop = int(m.group(1))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] if stop > 1 else []
    train = [x for x in rows if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, stop)) == _train_steps(out)
    for x in train:
        assert 0 < x["reward/errors"] < 16 and x["reward/errors_by_kind"] == {
            "ValueError at raising_reward.py:6": x["reward/errors"]}
