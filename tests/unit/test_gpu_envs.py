"""Two GPU environments, one NCCL (cluster/gpu_envs.py, docs/cluster_install.md): the launch-time check
(real probes of two interpreters whose NCCL wheels differ, read from wheel metadata on this CPU machine),
the override logic of `make check-gpu-envs`, and (network + slow) the resolution against the index."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scalerl_mega.cluster import gpu_envs as G

ROOT = Path(__file__).resolve().parents[2]


def fake_env(tmp_path: Path, name: str, nccl: str | None) -> str:
    """An interpreter (this one) whose environment has an `nvidia-nccl-cu13==nccl` wheel installed (its
    dist-info only) and no importable torch (a stub that raises, so the probe is fast): the probe then
    reads the wheel's metadata, as it does under a CPU torch."""
    site = tmp_path / f"{name}-site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('no torch in this test env')\n")
    if nccl:
        info = site / f"nvidia_nccl_cu13-{nccl}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: {nccl}\n")
    py = tmp_path / f"{name}-python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    return str(py)


def test_probe_reads_the_nccl_wheel_and_the_check_refuses_a_mismatch(tmp_path):
    trainer, gen_same, gen_other = (fake_env(tmp_path, "t", "2.30.7"), fake_env(tmp_path, "g", "2.30.7"),
                                    fake_env(tmp_path, "o", "2.29.7"))
    reading = G.probe(trainer)
    assert (reading.nccl, reading.source) == ("2.30.7", "nvidia-nccl-cu13 wheel metadata")
    out = io.StringIO()
    assert G.check_nccl(trainer, gen_same, out=out) == 0
    assert "NCCL trainer env: 2.30.7" in out.getvalue() and "NCCL generator env: 2.30.7" in out.getvalue()
    readings = {trainer: reading, gen_other: G.probe(gen_other)}
    assert readings[gen_other].nccl == "2.29.7"
    assert G.check_nccl(trainer, gen_other, probe_fn=readings.__getitem__, out=io.StringIO()) == G.EXIT_MISMATCH
    problem = G.nccl_problem(reading, readings[gen_other])
    assert "2.30.7" in problem and "2.29.7" in problem and "SGLANG_PYTHON" in problem


def test_probe_under_a_cpu_torch_falls_back_to_the_wheel(tmp_path):
    """This venv's real (CPU) torch has no NCCL: the probe reports torch's version and reads the wheel."""
    site = tmp_path / "site"
    info = site / "nvidia_nccl_cu13-2.30.7.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.30.7\n")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    import torch

    reading = G.probe(str(py))
    assert (reading.nccl, reading.torch) == ("2.30.7", torch.__version__)


def test_check_refuses_an_unreadable_env_and_reads_torch_first():
    t = G.NcclReading(python="/t/python", nccl="2.30.7", source="torch.cuda.nccl.version()", torch="2.13.0")
    none = G.NcclReading(python="/g/python", nccl=None, source="probe exited 1: ModuleNotFoundError")
    problem = G.nccl_problem(t, none)
    assert "generator env (SGLANG_PYTHON=/g/python" in problem and "ModuleNotFoundError" in problem
    assert G.nccl_problem(t, G.NcclReading(python="/g", nccl="2.30.7", source="x")) is None
    # the probe prefers the library torch loaded; a CUDA torch reports a (major, minor, patch) tuple
    assert "torch.cuda.nccl.version()" in G.PROBE and G.PROBE.index("torch.cuda") < G.PROBE.index("md.version")


def test_nccl_plan_overrides_the_trainer_upwards_only():
    gen = {"torch": "2.14.1", "nvidia-nccl-cu13": G.NCCL_VERSION}
    lines, problems = G.nccl_plan({"torch": "2.13.0", "nvidia-nccl-cu13": "2.29.7"}, gen)
    assert not problems and f"both envs install nvidia-nccl-cu13=={G.NCCL_VERSION}" in lines[-1]
    # the generator's own pin moved: the shared pin (and the docs) must follow
    _, problems = G.nccl_plan({"nvidia-nccl-cu13": "2.29.7"}, {"nvidia-nccl-cu13": "2.31.2"})
    assert any("generator env resolves nvidia-nccl-cu13==2.31.2" in p for p in problems)
    # the trainer's torch needs a newer NCCL than the shared one: no downgrade
    _, problems = G.nccl_plan({"nvidia-nccl-cu13": "2.31.2"}, gen)
    assert any("newer than the shared" in p for p in problems)
    # a second NCCL build (cu12) in one env
    _, problems = G.nccl_plan({"nvidia-nccl-cu13": "2.29.7", "nvidia-nccl-cu12": "2.27.3"}, gen)
    assert any("nvidia-nccl-cu12" in p for p in problems)


def test_gpu_extra_is_the_trainer_env_only_and_docs_name_the_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [r for r in project["optional-dependencies"]["gpu"] if r.startswith("sglang")]
    from packaging.requirements import Requirement

    torch_req = Requirement(next(d for d in project["dependencies"] if d.startswith("torch")))
    assert all(torch_req.specifier.contains(v) for v in ("2.13.0", "2.14.1"))  # the tested bounds
    doc = (ROOT / "docs/cluster_install.md").read_text()
    for text in (f"{G.NCCL_WHEEL}=={G.NCCL_VERSION}", G.SGLANG_REQUIREMENT, f"transformer_engine_torch=={G.TE_VERSION}",
                 "SGLANG_PYTHON", "make check-gpu-envs"):
        assert text in doc, text
    te = ["torch>=2.1", "einops"]
    reqs = G.trainer_requirements(ROOT / "pyproject.toml", te_requires=te)
    assert reqs[:len(project["dependencies"])] == project["dependencies"]
    assert f"transformer-engine[core-cu13]=={G.TE_VERSION}" in reqs and reqs[-2:] == te


def _source_common(tmp_path: Path, script: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(SCALERL_REPO=str(ROOT), RUN_DIR=str(tmp_path / "run"), **env)
    return subprocess.run(["bash", "-c", f"source {ROOT}/slurm/common.sh; {script}"], env=e, capture_output=True,
                          text=True, timeout=600)


def test_launch_refuses_two_envs_with_different_nccl(tmp_path):
    """slurm/common.sh's check (a real launch, not DRY_RUN) exits 2 before any step when the two
    interpreters load different NCCL versions, and goes on when they match; CPU runs skip it."""
    t, g = fake_env(tmp_path, "t", "2.30.7"), fake_env(tmp_path, "g", "2.29.7")
    r = _source_common(tmp_path, "scalerl_check_nccl; echo went-on", GPUS_PER_NODE="4", SCALERL_PYTHON=t,
                       SGLANG_PYTHON=g)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "NCCL differs between the trainer env" in r.stderr and "went-on" not in r.stdout
    assert "no step started" in r.stdout
    same = fake_env(tmp_path, "s", "2.30.7")
    r = _source_common(tmp_path, "scalerl_check_nccl; echo went-on", GPUS_PER_NODE="4", SCALERL_PYTHON=t,
                       SGLANG_PYTHON=same)
    assert r.returncode == 0 and "went-on" in r.stdout, r.stderr
    r = _source_common(tmp_path, "scalerl_check_nccl; echo went-on", GPUS_PER_NODE="0", SCALERL_PYTHON=t,
                       SGLANG_PYTHON=g)
    assert r.returncode == 0 and "went-on" in r.stdout


@pytest.mark.slow
@pytest.mark.network
def test_both_gpu_envs_resolve_against_the_index(tmp_path):
    """`make check-gpu-envs`: pip's resolver against the package index (metadata only) for both envs."""
    r = subprocess.run([sys.executable, "-m", "scalerl_mega.cluster.gpu_envs", "resolve"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("linux ")]
    assert [x.split(":")[0] for x in lines] == [f"linux {a} CPython {v}" for a in G.ARCHS for v in G.PYTHON_VERSIONS]
    for line in lines:  # megatron-core >= 0.17 needs CPython 3.12: 3.11 resolves 0.16.1
        mcore = "0.19.2" if "3.12" in line else "0.16.1"
        assert line.endswith(": OK") and f"megatron-core {mcore}," in line and "sglang 0.5.23" in line, line
        assert line.count(f"{G.NCCL_WHEEL} {G.NCCL_VERSION}") == 2, line


@pytest.mark.slow
@pytest.mark.network
def test_the_old_single_environment_does_not_resolve(tmp_path):
    """The pre-issue-26 install (sglang next to this project's torch 2.13.0 in one env) is a conflict that
    the resolution reports, naming the environment and the packages."""
    with pytest.raises(SystemExit) as exc:
        G.pip_resolve(["torch==2.13.0", G.SGLANG_REQUIREMENT], label="single", fast_deps=True, workdir=tmp_path)
    msg = str(exc.value)
    assert "the single environment does not resolve" in msg and "torch" in msg and "sglang" in msg


def test_resolve_prints_one_line_per_architecture_and_python(monkeypatch, capsys, tmp_path):
    """`resolve` asks pip once per environment, architecture and CPython version with that platform's wheel
    tags and ABI, and prints one line per combination (pip replaced by a stand-in that writes its report)."""
    calls = []

    def fake_run(cmd, **kwargs):
        if "wheel" in cmd:  # the sdist-only runtime built into a wheel first
            Path(cmd[cmd.index("-w") + 1]).mkdir(parents=True, exist_ok=True)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        label = Path(cmd[cmd.index("--report") + 1]).stem
        plats = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--platform"]
        abis = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--abi"]
        arches = {next((a for a in ("x86_64", "aarch64") if p.endswith(a)), p) for p in plats}
        calls.append((label, cmd[cmd.index("--python-version") + 1], arches, abis[0]))
        names = {"torch": "2.14.1", G.NCCL_WHEEL: G.NCCL_VERSION,
                 **({"sglang": "0.5.23"} if label.startswith("generator") else {"megatron-core": "0.19.2"})}
        report = {"install": [{"metadata": {"name": n, "version": v}} for n, v in names.items()]}
        Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(G.subprocess, "run", fake_run)
    monkeypatch.setattr(G, "te_torch_requirements", lambda: ["einops"])
    assert G.main(["resolve"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [x for x in out if x.startswith("linux ")]
    assert [x.split(":")[0] for x in lines] == ["linux x86_64 CPython 3.11", "linux x86_64 CPython 3.12",
                                               "linux aarch64 CPython 3.11", "linux aarch64 CPython 3.12"]
    assert all(x.endswith(": OK") for x in lines)
    assert len(calls) == 8
    for label, version, arches, abi in calls:
        arch = "aarch64" if "aarch64" in label else "x86_64"
        assert label.endswith(f"{arch}-{version}") and arches == {arch} and abi == "cp" + version.replace(".", "")
    assert G.main(["resolve", "--arch", "aarch64", "--python", "3.12"]) == 0
    assert [x.split(":")[0] for x in capsys.readouterr().out.splitlines() if x.startswith("linux ")] == [
        "linux aarch64 CPython 3.12"]
