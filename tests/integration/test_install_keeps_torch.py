"""`pip install -e .` into an environment that already holds an in-range torch keeps that torch (a
container's own CUDA build must not be replaced; pyproject.toml states ranges, not pins).

Real installs from the package index into a fresh venv: the running interpreter's torch release (in
`make test-compat`: torch 2.14.1 for CPython 3.12, not the Makefile's 2.13.0) first, then the project
with its dependencies. Marked `network` and `slow` (a few minutes, GBs on disk while it runs); run by
`make test-compat`. Skipped where the running torch is the Makefile's own release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import importlib.metadata as md, os, torch; f = torch.__file__; "
         "print(md.version('torch'), f, os.stat(f).st_mtime_ns)")


def _makefile_torch() -> str:
    return re.search(r"pip install -q torch==(\S+)", (REPO / "Makefile").read_text()).group(1)


def _torch_requirement() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if re.match(r"torch\b", d))


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)


def _run(cmd: list[str], *, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pip_install_e_keeps_an_installed_in_range_torch(tmp_path):
    from packaging.specifiers import SpecifierSet
    from packaging.requirements import Requirement

    import torch

    have = torch.__version__.split("+")[0]
    if have == _makefile_torch():
        pytest.skip(f"needs a torch other than the Makefile's {have} (run by `make test-compat`)")
    spec = Requirement(_torch_requirement()).specifier
    assert SpecifierSet(str(spec)).contains(have), f"torch {have} is outside pyproject's {spec}"
    src, venv = tmp_path / "src", tmp_path / "venv"
    _copy_tree(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    try:
        _run([sys.executable, "-m", "venv", str(venv)], env=env, timeout=300)
        py = str(venv / "bin" / "python")
        _run([py, "-m", "pip", "install", "-q", f"torch=={have}"], env=env, timeout=900)
        before = _run([py, "-c", PROBE], env=env, timeout=300).stdout.split()
        assert before[0] == have
        inst = _run([py, "-m", "pip", "install", "-e", str(src)], env=env, timeout=1200)
        after = _run([py, "-c", PROBE], env=env, timeout=300).stdout.split()
        assert after == before, f"torch replaced: {before} -> {after}"
        assert "Uninstalling torch" not in inst.stdout
        # the project's own dependencies came from the index around it and import together with it
        got = _run([py, "-c", "import importlib.metadata as md, megatron.core, transformers, scalerl_mega.loop; "
                    "print(md.version('megatron-core'), md.version('transformers'))"], env=env, timeout=600)
        mcore, tf = got.stdout.split()
        deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        for name, version in (("megatron-core", mcore), ("transformers", tf)):
            req = Requirement(next(d for d in deps if d.startswith(name)))
            assert req.specifier.contains(version), (name, version, req)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # GBs of CUDA wheels: not left for pytest's tmp retention
