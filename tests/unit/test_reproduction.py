"""The reproduction as committed (reproduction/README.md): its curves are tracked, `make reproduce-analysis` rebuilds
the committed results byte for byte from them alone, the tree stays small (curves, not logs), and the design's
overlay is the configuration that trained the committed runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from reproduction.reproduce import DESIGNS, main
from scalerl_mega.scaling.io import run_metrics_file

ROOT = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") is not None and (ROOT / ".git").exists()

REPRODUCTION_LIMIT_MIB = 2.0
TREE_LIMIT_MIB = 12.0
FILE_LIMIT_MIB = 1.0


def _tracked() -> dict[str, int]:
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"git ls-files failed here: {r.stderr.decode().strip()}")
    return {p: (ROOT / p).stat().st_size for p in r.stdout.decode().split("\0") if p and (ROOT / p).is_file()}


def _ignored(rel: str) -> bool:
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT, capture_output=True)
    if r.returncode not in (0, 1):
        pytest.skip(f"git check-ignore failed here: {r.stderr.decode().strip()}")
    return r.returncode == 0


@pytest.mark.skipif(not GIT, reason="needs a git checkout")
@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_every_designs_curves_are_tracked(design):
    out = DESIGNS[design].out_dir
    for name in ("curve.jsonl.xz", "summary.json", "provenance.json", "provenance.jsonl", "run_config.yaml"):
        rel = f"{out}/runs/scalerl/seed0/{name}"
        assert not _ignored(rel), f"{rel} is ignored by .gitignore: `make reproduce` would commit no run data"
    assert _ignored(f"{DESIGNS[design].sweep_dir}/x/seed0/metrics.jsonl")  # the sweep's scratch stays untracked


NUMBER = re.compile(r"(-?\d+\.\d+(?:[eE][-+]?\d+)?)")


def same_up_to_last_digit(a: str, b: str) -> bool:
    """The same text, every printed decimal number equal within one unit of its last printed digit or 1e-6 of its
    value: the fits are SciPy least squares, whose last digits move with the numpy/SciPy wheels (B 0.5874658733 vs
    0.5874658817); anything else (a word, a count, a run name, a number off by more) is a difference."""
    pa, pb = NUMBER.split(a), NUMBER.split(b)
    if len(pa) != len(pb):
        return False
    for i, (x, y) in enumerate(zip(pa, pb)):
        if i % 2 == 0:
            if x != y:
                return False
            continue
        mant = x.lower().split("e")[0]
        exp = int(x.lower().split("e")[1]) if "e" in x.lower() else 0
        unit = 10.0 ** (exp - len(mant.split(".")[1]))
        if abs(float(x) - float(y)) > max(1.001 * unit, 1e-6 * max(abs(float(x)), abs(float(y)))):
            return False
    return True


def test_same_up_to_last_digit_by_hand():
    assert same_up_to_last_digit("A = 0.613, B 1.92", "A = 0.614, B 1.92")
    assert not same_up_to_last_digit("A = 0.613", "A = 0.615")
    assert not same_up_to_last_digit("A = 0.613 (3 runs)", "A = 0.613 (4 runs)")
    assert same_up_to_last_digit("C 2.5e+03", "C 2.6e+03") and not same_up_to_last_digit("C 2.5e+03", "C 2.7e+03")
    assert same_up_to_last_digit('"B": 0.5874658733', '"B": 0.5874658817')  # 1.4e-8 relative
    assert not same_up_to_last_digit('"B": 0.5874658733', '"B": 0.5874668733')  # 1.7e-6 relative


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_committed_analysis_regenerates_byte_for_byte_from_the_curves(design, tmp_path):
    """`make reproduce-analysis DESIGN=<design>` on a copy of the committed directory: every results file and the
    README (its generated section included) come out identical; the plots are rewritten under the same names."""
    src = ROOT / DESIGNS[design].out_dir
    out = tmp_path / design
    shutil.copytree(src, out)
    assert main(["analyse", "--design", design, "--out", str(out), "--no-collect"]) == 0
    results = json.loads((out / "results.json").read_text())
    compared = [p.name for p in src.iterdir() if p.suffix in (".json", ".md", ".jsonl")]
    assert "results.json" in compared and "README.md" in compared
    for name in compared:
        assert same_up_to_last_digit((out / name).read_text(), (src / name).read_text()), \
            f"{design}/{name} differs when regenerated"
    assert 1 <= len(results["plots"]) <= 2
    for name in results["plots"]:
        assert 10_000 < (out / name).stat().st_size <= 200_000 and (src / name).is_file()


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_committed_results_name_runs_that_exist(design):
    out = ROOT / DESIGNS[design].out_dir
    res = json.loads((out / "results.json").read_text())
    keys = res.get("runs") or res["axes"]["tokens"]["runs"]
    assert keys
    for key in keys:
        assert run_metrics_file(out / "runs" / key) is not None, f"{design}: results.json names {key}, not committed"


@pytest.mark.skipif(not GIT, reason="needs a git checkout")
def test_curves_not_logs():
    sizes = _tracked()
    big = {p: s for p, s in sizes.items() if s > FILE_LIMIT_MIB * 2**20}
    assert big == {}, f"tracked files over {FILE_LIMIT_MIB} MiB: {big}"
    repro = sum(s for p, s in sizes.items() if p.startswith("reproduction/")) / 2**20
    assert repro <= REPRODUCTION_LIMIT_MIB, f"reproduction/ is {repro:.2f} MiB (limit {REPRODUCTION_LIMIT_MIB})"
    total = sum(sizes.values()) / 2**20
    biggest = ", ".join(f"{p} {s / 2**20:.2f}" for p, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    assert total <= TREE_LIMIT_MIB, f"tracked tree {total:.1f} MiB over {TREE_LIMIT_MIB} (largest: {biggest})"
    assert not any(p.startswith("reproduction/") and p.endswith(("metrics.jsonl", "metrics.jsonl.xz"))
                   for p in sizes), "commit curves (metrics/curve.py), not full metrics"


def test_the_predictability_overlay_is_the_config_that_trained_the_committed_runs():
    """conf/experiment/reproduction/predictability.yaml (one overlay on demo) composes to each committed run's
    run_config.yaml, but for the names and paths of the run and keys added since with their old behaviour."""
    from omegaconf import OmegaConf

    from scalerl_mega.compose import compose_node
    from scalerl_mega.config import flat_config

    def flat(overrides):
        return flat_config(OmegaConf.to_container(compose_node(overrides), resolve=False))

    new, demo = flat(["experiment=reproduction/predictability"]), flat(["experiment=demo"])
    # model.name: the label presets print (the demo_moe preset holds the sizes demo.yaml set)
    expected_diff = {"output_dir", "run_name", "sft.checkpoint", "seed", "model.name"}
    runs = sorted((ROOT / DESIGNS["predictability"].out_dir / "runs").glob("*/seed*/run_config.yaml"))
    assert len(runs) == 3
    for path in runs:
        old = flat_config(yaml.safe_load(path.read_text()))
        # keys added to the config since (rollout.engine_nice, rollout.in_process, reward.stop_error_rate, ...):
        # the overlay leaves each at the demo's value, whose default keeps the old behaviour
        added = set(new) - set(old)
        assert {k: new[k] for k in added} == {k: demo[k] for k in added}, path
        assert "rollout.engine_nice" in added and not (set(old) - set(new))
        diff = {k for k in set(old) & set(new) if old[k] != new[k]}
        assert diff <= expected_diff, f"{path}: {sorted(diff - expected_diff)}"


def test_nothing_in_the_package_imports_the_reproduction():
    for path in (ROOT / "scalerl_mega").rglob("*.py"):
        text = path.read_text()
        assert "import reproduction" not in text and "from reproduction" not in text, path
