"""Packaging: `pip install .` into a fresh venv, then `scalerl-train` works outside the repository
(conf/ ships inside the wheel as scalerl_mega/conf/).

To keep it offline and small, the fresh venv (no pip of its own) borrows pip, setuptools and the
third-party packages of the running interpreter through a path file (not processed as a site dir, so
this checkout's editable install is not visible there); scalerl-mega itself is built and installed
from a copy of the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_ships_conf_and_cli_runs_outside_repo(tmp_path):
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path)
    inst = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                           str(src)], capture_output=True, text=True, timeout=600, env=env)
    assert inst.returncode == 0, inst.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run([str(py), "-c", "import scalerl_mega.conf_path as c; print(c.__file__); print(c.conf_dir())"],
                           capture_output=True, text=True, cwd=outside, env=env, check=True).stdout.split()
    assert where[0].startswith(site) and where[1] == str(Path(site) / "scalerl_mega" / "conf")
    cli = venv / "bin" / "scalerl-train"
    helped = subprocess.run([str(cli), "--help"], capture_output=True, text=True, cwd=outside, env=env, timeout=300)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "experiment: " in helped.stdout and "model: hf" in helped.stdout and "reward: custom_example" in helped.stdout
    checked = subprocess.run([str(cli), "--validate", "experiment=demo", f"hydra.run.dir={tmp_path / 'run'}"],
                             capture_output=True, text=True, cwd=outside, env=env, timeout=300)
    assert checked.returncode == 0 and "config OK: model" in checked.stdout, checked.stderr[-3000:]
