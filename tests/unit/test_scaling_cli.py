"""`scalerl-fit` and its readers: tables, JSON, 'not identified', and one-line errors naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalerl_mega.scaling.cli import main
from scalerl_mega.scaling.io import read_series


def eq1(C, A, B, C_mid, r0=0.3):
    C = np.asarray(C, dtype=np.float64)
    return np.where(C > 0, r0 + (A - r0) / (1.0 + (C_mid / np.where(C > 0, C, 1.0)) ** B), r0)


def write_run(d: Path, C, R, *, extra_lines=True):
    d.mkdir(parents=True, exist_ok=True)
    with (d / "metrics.jsonl").open("w") as fh:
        for i, (c, r) in enumerate(zip(C, R)):
            if extra_lines:
                fh.write(json.dumps({"kind": "train", "step": i * 100, "loss": 0.5, "compute_gpu_hours": c}) + "\n")
            fh.write(json.dumps({"kind": "validation", "step": i * 100, "compute_gpu_hours": float(c),
                                 "compute_device_hours": float(c) * 4, "val_pass_rate": float(r)}) + "\n")
    return d


def scalerl_run(tmp_path, name="scalerl", seed=0, A=0.61, B=1.92, cm=2542.0):
    C = np.linspace(0.0, 5 * cm, 81)
    R = eq1(C, A, B, cm) + np.random.default_rng(seed).normal(0, 0.005, C.size)
    return write_run(tmp_path / name, C, R)


def test_reader_selects_validation_rows(tmp_path):
    d = scalerl_run(tmp_path)
    s = read_series(d)
    assert s.compute.size == 81 and s.name == "scalerl"
    assert list(s.lines[:2]) == [2, 4]  # validation lines interleave with train lines
    t = read_series(d / "metrics.jsonl", x="compute_device_hours")
    assert np.allclose(t.compute, 4 * s.compute)


def test_reader_compressed_files_and_run_dirs(tmp_path):
    """Committed sweep runs store metrics.jsonl.xz (older ones .gz): a run directory holding only that file, a
    .jsonl.xz/.gz and a .csv.xz/.gz read exactly as their plain forms (labels and line numbers included); a
    directory holding both reads the .xz."""
    import gzip
    import lzma

    d = scalerl_run(tmp_path)
    plain = read_series(d)
    for suffix, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
        z_dir = tmp_path / suffix[1:] / "scalerl"
        z_dir.mkdir(parents=True)
        (z_dir / f"metrics.jsonl{suffix}").write_bytes(compress((d / "metrics.jsonl").read_bytes()))
        for got in (read_series(z_dir), read_series(z_dir / f"metrics.jsonl{suffix}")):
            assert got.name == "scalerl" and np.array_equal(got.compute, plain.compute)
            assert np.array_equal(got.reward, plain.reward) and np.array_equal(got.lines, plain.lines)
    both = tmp_path / "xz" / "scalerl"
    other = b'{"step": 1, "compute_gpu_hours": 1, "val_pass_rate": 0.9}\n'
    (both / "metrics.jsonl.gz").write_bytes(gzip.compress(other))
    assert np.array_equal(read_series(both).reward, plain.reward)  # .xz before .gz
    csv_text = b"compute_gpu_hours,val_pass_rate\r\n0,0.3\r\n100,\r\n200,0.35\r\n"
    for suffix, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
        c = tmp_path / f"run.csv{suffix}"
        c.write_bytes(compress(csv_text))
        s = read_series(c)
        assert list(s.compute) == [0.0, 200.0] and list(s.reward) == [0.3, 0.35] and list(s.lines) == [2, 4]


def test_reader_csv_and_errors(tmp_path):
    p = tmp_path / "run.csv"
    p.write_text("compute_gpu_hours,val_pass_rate\n0,0.3\n100,\n200,0.35\n")
    s = read_series(p)
    assert list(s.compute) == [0.0, 200.0] and list(s.lines) == [2, 4]
    q = tmp_path / "bad.csv"
    q.write_text("compute,val_pass_rate\n0,0.3\n")
    with pytest.raises(ValueError, match=r"bad.csv: missing column\(s\) \['compute_gpu_hours'\]"):
        read_series(q)


def test_cli_table_and_json(tmp_path, capsys):
    a = scalerl_run(tmp_path, "scalerl")
    b = scalerl_run(tmp_path, "scout", seed=1, A=0.71, B=1.65, cm=4242.0)
    assert main([str(a), str(b), "--refine"]) == 0
    out = capsys.readouterr().out
    assert "grid: paper" in out and "leave-one-out at the common A=" in out
    assert out.count("A beyond the +-0.02 seed margin of the mean") == 2  # A 0.61 vs 0.71: 0.05 from the mean
    assert main([str(a), str(b), "--json", "--plot-dir", str(tmp_path / "plots")]) == 0
    data = json.loads(capsys.readouterr().out)
    runs = {r["run"]: r for r in data["runs"]}
    assert abs(runs["scalerl"]["A"] - 0.61) <= 0.02 and abs(runs["scout"]["A"] - 0.71) <= 0.02
    assert runs["scalerl"]["identified"] and runs["scalerl"]["holdout"]["later"]["points"] > 0
    assert (tmp_path / "plots" / "scaling.png").exists() and (tmp_path / "plots" / "loo.svg").exists()
    loo = data["loo"]
    assert loo["A_mean"] == pytest.approx((runs["scalerl"]["A"] + runs["scout"]["A"]) / 2, abs=1e-6)
    assert {r["run"] for r in loo["runs"]} == {"scalerl", "scout"} and loo["best"] in ("scalerl", "scout")
    assert all(not r["within_margin"] and r["B_at_A_mean"] > 0 for r in loo["runs"])


def test_cli_truncated_run_says_not_identified(tmp_path, capsys):
    C = np.linspace(0.0, 0.8 * 2542.0, 60)
    R = eq1(C, 0.61, 1.92, 2542.0) + np.random.default_rng(0).normal(0, 0.0075, C.size)
    d = write_run(tmp_path / "trunc", C, R)
    assert main([str(d), "--fit-from", "none", "--grid", "relative"]) == 0
    out = capsys.readouterr().out
    row = [ln for ln in out.splitlines() if ln.startswith("trunc ")][0]
    assert "not identified" in row and "NO" in row
    assert main([str(d), "--fit-from", "none", "--grid", "relative", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["runs"][0]
    assert r["identified"] is False and r["A"] is None and r["reason"]


@pytest.mark.parametrize(
    "lines,msg",
    [
        (['{"compute_gpu_hours": 0, "val_pass_rate": 0.3}', '{"compute_gpu_hours": 10, "val_pass_rate": NaN}'],
         r"metrics.jsonl:2: val_pass_rate is nan"),
        (['{"compute_gpu_hours": 5, "val_pass_rate": 0.3}', '{"compute_gpu_hours": 1, "val_pass_rate": 0.4}'],
         r"metrics.jsonl:2: compute_gpu_hours decreases"),
        (['{"compute_gpu_hours": 0, "val_pass_rate": 0.3}', "{oops"], r"metrics.jsonl:2: invalid JSON"),
        (['{"kind": "train", "loss": 1.0}'], r"metrics.jsonl: no rows with 'val_pass_rate'"),
        ([json.dumps({"compute_gpu_hours": c, "val_pass_rate": 0.3 + c / 1e5}) for c in (0, 2000, 3000, 4000)],
         r"metrics.jsonl: fit window \[1500, inf\] holds 3 point\(s\)"),
        (['{"compute_gpu_hours": 0, "val_pass_rate": true}'], r"metrics.jsonl:1: val_pass_rate = True is not a number"),
    ],
)
def test_cli_bad_input_errors(tmp_path, capsys, lines, msg):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scalerl-fit: error: ") and str(d) in err
    assert len(err.strip().splitlines()) == 1
    import re

    assert re.search(msg, err), err


def test_cli_empty_window_named(tmp_path, capsys):
    C = np.linspace(0.0, 1000.0, 20)
    d = write_run(tmp_path / "small", C, eq1(C, 0.6, 1.5, 300.0))
    assert main([str(d), "--grid", "paper"]) == 2
    err = capsys.readouterr().err
    assert "small" in err and "empty fit window" in err


def test_console_script_runs_without_traceback(tmp_path):
    exe = Path(sys.executable).parent / "scalerl-fit"
    if not exe.exists():
        pytest.skip("console script not installed in this environment")
    r = subprocess.run([str(exe), str(tmp_path / "missing")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no such file" in r.stderr


def test_cli_seeds_and_bootstrap(tmp_path, capsys):
    runs = [str(scalerl_run(tmp_path, f"seed{k}", seed=10 + k)) for k in range(3)]
    assert main(runs + ["--same-config", "--bootstrap", "8", "--holdout", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    per = [r["A"] for r in data["runs"]]
    assert data["seeds"]["per_seed_A"] == pytest.approx(per)
    assert data["seeds"]["half_range_A"] == pytest.approx((max(per) - min(per)) / 2)
    bp = data["runs"][0]["bootstrap_points"]
    assert bp["seed_margin_A"] == 0.02 and bp["A"][0] <= bp["A"][1]


def write_token_run(d: Path, *, A, B, cm_tokens, tokens_per_step, steps=50, every=5, r0=0.3, noise=0.0, seed=0):
    """A run logged like the loop: one `train` line per step with batch/tokens, a `validation` line every
    `every` steps whose pass rate is Eq. 1 at the cumulative tokens so far (+ noise)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    total = 0.0
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(steps + 1):
            if step:
                total += tokens_per_step[step - 1]
                fh.write(json.dumps({"kind": "train", "step": step, "batch/tokens": tokens_per_step[step - 1],
                                     "compute_device_hours": 0.001 * step}) + "\n")
            if step % every == 0:
                r = float(eq1([total], A, B, cm_tokens, r0)[0]) + (rng.normal(0, noise) if step else 0.0)
                fh.write(json.dumps({"kind": "validation", "step": step, "val_pass_rate": r,
                                     "compute_device_hours": 0.001 * step + 0.0005}) + "\n")
    return d


def test_cumulative_x_key_sums_earlier_lines(tmp_path):
    tokens = [1000.0 + 10 * k for k in range(50)]  # uneven steps: the sum is not steps x constant
    d = write_token_run(tmp_path / "run", A=0.8, B=2.0, cm_tokens=15000.0, tokens_per_step=tokens)
    s = read_series(d, x="sum:batch/tokens")
    np.testing.assert_allclose(s.compute, [sum(tokens[:k]) for k in range(0, 51, 5)])
    with pytest.raises(ValueError, match="no line carries 'nope'"):
        read_series(d, x="sum:nope")
    csv = tmp_path / "r.csv"
    csv.write_text("compute_gpu_hours,val_pass_rate\n1,0.5\n")
    with pytest.raises(ValueError, match="cumulative keys"):
        read_series(csv, x="sum:batch/tokens")


def test_cli_fits_on_cumulative_tokens(tmp_path, capsys):
    """Known parameters in token units are recovered through `--x sum:batch/tokens` (the wall-clock key of the
    same file would give another curve)."""
    tokens = [1000.0 + 10 * (k % 7) for k in range(60)]
    d = write_token_run(tmp_path / "run", A=0.8, B=2.0, cm_tokens=15000.0, tokens_per_step=tokens, steps=60,
                        every=3)
    assert main([str(d), "--x", "sum:batch/tokens", "--grid", "relative", "--json", "--holdout", "0",
                 "--refine"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert row["identified"]
    assert row["refined"]["A"] == pytest.approx(0.8, abs=0.005)
    assert row["refined"]["B"] == pytest.approx(2.0, rel=0.02)
    assert row["refined"]["C_mid"] == pytest.approx(15000.0, rel=0.02)


def test_grid_auto_is_relative_off_the_gpu_hour_axis(tmp_path, capsys):
    """A token axis reaching far beyond 1,500 units must not get the GPU-hour grid and cut."""
    tokens = [1000.0] * 60
    d = write_token_run(tmp_path / "run", A=0.8, B=2.0, cm_tokens=15000.0, tokens_per_step=tokens, steps=60, every=3)
    assert main([str(d), "--x", "sum:batch/tokens", "--json", "--holdout", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["grid"].startswith("relative") and "fit from 0.1 x each run's largest compute" in data["grid"]
    row = data["runs"][0]
    assert row["fit_from"] == pytest.approx(6000.0)  # 0.1 x 60,000 tokens
    # every run carries A, B, C_mid, A_interval, identified and the reason (noise-free here: identified)
    assert {"A", "B", "C_mid", "A_interval", "identified", "reason"} <= set(row)
    assert row["identified"] and row["reason"] == "" and row["A_interval"][0] <= 0.8 <= row["A_interval"][1]
    # the GPU-hour axis of a large run still gets the paper grid and its 1.5k cut
    a = scalerl_run(tmp_path)
    assert main([str(a), "--json", "--holdout", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["grid"].startswith("paper") and data["runs"][0]["fit_from"] == 1500.0


def test_json_not_identified_has_interval_and_no_A(tmp_path, capsys):
    C = np.linspace(0.0, 0.8 * 2542.0, 60)
    R = eq1(C, 0.61, 1.92, 2542.0) + np.random.default_rng(0).normal(0, 0.0075, C.size)
    d = write_run(tmp_path / "trunc", C, R)
    assert main([str(d), "--grid", "relative", "--json", "--val-samples", "4000"]) == 0
    r = json.loads(capsys.readouterr().out)["runs"][0]
    assert r["identified"] is False and r["A"] is None and "wide (need <= 0.04" in r["reason"]
    lo, hi = r["A_interval"]
    assert lo <= 0.61 <= hi and hi - lo > 0.04
    assert r["misfit_check"]["noise_source"] == "binomial SE of each held-out point"
    assert r["verdict"].startswith(f"A not identified (95% interval {lo:.3f}..{hi:.3f})")


def test_holdout_is_the_reproductions_first_half_forecast(capsys):
    """One half-fit forecast, not two: `scalerl-fit RUN --holdout 0.5` on a committed curve of the reproduction's
    predictability design gives the first-half verdict, the forecast and its score over the second half that the
    design's analysis committed (its half is half the run's planned compute, here the last point's: the same)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "reproduction" / "predictability"
    committed = json.loads((root / "results.json").read_text())["runs"]
    for key in ("scalerl/seed0", "scalerl/seed1"):
        assert main([str(root / "runs" / key), "--x", "sum:samples", "--holdout", "0.5", "--json"]) == 0
        h = json.loads(capsys.readouterr().out)["runs"][0]["holdout"]
        want = committed[key]
        assert h["split_compute"] == pytest.approx(want["half_compute"] * 1e3, rel=1e-9)  # analysis: k samples
        assert h["identified"] == want["identified"] and h["verdict"] == want["verdict"]
        assert h["A_interval"] == pytest.approx(want["first_half"]["A_interval"], abs=1e-9)
        for k in ("points", "forecast", "inside_band"):
            assert h["later"][k] == want["second_half"][k]
        for k in ("mae", "noise_floor", "ratio", "bias"):
            assert h["later"][k] == pytest.approx(want["second_half"][k], rel=1e-6)
        assert h["final_points"]["unvetted_mae"] == pytest.approx(want["unvetted_mae"], rel=1e-6)
    assert main([str(root / "runs" / "scalerl" / "seed0"), "--x", "sum:samples"]) == 0
    out = capsys.readouterr().out
    assert "forecast error / floor" in out and "1.0x" in out  # seed 0: 0.0094 / 0.0094 over 160 points


def cpu_run(tmp_path, name="cpu"):
    """A CPU run as the loop logs it: GPU-hours 0 on every line, device-hours growing; 1,600 samples per point."""
    d = tmp_path / name
    d.mkdir()
    C = np.linspace(0.0, 0.4, 81)
    R = eq1(C, 0.7, 1.6, 0.05, 0.2) + np.random.default_rng(1).normal(0, 0.004, C.size)
    with (d / "metrics.jsonl").open("w") as fh:
        for i, (c, r) in enumerate(zip(C, R)):
            fh.write(json.dumps({"kind": "validation", "step": i, "compute_gpu_hours": 0.0, "compute_device_hours": c,
                                 "val_pass_rate": float(r), "val_prompts": 200.0, "val_samples_per_prompt": 8.0})
                     + "\n")
    return d, C, R


def test_a_cpu_run_is_fitted_on_device_hours_by_default(tmp_path, capsys):
    """GPU-hours are 0 on a CPU run; the default axis picks device-hours and says so, an explicit
    GPU-hour axis fails with the way out."""
    d, C, _ = cpu_run(tmp_path)
    assert main([str(d), "--json", "--holdout", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["x"] == "compute_device_hours" and "no run logged GPU-hours" in data["x_note"]
    assert data["runs"][0]["compute_range"][1] == pytest.approx(C.max())
    assert main([str(d), "--holdout", "0"]) == 0
    assert capsys.readouterr().out.startswith("x axis: compute_device_hours (--x auto")
    assert main([str(d), "--x", "compute_gpu_hours"]) == 2
    err = capsys.readouterr().err
    assert "every compute_gpu_hours is 0" in err and "--x compute_device_hours" in err
    gpu = scalerl_run(tmp_path)  # a GPU run: auto takes GPU-hours
    assert main([str(gpu), "--json", "--holdout", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["x"] == "compute_gpu_hours"


def test_forecast_rows_beyond_fit_to_and_at_chosen_budgets(tmp_path, capsys):
    """With --fit-to X every point beyond X gets a row {compute, reward, lo, hi} (and the point
    observed there), --forecast-at adds budgets; the band holds Eq. 1's truth; the table shows the same rows."""
    d, C, R = cpu_run(tmp_path)
    assert main([str(d), "--fit-to", "0.2", "--forecast-at", "0.8", "--json", "--holdout", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    run = data["runs"][0]
    later = C[C > 0.2]
    rows = run["forecast"]
    assert [r["compute"] for r in rows] == pytest.approx(sorted([*later.tolist(), 0.8]))
    assert set(rows[0]) == {"compute", "reward", "lo", "hi", "observed"} and "observed" not in rows[-1]
    truth = eq1(np.array([r["compute"] for r in rows]), 0.7, 1.6, 0.05, 0.2)
    assert all(r["lo"] <= r["reward"] <= r["hi"] for r in rows)
    assert np.mean([r["lo"] <= t <= r["hi"] for r, t in zip(rows, truth)]) >= 0.9
    assert rows[0]["observed"] == pytest.approx(float(R[C > 0.2][0]))
    assert "profile likelihood" in data["forecast_method"]
    assert main([str(d), "--fit-to", "0.2", "--forecast-at", "0.8", "--holdout", "0"]) == 0
    out = capsys.readouterr().out
    assert "forecast for cpu" in out and f"{rows[-1]['lo']:.4f}..{rows[-1]['hi']:.4f}" in out and "--json has all" in out
    assert main([str(d), "--json", "--holdout", "0"]) == 0  # default: one row at twice the last compute
    rows = json.loads(capsys.readouterr().out)["runs"][0]["forecast"]
    assert [r["compute"] for r in rows] == pytest.approx([0.8])


def test_fit_to_moves_the_auto_cut_into_the_fit_window(tmp_path, capsys):
    """`--fit-to 0.01` on a run of compute 0..0.1 kept the auto cut at 0.1 x 0.1 = 0.01, leaving no point
    to fit ("empty fit window"); the cut is now 0.1 x the largest compute fitted (<= 0.01): 0.001."""
    from scalerl_mega.scaling.fit import FitOptions
    from scalerl_mega.scaling.identify import options_for

    C = np.linspace(0.0, 0.1, 81)
    d = write_run(tmp_path / "demo", C, eq1(C, 0.8, 1.5, 0.004))
    assert options_for(C, grid="relative", base=FitOptions(fit_to=0.01)).fit_from == pytest.approx(0.1 * 0.01)
    assert options_for(C, grid="relative", base=FitOptions()).fit_from == pytest.approx(0.1 * 0.1)
    assert main([str(d), "--fit-to", "0.01", "--forecast-at", "0.05", "--json"]) == 0, capsys.readouterr().err
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["n_points"] == int(np.sum((C >= 0.001) & (C <= 0.01))), run.get("n_points")
