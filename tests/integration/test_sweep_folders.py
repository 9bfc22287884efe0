"""Multirun point folders: named by the point's overrides (safe characters, unique per point) by the
default sweeper, and a `hydra.sweep.subdir` that gives two points one folder refused before any point runs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from scalerl_mega.cluster.sweep import SUBDIR_MAX, point_subdir

REPO = Path(__file__).resolve().parents[2]


def test_point_subdir_names():
    assert point_subdir(["experiment=demo", "loss=dapo"]) == "experiment=demo,loss=dapo"
    raw = "sft.checkpoint=/tmp/x y/a"
    assert point_subdir([raw]) == "sft.checkpoint=_tmp_x_y_a-" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    # differing only in characters that are made `_`: still two folders
    assert point_subdir(["a=x/y"]) != point_subdir(["a=x_y"]) and point_subdir(["a=x_y"]) == "a=x_y"
    long = [f"k{i}=v{i}" for i in range(40)]  # 299 characters: cut to SUBDIR_MAX plus the hash
    name = point_subdir(long)
    assert len(name) == SUBDIR_MAX + 9 and name[:SUBDIR_MAX] == ",".join(long)[:SUBDIR_MAX]
    assert name != point_subdir(long[:-1])


def _train(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "scalerl_mega.train", "--validate", "-m", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_loss_sweep_folders_are_named_by_overrides_and_run_name_subdir_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    r = _train(tmp_path, "experiment=demo", "loss=cispo,dapo", "train.steps=7", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    # named by the overrides, the swept one first (train.steps left out); not 0, 1
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["loss=cispo,experiment=demo",
                                                                     "loss=dapo,experiment=demo"]
    assert f"output_dir={sweep}/loss=dapo,experiment=demo" in r.stdout
    refused = tmp_path / "refused"
    r = _train(tmp_path, "experiment=demo", "loss=cispo,dapo", f"hydra.sweep.dir={refused}",
               "hydra.sweep.subdir=${run_name}")
    assert r.returncode == 2 and "config OK" not in r.stdout
    assert r.stderr.strip().splitlines()[-1] == (
        f"config error: hydra.sweep.subdir=${{run_name}} gives 2 points of this sweep one folder, {refused}/demo "
        "(experiment=demo loss=cispo; experiment=demo loss=dapo), so they would overwrite each other's run: drop "
        "hydra.sweep.subdir (the default names each point's folder by its overrides) or make it differ per point "
        "(e.g. ${hydra.job.num}); nothing was launched")
    assert not (refused / "demo").exists()


def test_the_docs_sweep_folder_command(tmp_path):
    """docs/running_scalerl.md's CPU sweep check, as written (/tmp/ moved here): the folders it says."""
    from tests.integration.test_docs_commands import as_argv, doc_commands

    doc, cmd = next((d, c) for d, c in doc_commands() if "sweep-check" in c)
    assert doc == "docs/running_scalerl.md"
    argv, env = as_argv(cmd, "run", tmp_path)
    r = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = re.search(r"# (\S+) and (\S+)$", (REPO / doc).read_text().split(cmd.split("#")[0].strip())[1]
                     .splitlines()[0]).groups()
    assert sorted(p.name for p in (tmp_path / "sweep-check").iterdir() if p.is_dir()) == sorted(said)
