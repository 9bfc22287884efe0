"""`hydra/sweeper=skip_done` through Hydra itself: the project's config tree (conf/), the plugin
discovered in the `hydra_plugins` namespace package, the basic (local) launcher.

The task function is a stand-in for `scalerl-train` that writes what the real one writes at the end
of a run -- `summary.json` with the steps reached -- and logs each launch. The point `seed=0`
finishes, `seed=1` is "interrupted" (summary one step short). An identical second multirun must
launch only `seed=1`, in its own folder (named by its overrides less `train.steps`: `seed=1,experiment=demo`).
A last test runs the real `scalerl-train -m` twice on two tiny points (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STAND_IN = r"""
import json, sys
from pathlib import Path
import hydra
from scalerl_mega.config import register_configs

register_configs()

@hydra.main(version_base="1.3", config_path=sys.argv.pop(1), config_name="train")
def task(cfg):
    out = Path(cfg.output_dir)
    steps = int(cfg.train.steps) - (1 if int(cfg.seed) == 1 else 0)  # seed=1: interrupted run
    (out / "summary.json").write_text(json.dumps({"steps": steps}))
    with open(LOG, "a") as f:
        f.write(json.dumps({"seed": int(cfg.seed), "dir": str(out)}) + "\n")

LOG = sys.argv.pop(1)
task()
"""


def _multirun(sweep_dir: Path, log: Path, *extra: str) -> subprocess.CompletedProcess:
    # `python -c` from the repository root: sys.path[0] is the root, as for `python -m scalerl_mega.train`
    cmd = [sys.executable, "-c", STAND_IN, str(REPO / "conf"), str(log), "-m", "experiment=demo", "seed=0,1",
           "train.steps=3", "hydra/sweeper=skip_done", "hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}",
           *extra]
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"multirun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _launches(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


P0, P1 = "seed=0,experiment=demo", "seed=1,experiment=demo"  # the points' folders (what differs first)


def test_second_multirun_skips_finished_points(tmp_path):
    sweep, log = tmp_path / "sweep", tmp_path / "launches.jsonl"
    _multirun(sweep, log)
    first = _launches(log)
    assert [(r["seed"], Path(r["dir"]).name) for r in first] == [(0, P0), (1, P1)]
    assert json.loads((sweep / P0 / "summary.json").read_text()) == {"steps": 3}
    assert json.loads((sweep / P1 / "summary.json").read_text()) == {"steps": 2}

    proc = _multirun(sweep, log)
    second = _launches(log)[len(first):]
    assert [(r["seed"], Path(r["dir"]).name) for r in second] == [(1, P1)]  # only the unfinished point
    assert "skip" in proc.stdout + proc.stderr and "seed=0" in proc.stdout + proc.stderr

    # a larger train.steps makes both points unfinished again: both run, in their folders (train.steps is not
    # part of a folder's name)
    _multirun(sweep, log, "train.steps=4")
    third = _launches(log)[len(first) + len(second):]
    assert [(r["seed"], Path(r["dir"]).name) for r in third] == [(0, P0), (1, P1)]


def test_plugin_is_a_namespace_portion():
    """`hydra_plugins` must stay a namespace package (no __init__.py) shared with other plugins,
    and Hydra must list the sweeper among its plugins."""
    assert not (REPO / "hydra_plugins" / "__init__.py").exists()
    code = ("from hydra.core.plugins import Plugins; from hydra.plugins.sweeper import Sweeper; "
            "from hydra.plugins.launcher import Launcher; "
            "print([f'{c.__module__}.{c.__name__}' for c in Plugins.instance().discover(Sweeper)]); "
            "print([f'{c.__module__}.{c.__name__}' for c in Plugins.instance().discover(Launcher)])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    sweepers, launchers = proc.stdout.splitlines()[-2:]
    assert "hydra_plugins.scalerl_skip_done.SkipDoneSweeper" in sweepers
    assert "hydra_plugins.scalerl_skip_done.ScalerlSweeper" in sweepers
    assert "hydra_plugins.hydra_submitit_launcher" in launchers  # the installed portion is still found


@pytest.mark.slow
def test_real_train_multirun_twice(tmp_path):
    """`scalerl-train -m` on two tiny points, then the same command again: nothing is launched."""
    sweep = tmp_path / "sweep"
    tiny = ["experiment=demo", "sft.steps=0", "filter=none", "data.synthetic_num_prompts=100",
            "data.val_prompts=4", "data.val_samples=1", "train.steps=2", "train.prompts_per_step=2",
            "train.generations_per_prompt=2", "train.val_every=0", "train.save_every=0",
            "rollout.max_batch_size=4", "length.max_new_tokens=16", "length.interruption_min=8",
            "length.interruption_max=10", "length.answer_budget=4", "metrics.tensorboard=false"]
    cmd = [sys.executable, "-m", "scalerl_mega.train", "-m", *tiny, "seed=0,1", "hydra/sweeper=skip_done",
           "hydra/launcher=basic", f"hydra.sweep.dir={sweep}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    points = [p.name for p in sorted(sweep.iterdir()) if p.is_dir()]
    assert len(points) == 2 and [p[:7] for p in points] == ["seed=0,", "seed=1,"], points
    for d in points:
        assert json.loads((sweep / d / "summary.json").read_text())["steps"] == 2
    mtimes = {d: (sweep / d / "metrics.jsonl").stat().st_mtime_ns for d in points}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert {d: (sweep / d / "metrics.jsonl").stat().st_mtime_ns for d in points} == mtimes
    assert (proc.stdout + proc.stderr).count("skip") >= 2
