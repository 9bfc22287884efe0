"""tools/gpu_check.sh's deadline and install stage, cheaply (no stage runs a model): a deadline too short for
any stage marks each not reached; a wheel folder with two versions of one distribution, or a wheel that would
install over the device's torch, fails the install before pip runs, and the output folder still holds the
versions, the error and summary.json. The interpreter is the bare base Python (no torch, no megatron-core)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str, wheels: list[str] = (), py: str | None = None):
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in wheels:
        (folder / name).write_bytes(b"not a wheel: pip must never see it")
    out = tmp_path / "out"
    env = dict(os.environ, GPU_PY=py or sys.executable, GPU_WHEELS=str(folder), TMPDIR=str(tmp_path),
               GPU_SITE=str(tmp_path / "site"))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), "--cpu", str(out), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def _statuses(out: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads((out / "summary.json").read_text())["stages"].items()}


def test_a_deadline_too_short_for_any_stage_marks_each_not_reached(tmp_path):
    proc, out = _run(tmp_path, "--deadline", "5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(out) == {"versions": "not reached", "install": "skipped", "gpu_suite": "not reached",
                              "head": "not reached", "rl_loop": "not reached"}
    assert "versions not reached" in (out / "versions.txt").read_text()


@pytest.mark.parametrize("arg", ["abc", "-1"])
def test_a_bad_deadline_is_refused_by_name(tmp_path, arg):
    proc, out = _run(tmp_path, "--deadline", arg)
    assert proc.returncode == 2 and f"--deadline '{arg}' is not a whole number of seconds" in proc.stderr


BASE_PY = getattr(sys, "_base_executable", sys.executable)
"""The venv's base interpreter: no torch, megatron-core or hydra, like a GPU machine's before the install."""


@pytest.mark.parametrize("wheels,why", [
    (["omegaconf-2.3.0-py3-none-any.whl", "omegaconf-2.2.3-py3-none-any.whl"],
     "2 versions of omegaconf in the wheel folder"),
    (["omegaconf-2.3.0-py3-none-any.whl", "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"],
     "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl would install over the device's torch"),
    ([], "has no wheels (make gpu-wheels)"),
])
def test_a_bad_wheel_folder_fails_the_install_and_keeps_the_versions(tmp_path, wheels, why):
    proc, out = _run(tmp_path, wheels=wheels, py=BASE_PY)
    assert proc.returncode == 1
    assert why in proc.stderr and why in (out / "versions.txt").read_text()
    assert _statuses(out) == {"versions": "done", "install": "failed", "gpu_suite": "not reached",
                              "head": "not reached", "rl_loop": "not reached"}
    s = json.loads((out / "summary.json").read_text())
    assert s["versions"]["python"] and s["versions"]["megatron-core"] is None
    assert "megatron-core: not installed (rehearsed 0.16.1 .. 0.19.2)" in s["version_mismatches"]
    assert not (tmp_path / "site").exists()  # pip never ran
