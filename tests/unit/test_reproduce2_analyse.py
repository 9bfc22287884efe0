"""Issue 29's analysis (`reproduce analyse --sweep repro3`) on synthetic runs of known Eq. 1 parameters: the
paired-window and crossing rules by hand, then the whole analysis (half-fit forecasts, batch-size crossing,
incomplete axes, README section, plots)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from scalerl_mega.reproduce2_analyse import analyse2
from scalerl_mega.reproduce2_report import crossing, paired_window
from scalerl_mega.reproduce_report import BEGIN, END
from scalerl_mega.scaling.seeds import NOT_SEPARABLE, REFERENCE_BETTER, VARIANT_BETTER


def test_paired_window_by_hand():
    c = np.array([0.0, 1.0, 2.0, 3.0])
    ref = {0: (c, np.array([0.1, 0.2, 0.3, 0.4])), 1: (c, np.array([0.1, 0.3, 0.3, 0.5]))}
    var = {0: (c, np.array([0.1, 0.3, 0.5, 0.4])), 1: (c, np.array([0.1, 0.35, 0.45, 0.5])), 7: (c, c)}
    w = paired_window(ref, var, lo=1.0, hi=2.0)
    # seed 0: mean(0.3, 0.5) - mean(0.2, 0.3) = 0.15; seed 1: mean(0.35, 0.45) - mean(0.3, 0.3) = 0.1 (seed 7 unpaired)
    assert w.points == 2 and w.paired.seeds == (0, 1)
    assert w.paired.differences == pytest.approx((0.15, 0.1))
    assert w.paired.mean == pytest.approx(0.125)
    # t_0.975(1) = 12.706; sd = 0.0353553; half width = 12.706 * sd / sqrt(2) = 0.31766
    assert w.paired.half_width == pytest.approx(12.7062 * math.sqrt(0.00125) / math.sqrt(2), rel=1e-4)
    assert w.paired.outcome == NOT_SEPARABLE


def _seeds(f, noise, k=3):
    c = np.arange(0, 41, dtype=np.float64)
    return {s: (c, f(c) + noise * (s - 1)) for s in range(k)}


def test_crossing_detects_the_paper_pattern_and_its_reverse():
    small = _seeds(lambda c: 0.2 + 0.5 * c / (c + 5), 0.001)       # fast, low plateau
    large = _seeds(lambda c: 0.2 + 0.7 * c / (c + 15), 0.002)      # slow, high plateau
    x = crossing(small, large)
    assert x["outcome"] == "crossed"
    assert x["early"].paired.outcome == REFERENCE_BETTER and x["late"].paired.outcome == VARIANT_BETTER
    assert x["early"].window == (1e-12, 10.0) and x["late"].window == (30.0, 40.0)
    assert crossing(large, small)["outcome"] == "reversed"
    same = crossing(small, small)
    assert same["outcome"] == f"early: {NOT_SEPARABLE}; late: {NOT_SEPARABLE}"


# ---------------------------------------------------------------- whole analysis on synthetic sweeps
SAMPLES = 256.0  # per reference step


def eq1(c, *, A, B, C_mid, R0=0.2):
    """Eq. 1 (paper Sec. 2.1) in float64, written out independently of scaling.fit."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, R0 + (A - R0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), R0)


TRUTH = {"scalerl": (0.70, 2.0, 60.0), "batch_small": (0.62, 2.0, 40.0), "batch_large": (0.78, 2.0, 90.0),
         "batch_control": (0.70, 2.0, 60.0)}
"""setting -> (A, B, C_mid in reference steps); every setting validates every 20 x 256 samples."""


def write_run(d: Path, *, A, B, C_mid, seed, per_step, steps, every, n=1600):
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(steps + 1):
            if step:
                fh.write(json.dumps({"kind": "train", "step": step, "samples": per_step,
                                     "curriculum/curriculum/epoch": step // 100,
                                     "curriculum/curriculum/active_prompts": 3000 - step}) + "\n")
            if step % every == 0:  # window validation (the sweep's): the point measures R at the window's centre
                centre = step - every // 2 if step else 0
                p = float(eq1(centre * per_step / SAMPLES, A=A, B=B, C_mid=C_mid))
                line = {"kind": "validation", "step": step, "val_pass_rate": p, "val_prompts": 200.0,
                        "val_samples_per_prompt": n / 200.0}
                if step:
                    line["val_pass_rate"] = p + rng.normal(0.0, 0.002)
                    line["val_center_step"] = float(centre)
                fh.write(json.dumps(line) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": steps, "wall_s": 10.0}))
    (d / "provenance.json").write_text(json.dumps({"commit": "abc123def456", "dirty": False}))


SHAPE = {"scalerl": (256.0, 800, 20), "batch_small": (128.0, 1600, 40), "batch_large": (512.0, 400, 10),
         "batch_control": (256.0, 800, 20)}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro3")
    for rec, (A, B, C_mid) in TRUTH.items():
        per_step, steps, every = SHAPE[rec]
        for s in ((0, 1, 2) if rec != "batch_control" else (0,)):
            write_run(out / "runs" / rec / f"seed{s}", A=A, B=B, C_mid=C_mid, seed=s, per_step=per_step,
                      steps=steps, every=every)
    (out / "README.md").write_text(f"# head\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    return out, analyse2(sweep_dir=None, out_dir=out)


def test_half_fit_forecasts_every_reference_seed(analysed):
    _, res = analysed
    for s in (0, 1, 2):
        h = res["runs"][f"scalerl/seed{s}"]["half_fit"]
        assert h["identified"], h["verdict"]
        # the forecast of Eq. 1 at the last points, within a few noise SDs of the truth
        truth = eq1(np.asarray(h["final_compute"]) * 1e3 / SAMPLES, A=0.70, B=2.0, C_mid=60.0)
        assert np.asarray(h["predicted"]) == pytest.approx(truth, abs=0.01)
        assert h["ratio"] < 3.0


def test_fits_recover_A_on_the_samples_axis(analysed):
    out, _ = analysed
    fits = json.loads((out / "fits.json").read_text())
    for rec, (A, _, C_mid) in TRUTH.items():
        f = fits[f"{rec}/seed0"]
        assert f["identified"] and f["A"] == pytest.approx(A, abs=0.01)
        assert f["C_mid"] == pytest.approx(C_mid * SAMPLES / 1e3, rel=0.1)  # thousands of samples


def test_batch_axis_verdicts(analysed):
    _, res = analysed
    lvs = res["comparisons"]["batch_large_vs_small"]
    assert lvs["rule"]["outcome"] == VARIANT_BETTER and lvs["rule"]["decided_by"] == "A"
    assert lvs["crossing"]["outcome"] == "crossed"
    assert lvs["final"]["outcome"] == VARIANT_BETTER
    # one control seed: incomplete, not a result
    assert "incomplete" in res["comparisons"]["batch_control"] and "1 batch_control" in \
        res["comparisons"]["batch_control"]["incomplete"]
    assert "no_npr" in res["comparisons"] and "0 no_npr" in res["comparisons"]["no_npr"]["incomplete"]
    assert res["missing"] == ["batch_control/seed1", "batch_control/seed2", "no_npr/seed0", "no_npr/seed1",
                              "no_npr/seed2"]


def test_readme_section_and_plots(analysed):
    out, res = analysed
    text = (out / "README.md").read_text()
    assert text.startswith("# head\n") and text.rstrip().endswith("tail") and "\nold\n" not in text
    assert "**Partial sweep**: 5 run(s) not finished" in text
    assert "| batch_large vs batch_small |" in text and "**crossed**" in text
    assert "**incomplete**" in text and "abc123def4" in text
    run = res["runs"]["scalerl/seed0"]
    assert run["epoch_at_end"] == 8 and run["active_prompts_at_end"] == 2200  # step 800's line
    assert "| 8 | 2200 | 800 | 10 |" in text
    od = run["overdispersion"]
    assert f"| {od['residual_sd']:.4f} / {od['binomial_se']:.4f} = {od['ratio']:.1f} |" in text
    for name in ("half_fit_samples.png", "batch_samples.png", "scaling_samples.png"):
        assert name in res["plots"] and (out / name).stat().st_size > 10_000


def test_cli_analyses_committed_runs_and_names_a_missing_reference(analysed, tmp_path, capsys):
    """`make reproduce-analysis` = `python -m scalerl_mega.reproduce analyse --sweep repro3 --no-collect`."""
    import shutil

    from scalerl_mega.reproduce import main

    out, _ = analysed
    copy = tmp_path / "copy"
    shutil.copytree(out / "runs", copy / "runs")
    assert main(["analyse", "--sweep", "repro3", "--no-collect", "--out", str(copy)]) == 0
    assert json.loads((copy / "fits.json").read_text()) == json.loads((out / "fits.json").read_text())
    assert BEGIN in (copy / "README.md").read_text()
    shutil.rmtree(copy / "runs" / "scalerl")
    assert main(["analyse", "--sweep", "repro3", "--no-collect", "--out", str(copy)]) == 2
    assert "no finished run of the reference recipe 'scalerl'" in capsys.readouterr().err


def test_overdispersion_by_hand():
    from types import SimpleNamespace

    from scalerl_mega.reproduce2_report import overdispersion

    fit = SimpleNamespace(sse=0.0063, n_points=10, compute_range=(1.0, 10.0),
                          predict=lambda c: np.full(np.shape(c), 0.5))
    od = overdispersion(fit, np.arange(0.0, 11.0), 1600.0)
    assert od["residual_sd"] == pytest.approx(0.03)              # sqrt(0.0063 / 7)
    assert od["binomial_se"] == pytest.approx(0.0125)            # sqrt(0.25 / 1600)
    assert od["ratio"] == pytest.approx(2.4)


def test_synthetic_runs_show_binomial_level_scatter(analysed):
    _, res = analysed
    # the synthetic points scatter by N(0, 0.002) around Eq. 1, far below the binomial SE (~0.011) of 1600 samples
    od = res["runs"]["scalerl/seed0"]["overdispersion"]
    assert od["residual_sd"] < 0.004 and od["binomial_se"] == pytest.approx(0.0115, abs=0.001)


def test_compressed_runs_analyse_identically_and_collect_is_byte_stable(analysed, tmp_path):
    """The sweep's committed runs hold metrics.jsonl.xz (`collect(compress_metrics=True)`; older ones .gz): the
    analysis of compressed copies equals that of the plain files, and collecting the same run twice leaves the
    same bytes, replacing a plain or gzipped copy left there before; a damaged .xz is rewritten."""
    import gzip
    import lzma
    import shutil

    from scalerl_mega.reproduce_report import collect

    out, _ = analysed
    for suffix, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
        copy = tmp_path / suffix[1:]
        shutil.copytree(out / "runs", copy / "runs")
        for f in (copy / "runs").rglob("metrics.jsonl"):
            f.with_name("metrics.jsonl" + suffix).write_bytes(compress(f.read_bytes()))
            f.unlink()
        res = analyse2(sweep_dir=None, out_dir=copy)
        assert json.loads((copy / "fits.json").read_text()) == json.loads((out / "fits.json").read_text())
        assert sorted(res["runs"]) == sorted(json.loads((out / "results.json").read_text())["runs"])

    sweep = tmp_path / "sweep" / "repro3_scalerl" / "seed0"
    shutil.copytree(out / "runs" / "scalerl" / "seed0", sweep)
    (sweep / "run_config.yaml").write_text("train:\n  steps: 800\n")
    dest = tmp_path / "collected" / "runs"
    got = dest / "scalerl" / "seed0"
    got.mkdir(parents=True)
    (got / "metrics.jsonl").write_text("stale\n")
    (got / "metrics.jsonl.gz").write_bytes(gzip.compress(b"stale\n"))
    assert collect(sweep.parent.parent, dest, run_names=("repro3_scalerl",), compress_metrics=True) == ["scalerl/seed0"]
    first = (got / "metrics.jsonl.xz").read_bytes()
    assert not (got / "metrics.jsonl").exists() and not (got / "metrics.jsonl.gz").exists()
    assert lzma.decompress(first) == (sweep / "metrics.jsonl").read_bytes()
    mtime = (got / "metrics.jsonl.xz").stat().st_mtime_ns
    collect(sweep.parent.parent, dest, run_names=("repro3_scalerl",), compress_metrics=True)
    assert (got / "metrics.jsonl.xz").read_bytes() == first
    assert (got / "metrics.jsonl.xz").stat().st_mtime_ns == mtime  # same content: not rewritten
    (got / "metrics.jsonl.xz").write_bytes(first[: len(first) // 2])  # truncated
    collect(sweep.parent.parent, dest, run_names=("repro3_scalerl",), compress_metrics=True)
    assert lzma.decompress((got / "metrics.jsonl.xz").read_bytes()) == (sweep / "metrics.jsonl").read_bytes()


def test_collect_can_leave_named_fields_out_of_the_committed_metrics(tmp_path):
    """`collect(drop_fields=...)` (repro6_fast: the per-step prompt ids, `reproduce.COMMITTED_WITHOUT`): the
    committed metrics.jsonl.xz holds every record with every other key and value equal, floats exactly; the
    sweep's own file is untouched, and collecting again rewrites nothing."""
    import lzma

    from scalerl_mega.reproduce_report import collect

    run = tmp_path / "sweep" / "repro6_fast" / "seed4"
    run.mkdir(parents=True)
    records = [{"kind": "train", "step": 1, "prompt_ids": ["75bfd2102c83289d", "d5a42982e39e7805"],
                "step_s": 0.1 + 0.2, "token_lag_mean": 1.0 / 3.0},
               {"kind": "validation", "step": 1, "val_pass_rate": 0.6712500000000001}]
    plain = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    (run / "metrics.jsonl").write_text(plain)
    (run / "run_config.yaml").write_text("train:\n  steps: 1\n")
    dest = tmp_path / "committed" / "runs"
    assert collect(run.parent.parent, dest, run_names=("repro6_fast",), compress_metrics=True, unfinished=True,
                   drop_fields=("prompt_ids",)) == ["fast/seed4"]
    xz = dest / "fast" / "seed4" / "metrics.jsonl.xz"
    got = [json.loads(line) for line in lzma.decompress(xz.read_bytes()).decode().splitlines()]
    assert got == [{k: v for k, v in r.items() if k != "prompt_ids"} for r in records]
    assert got[0]["step_s"] == 0.30000000000000004 and got[1]["val_pass_rate"] == 0.6712500000000001
    assert (run / "metrics.jsonl").read_text() == plain
    mtime = xz.stat().st_mtime_ns
    collect(run.parent.parent, dest, run_names=("repro6_fast",), compress_metrics=True, unfinished=True,
            drop_fields=("prompt_ids",))
    assert xz.stat().st_mtime_ns == mtime


def test_status_names_every_commit_that_trained_a_resumed_run():
    """A run resumed from a checkpoint under another commit lists both commits and their step ranges; a run
    stamped before segments were recorded shows the commit that finished it."""
    from scalerl_mega.reproduce2_markdown import _status

    runs = {"scalerl/seed0": {"commit": "aaaaaaaaaaaa", "dirty": False},
            "scalerl/seed1": {"commit": "cccccccccccc", "dirty": False,
                              "segments": [{"commit": "bbbbbbbbbbbb", "dirty": False, "steps": [0, 660]},
                                           {"commit": "cccccccccccc", "dirty": False, "steps": [660, 1600]}]}}
    text = "\n".join(_status({"runs": runs, "missing": []}))
    assert "| scalerl | " in text and "| 2 of 3 (0, 1) | aaaaaaaaaa, bbbbbbbbbb, cccccccccc |" in text
    assert "scalerl/seed1 (steps 0-660 at bbbbbbbbbb, steps 660-1600 at cccccccccc)" in text
    assert "seed0 (" not in text


def test_a_resumed_runs_wall_time_adds_its_launches(tmp_path):
    """summary.json times the last launch only; the segments that trained the run alone give the rest."""
    from scalerl_mega.reproduce2_analyse import _provenance

    d = tmp_path / "scalerl" / "seed2"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"steps": 1600, "wall_s": 2151.0}))
    segs = [{"commit": "a", "steps": [0, 660], "wall_s": 1309.0}, {"commit": "b", "steps": [660, 1600], "wall_s": 2160.0}]
    (d / "provenance.json").write_text(json.dumps({"commit": "b", "segments": segs}))
    assert _provenance({"scalerl": {2: d}}, "scalerl/seed2")["wall_s"] == 3469.0
    segs[0]["wall_s"] = None  # that invocation also trained other runs: its wall time is not this run's
    (d / "provenance.json").write_text(json.dumps({"commit": "b", "segments": segs}))
    assert _provenance({"scalerl": {2: d}}, "scalerl/seed2")["wall_s"] == 2151.0


def test_irregular_points_names_a_missing_point_and_a_mixed_one():
    from scalerl_mega.reproduce2_report import irregular_points

    steps = [0, 20, 40, 80, 100]  # 60 lost; 80 took in another window's slices; 100 lost half a window
    n = [1600, 1600, 1600, 2400, 800]
    assert irregular_points(steps, n, every=20, last_step=100) == [
        "no point at step 60", "step 80: 2400 samples (usual 1600)", "step 100: 800 samples (usual 1600)"]
    assert irregular_points([0, 20, 40], [1600] * 3, every=20, last_step=40) == []
    assert irregular_points([0, 20], [1600] * 2, every=20, last_step=40) == ["no point at step 40"]


def test_variants_are_also_compared_with_the_control(analysed, tmp_path):
    """Each batch size and No-Positive-Resampling off are compared with the same-maths control as with the
    reference (paired by seed): with one control seed those rows are incomplete (the module fixture); with
    three, the larger batch (A 0.78, C_mid 90) crosses the control (the reference's curve, other noise) as it
    crosses the reference, the control against the reference is a null (no window separates), and a no_npr
    run with the reference's B and C_mid but A 0.76 is above the control in both windows."""
    _, res = analysed
    assert "1 batch_control" in res["comparisons"]["batch_large_vs_control"]["incomplete"]
    assert "1 batch_control and 3 batch_small" in res["comparisons"]["batch_small_vs_control"]["incomplete"]
    assert "1 batch_control and 0 no_npr" in res["comparisons"]["no_npr_vs_control"]["incomplete"]
    out = tmp_path / "repro3"
    truth = {**TRUTH, "no_npr": (0.76, 2.0, 60.0)}
    noise = {"batch_control": 10, "no_npr": 20}  # seed offsets: each setting its own noise
    for rec in ("scalerl", "batch_large", "batch_control", "no_npr"):
        A, B, C_mid = truth[rec]
        per_step, steps, every = SHAPE.get(rec, SHAPE["scalerl"])
        for s in (0, 1, 2):
            write_run(out / "runs" / rec / f"seed{s}", A=A, B=B, C_mid=C_mid, per_step=per_step, steps=steps,
                      every=every, seed=s + noise.get(rec, 0))
    res3 = analyse2(sweep_dir=None, out_dir=out)
    cmp = res3["comparisons"]
    npr = cmp["no_npr_vs_control"]
    assert npr["reference"] == "batch_control" and npr["variant"] == "no_npr"
    assert npr["crossing"]["outcome"] == f"early: {VARIANT_BETTER}; late: {VARIANT_BETTER}"
    # late window (points at steps 600-800 of 800, measuring R at window centres c = 590-790 steps; C_mid 60):
    # Eq. 1's gap (0.76 - 0.70) / (1 + (60/c)^2) is 0.0594-0.0597
    assert npr["crossing"]["late"]["mean"] == pytest.approx(0.0595, abs=0.002)
    assert "npr_samples.png" in res3["plots"] and "| no_npr vs batch_control |" in (out / "README.md").read_text()
    assert cmp["batch_large_vs_control"]["reference"] == "batch_control"
    assert cmp["batch_large_vs_control"]["crossing"]["outcome"] == "crossed"
    assert cmp["batch_large"]["crossing"]["outcome"] == "crossed"
    null = cmp["batch_control"]["crossing"]
    assert null["outcome"] == f"early: {NOT_SEPARABLE}; late: {NOT_SEPARABLE}"
    assert abs(null["early"]["mean"]) < 0.005 and abs(null["late"]["mean"]) < 0.005
    assert "| batch_large vs batch_control |" in (out / "README.md").read_text()


def test_difference_panel_pairs_each_setting_by_seed_and_shows_the_batch_against_the_control():
    """The batch plot's lower panel: b - a per seed at b's points (a interpolated), seed mean +- 2 SE over seeds;
    hand-worked on straight lines: reference 0.5 + 0.001 x, control 0.5 + 0.001 x + 0.01 s, larger batch
    0.4 + 0.002 x + 0.02 s (s the seed)."""
    from scalerl_mega.reproduce2_analyse import _axis_panels

    x = np.array([0.0, 10.0, 20.0, 40.0])
    series = {}
    for s in (0, 1, 2):
        series[f"scalerl/seed{s}"] = (x, 0.5 + 0.001 * x)
        series[f"batch_control/seed{s}"] = (x, 0.5 + 0.001 * x + 0.01 * s)
        series[f"batch_large/seed{s}"] = (x[1:], 0.4 + 0.002 * x[1:] + 0.02 * s)
    runs = {rec: {s: Path(f"/unused/{rec}/seed{s}") for s in (0, 1, 2)} for rec in ("scalerl", "batch_control",
                                                                                     "batch_large")}
    panels = _axis_panels(runs, {"series": series}, ["scalerl", "batch_large", "batch_control"],
                          [("scalerl", "batch_large"), ("scalerl", "batch_small"), ("scalerl", "batch_control"),
                           ("batch_control", "batch_large")], binom=lambda _x, p: p * (1 - p) / 1600)
    diff = {c.label: c for c in panels[1].curves}
    assert sorted(diff) == ["batch_control - scalerl (3 seeds)", "batch_large - batch_control (3 seeds)",
                            "batch_large - scalerl (3 seeds)"]  # no smaller batch ran: no curve
    c = diff["batch_large - batch_control (3 seeds)"]
    # per seed: (0.4 + 0.002 x + 0.02 s) - (0.5 + 0.001 x + 0.01 s) = -0.1 + 0.001 x + 0.01 s; mean over s: +0.01
    assert np.asarray(c.x) == pytest.approx(x[1:])
    assert np.asarray(c.y) == pytest.approx(-0.09 + 0.001 * x[1:])
    se = np.std([0.0, 0.01, 0.02], ddof=1) / math.sqrt(3)
    assert np.asarray(c.hi) - np.asarray(c.y) == pytest.approx(np.full(3, 2 * se))
    assert np.asarray(diff["batch_large - scalerl (3 seeds)"].y) == pytest.approx(-0.08 + 0.001 * x[1:])
