"""The leave-one-out design's analysis (reproduction/loo_analysis.py) on synthetic runs of known parameters:
collect (as curves), per-run fits (fits.json), seed spread, common-A refit, verdicts and the generated README
section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reproduction.common import BEGIN, END, collect
from reproduction.loo_analysis import RUN_NAMES, analyse

TOKENS_PER_STEP = 10_000.0
C_MID = 150_000.0  # tokens


def eq1(c, *, A, B, C_mid, R0=0.3):
    """Eq. 1 (paper Sec. 2.1) in float64, written out independently of scaling.fit."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, R0 + (A - R0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), R0)


def write_run(d: Path, *, A: float, B: float, noise_seed: int, steps: int = 100, every: int = 5) -> None:
    """A finished run as the loop logs it: train lines with batch/tokens, validation lines every `every` steps."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(noise_seed)
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(steps + 1):
            if step:
                fh.write(json.dumps({"kind": "train", "step": step, "batch/tokens": TOKENS_PER_STEP,
                                     "compute_device_hours": 0.002 * step}) + "\n")
            if step % every == 0:
                r = float(eq1(step * TOKENS_PER_STEP, A=A, B=B, C_mid=C_MID)) + (rng.normal(0, 0.002) if step else 0)
                fh.write(json.dumps({"kind": "validation", "step": step, "val_pass_rate": r,
                                     "val_prompts": 10000.0, "val_samples_per_prompt": 4.0,  # binomial SE ~0.002
                                     "compute_device_hours": 0.002 * step + 0.001}) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": steps, "wall_s": 100.0, "sft_s": 1.0, "rl_s": 90.0}))
    (d / "run_config.yaml").write_text(f"train:\n  steps: {steps}\n")


# recipe -> (A, B); no_zvf / no_fp32_head reuse the reference's exact points (same noise seeds)
TRUTH = {"scalerl": (0.80, 2.5), "dapo": (0.80, 1.5), "no_zvf": (0.80, 2.5), "no_fp32_head": (0.80, 2.5),
         "no_npr": (0.70, 2.5)}


def make_runs(root: Path, seeds=(0, 1, 2)) -> None:
    for rec, (A, B) in TRUTH.items():
        for s in seeds:
            write_run(root / rec / f"seed{s}", A=A, B=B, noise_seed=s)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro")
    make_runs(out / "runs")
    (out / "README.md").write_text(f"# hand-written head\n\n{BEGIN}\nold\n{END}\n\nhand-written tail\n")
    return out, analyse(sweep_dir=None, out_dir=out)


def test_fits_json_recovers_known_parameters(analysed):
    out, _ = analysed
    fits = json.loads((out / "fits.json").read_text())
    assert sorted(fits) == sorted(f"{r}/seed{s}" for r in TRUTH for s in range(3))
    for key, f in fits.items():
        A, B = TRUTH[key.split("/")[0]]
        assert set(f) == {"A", "B", "C_mid", "A_interval", "identified", "reason"}
        assert f["A_interval"][0] <= A <= f["A_interval"][1]
        assert f["identified"] is True
        assert f["A"] == pytest.approx(A, abs=0.02)  # grid step 0.005, noise 0.002
        assert f["B"] == pytest.approx(B, rel=0.15)
        assert f["C_mid"] == pytest.approx(C_MID * 1e-6, rel=0.15)  # tokens axis in millions
    wall = json.loads((out / "fits_wallclock.json").read_text())
    # wall clock = 0.002 device-hours per 10k-token step (+0.001 offset at validation): C_mid ~ 15 x 0.002
    assert wall["scalerl/seed0"]["C_mid"] == pytest.approx(C_MID / TOKENS_PER_STEP * 0.002, rel=0.2)


def test_verdicts(analysed):
    _, res = analysed
    rec = res["axes"]["tokens"]["recipes"]
    assert rec["dapo"]["comparison"]["decided_by"] == "B at the common A"
    assert rec["dapo"]["verdict"] == "reproduced at toy scale"
    assert rec["no_npr"]["comparison"]["decided_by"] == "A"  # 0.70 vs 0.80
    assert rec["no_npr"]["verdict"] == "reproduced at toy scale"
    assert rec["no_zvf"]["verdict"] == "not separable within noise"
    assert rec["no_zvf"]["comparison"]["delta_B"] == pytest.approx(0.0, abs=1e-9)
    assert rec["no_fp32_head"]["verdict"] == "control: not separable, as expected"
    assert rec["scalerl"]["A_half_range"] <= 0.02 and rec["scalerl"]["within_seed_margin"]
    assert res["missing"] == []
    # model-free: no_npr (A 0.70) ends lower; the runs end at 1M tokens where the true curves give
    fin = res["final_pass_rate"]
    last3 = [eq1(s * TOKENS_PER_STEP, A=A, B=B, C_mid=C_MID).mean() for A, B in (TRUTH["scalerl"], TRUTH["no_npr"])
                      for s in [np.array([90, 95, 100])]]
    assert fin["scalerl"]["mean"] == pytest.approx(last3[0], abs=0.003)
    assert fin["no_npr"]["delta"] == pytest.approx(last3[1] - last3[0], abs=0.003)
    assert fin["no_npr"]["outcome"] == "reference better" and fin["no_zvf"]["outcome"] == "not separable within noise"
    # paired by seed: no_zvf repeats the reference's points exactly (differences 0); no_npr is 0.1 lower in A
    assert fin["no_zvf"]["paired"]["differences"] == [0.0, 0.0, 0.0]
    assert fin["no_zvf"]["paired"]["outcome"] == "not separable within noise"
    assert fin["no_npr"]["paired"]["dof"] == 2 and fin["no_npr"]["paired"]["t_crit"] == pytest.approx(4.302653, rel=1e-6)
    assert fin["no_npr"]["paired"]["mean"] == pytest.approx(last3[1] - last3[0], abs=0.003)
    assert fin["no_npr"]["paired"]["margin_rule"] == "reference better"


def test_readme_section_replaced_and_plots_written(analysed):
    out, res = analysed
    text = (out / "README.md").read_text()
    assert text.startswith("# hand-written head") and text.rstrip().endswith("hand-written tail")
    assert "old" not in text.split(BEGIN)[1].split(END)[0].splitlines()
    assert "| dapo/seed2 |" in text and "**reproduced at toy scale**" in text
    assert res["plots"] == ["scaling_tokens.png", "runs_tokens.png"]  # at most two plots per design
    for name in res["plots"]:
        assert (out / name).stat().st_size > 1000 and f"![{name}]({name})" in text


def test_collect_takes_finished_runs_only_and_partial_is_labelled(tmp_path):
    sweep = tmp_path / "sweep"
    for rec in ("scalerl", "dapo"):
        for s in (0, 1):
            write_run(sweep / f"loo_{rec}" / f"seed{s}", A=TRUTH[rec][0], B=TRUTH[rec][1], noise_seed=s)
    (sweep / "loo_dapo" / "seed1" / "summary.json").unlink()  # still running
    (sweep / "loo_scalerl" / "seed1" / "summary.json").write_text(json.dumps({"steps": 60, "preempted": True}))
    (sweep / "loo_dapo" / "seed0" / "run_config.yaml").write_text("train:\n  steps: 120\n")  # stopped short
    (sweep / "provenance.jsonl").write_text(json.dumps({"started": "t0", "commit": "abc", "command": "x"}) + "\n")
    runs = tmp_path / "out" / "runs"
    assert collect(sweep, runs, run_names=RUN_NAMES) == ["scalerl/seed0"]  # preempted, short, running: not finished
    assert sorted(p.name for p in (runs / "scalerl" / "seed0").iterdir()) == ["curve.jsonl.xz", "run_config.yaml",
                                                                              "summary.json"]
    # both finish (resumed): collected by the analysis
    write_run(sweep / "loo_scalerl" / "seed1", A=TRUTH["scalerl"][0], B=TRUTH["scalerl"][1], noise_seed=1)
    write_run(sweep / "loo_dapo" / "seed0", A=TRUTH["dapo"][0], B=TRUTH["dapo"][1], noise_seed=0)
    res = analyse(sweep_dir=sweep, out_dir=tmp_path / "out")
    assert "dapo/seed1" in res["missing"] and "no_npr/seed0" in res["missing"]
    text = (tmp_path / "out" / "README.md").read_text()
    assert "**Partial results**" in text and "commit `abc`" in text
    # one dapo seed: too few identified seeds to decide
    assert res["axes"]["tokens"]["recipes"]["dapo"]["verdict"] == "not separable within noise"


def test_npr_untestable_within_the_first_epoch(tmp_path):
    """No-Positive-Resampling acts from the second pass over the prompts: with every run of both recipes in
    epoch 0 at its last train line, the finding is reported as untestable, not given a verdict."""
    from reproduction.loo_analysis import EPOCH_KEY, last_epochs, untestable

    runs = {}
    for rec, epoch in (("scalerl", 0), ("no_npr", 0), ("dapo", 1)):
        d = tmp_path / rec / "seed0"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, EPOCH_KEY: 0.0}) + "\n"
                                         + json.dumps({"kind": "train", "step": 2, EPOCH_KEY: float(epoch)}) + "\n")
        runs[rec] = {0: d}
    ep = last_epochs(runs)
    assert ep == {"scalerl/seed0": 0, "no_npr/seed0": 0, "dapo/seed0": 1}
    assert "untestable here" in untestable("no_npr", runs, ep) and "epoch 0" in untestable("no_npr", runs, ep)
    assert untestable("dapo", runs, ep) == ""  # not an epoch-dependent finding
    ep["no_npr/seed0"] = 1  # one run got into its second pass: testable
    assert untestable("no_npr", runs, ep) == ""


def test_cli_reading_hint_reproduces_the_committed_fits(capsys):
    """reproduction/loo/README.md: `scalerl-fit reproduction/loo/runs/<recipe>/seed<N> --x sum:batch/tokens --json`
    (a committed curve) gives the committed fits.json row (the analysis works in millions of tokens, the CLI in
    tokens: C_mid x 1e6)."""
    from scalerl_mega.scaling.cli import main

    root = Path(__file__).resolve().parents[2] / "reproduction" / "loo"
    committed = json.loads((root / "fits.json").read_text())
    for key in ("no_npr/seed0", "scalerl/seed0"):
        assert main([str(root / "runs" / key), "--x", "sum:batch/tokens", "--json", "--holdout", "0"]) == 0
        row = json.loads(capsys.readouterr().out)["runs"][0]
        want = committed[key]
        assert row["identified"] == want["identified"] and row["reason"] == want["reason"] and row["A"] == want["A"]
        assert row["A_interval"] == pytest.approx(want["A_interval"], abs=1e-9)
        assert row["B"] == pytest.approx(want["B"], rel=1e-6)  # golden-section tolerance on log B
        assert row["C_mid"] == pytest.approx(want["C_mid"] * 1e6, rel=1e-6)


def test_analysis_json_is_rounded_so_last_digit_noise_writes_the_same_bytes(tmp_path):
    """Fits repeated on another machine differ in their last digits (1e-13 relative, summation order): the
    analysis' JSON is written to RESULT_DIGITS significant digits, so both write the same file; NaN becomes null
    and numpy scalars plain numbers; json_safe without digits leaves floats exact (registered forecasts)."""
    from reproduction.common import RESULT_DIGITS, json_safe, write_analysis_json

    here = {"B": 2.065443228812293, "A_interval": [np.float64(0.6698810872798796), 1.0], "n": np.int64(3),
            "x": float("nan"), "ok": True, "small": 1.234567890123e-7}
    there = {**here, "B": 2.0654432287993836, "A_interval": [0.6698810872798684, 1.0]}
    write_analysis_json(tmp_path / "a.json", here)
    write_analysis_json(tmp_path / "b.json", there)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    got = json.loads((tmp_path / "a.json").read_text())
    assert RESULT_DIGITS == 10 and got["B"] == 2.065443229 and got["A_interval"] == [0.6698810873, 1.0]
    assert got["n"] == 3 and got["x"] is None and got["ok"] is True and got["small"] == 1.23456789e-7
    assert json_safe(here)["B"] == 2.065443228812293
