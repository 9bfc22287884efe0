"""The committed reproductions can be regenerated from a clone (issue 29 item 4: "the analysis regenerates the
tables and plots from the committed runs alone"): every sweep's `runs/` directory is tracked by git, not
swallowed by a `.gitignore` pattern (the repro2 sweep's runs were lost that way: `runs/` ignored them), and
every run a committed results.json names is on disk."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from scalerl_mega.reproduce import SWEEPS
from scalerl_mega.scaling.io import run_metrics_file

ROOT = Path(__file__).resolve().parents[2]


def _ignored(rel: str) -> bool:
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT, capture_output=True)
    if r.returncode not in (0, 1):
        pytest.skip(f"git check-ignore failed here: {r.stderr.decode().strip()}")
    return r.returncode == 0


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_every_sweeps_runs_are_tracked(sweep):
    out = SWEEPS[sweep][2]
    for name in ("metrics.jsonl", "metrics.jsonl.xz", "metrics.jsonl.gz", "summary.json", "provenance.json",
                 "run_config.yaml"):
        rel = f"{out}/runs/scalerl/seed0/{name}"
        assert not _ignored(rel), f"{rel} is ignored by .gitignore: `make reproduce` would commit no run data"
    assert _ignored("outputs/reproduce3/scalerl/seed0/metrics.jsonl")  # the sweep's scratch stays untracked


@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_committed_results_name_runs_that_exist(sweep):
    out = ROOT / SWEEPS[sweep][2]
    results = out / "results.json"
    if not results.is_file():
        pytest.skip(f"{results.relative_to(ROOT)}: no committed analysis yet")
    runs = json.loads(results.read_text()).get("runs", {})
    for key in runs:
        assert run_metrics_file(out / "runs" / key) is not None, (
            f"{out.name}/results.json names {key}, whose data is not committed")


TRACKED_LIMIT_MB = 58.0
"""Ceiling on the tracked files (MiB): a GPU session's device tool copies the working tree with a 64 MiB limit,
and `make test-gpu` carries the ~3 MiB of `.whl/` from `make gpu-wheels` beside it."""


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_tracked_files_fit_the_gpu_sessions_copy():
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"git ls-files failed here: {r.stderr.decode().strip()}")
    sizes = {p: (ROOT / p).stat().st_size for p in r.stdout.decode().split("\0") if p and (ROOT / p).is_file()}
    total = sum(sizes.values()) / 2**20
    biggest = ", ".join(f"{p} {s / 2**20:.1f}" for p, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    assert total <= TRACKED_LIMIT_MB, (
        f"tracked files are {total:.1f} MiB, over {TRACKED_LIMIT_MB} MiB (largest: {biggest}): a GPU session could "
        "not send this tree; commit run metrics compressed (reproduce_report.collect(compress_metrics=True))")
