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
