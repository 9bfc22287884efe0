"""The predictability design (reproduction/predictability_analysis.py): the registered first-half forecast of a
run, scored on its second half, on synthetic runs with a known Eq. 1 curve written out in float64 here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from reproduction.common import BEGIN, END
from reproduction.predictability_analysis import analyse as analyse4
from reproduction.predictability_analysis import planned_half, register
from reproduction.reproduce import main as reproduce_main

PER_STEP, EVERY, STEPS, N = 256, 20, 800, 1600


def eq1(c, *, A, B, C_mid, R0):
    c = np.asarray(c, dtype=np.float64)
    return R0 + (A - R0) / (1.0 + (C_mid / c) ** B)


TRUE = dict(A=0.62, B=1.5, C_mid=40.0, R0=0.09)  # C_mid at ~156 steps of 256 samples (k samples)


def write_run(d: Path, *, upto: int, steps: int = STEPS, after_half=None, noise_seed: int | None = None):
    """A run of `steps` planned (run_config.yaml), logged to step `upto`: window validation every `EVERY` steps,
    each point Eq. 1 at its window's centre (k samples), optionally bent by `after_half(c, p)` past half the steps."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(noise_seed) if noise_seed is not None else None
    (d / "run_config.yaml").write_text(
        f"train:\n  steps: {steps}\n  prompts_per_step: 32\n  generations_per_prompt: 8\n  val_every: {EVERY}\n"
        "  val_mode: window\n")
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(upto + 1):
            if step:
                fh.write(json.dumps({"kind": "train", "step": step, "samples": float(PER_STEP)}) + "\n")
            if step % EVERY == 0:
                centre = step - EVERY // 2 if step else 0
                c = centre * PER_STEP / 1000.0
                p = float(eq1(c, **TRUE)) if step else TRUE["R0"]
                if after_half is not None and centre > steps / 2:
                    p = after_half(c, p)
                if rng is not None and step:
                    p = rng.binomial(N, p) / N
                line = {"kind": "validation", "step": step, "val_pass_rate": p, "val_prompts": 200.0,
                        "val_samples_per_prompt": N / 200.0}
                if step:
                    line["val_center_step"] = float(centre)
                fh.write(json.dumps(line) + "\n")
    if upto == steps:
        (d / "summary.json").write_text(json.dumps({"steps": steps, "wall_s": 10.0}))


def test_planned_half_by_hand(tmp_path):
    write_run(tmp_path / "r", upto=40)
    # last point at the centre of the last window: (800 - 10) x 256 samples; half of it in thousands
    assert planned_half(tmp_path / "r") == pytest.approx(0.5 * 790 * 256 / 1000)


def test_planned_half_names_the_file_and_keys_it_lacks(tmp_path):
    write_run(tmp_path / "r", upto=40)
    (tmp_path / "r" / "run_config.yaml").write_text("train:\n  steps: 800\n")
    with pytest.raises(ValueError, match=r"run_config.yaml: needs train.steps.*KeyError: 'prompts_per_step'"):
        planned_half(tmp_path / "r")
    (tmp_path / "r" / "run_config.yaml").unlink()
    with pytest.raises(ValueError, match=r"run_config.yaml: missing"):
        planned_half(tmp_path / "r")


def test_register_fits_the_first_half_and_keeps_earlier_entries(tmp_path):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    write_run(sweep / "predictability" / "seed0", upto=420)  # past half (step 400)
    write_run(sweep / "predictability" / "seed1", upto=300)  # not yet
    reg = register(sweep_dir=sweep, out_dir=out, commit="c0ffee")
    assert list(reg["runs"]) == ["scalerl/seed0"]
    e = reg["runs"]["scalerl/seed0"]
    assert e["commit"] == "c0ffee" and e["identified"], e["verdict"]
    assert e["A"] == pytest.approx(TRUE["A"], abs=0.01)
    # only the points at or below the half: steps 0, 20, ..., 400 (centres up to 390 <= 395)
    assert e["points"] == 21 and e["observed_to_k_samples"] == pytest.approx(410 * 256 / 1000)
    write_run(sweep / "predictability" / "seed0", upto=STEPS)  # goes on: its registered entry must not change
    write_run(sweep / "predictability" / "seed1", upto=500)
    reg2 = register(sweep_dir=sweep, out_dir=out, commit="beef")
    assert reg2["runs"]["scalerl/seed0"] == json.loads(json.dumps(e))
    assert reg2["runs"]["scalerl/seed1"]["commit"] == "beef"


def test_a_forecast_that_holds_and_one_that_fails(tmp_path):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    write_run(sweep / "predictability" / "seed0", upto=420)
    write_run(sweep / "predictability" / "seed1", upto=420)
    register(sweep_dir=sweep, out_dir=out, commit="c0ffee")
    write_run(sweep / "predictability" / "seed0", upto=STEPS)
    # seed 1 falls by 0.1 over its second half (the drained pool of repro3's reference)
    write_run(sweep / "predictability" / "seed1", upto=STEPS, after_half=lambda c, p: p - 0.1 * (c - 102.4) / 102.4)
    (out / "README.md").write_text(f"# head\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    res = analyse4(sweep_dir=sweep, out_dir=out)
    good, bad = res["runs"]["scalerl/seed0"], res["runs"]["scalerl/seed1"]
    for v in (good, bad):
        assert v["identified"] and v["finished"] and v["registered"]["same_fit"], v
        assert v["second_half"]["points"] == 20  # centres 410 .. 790
    assert good["second_half"]["ratio"] < 0.2 and good["second_half"]["inside_band"] == 20
    # the fall at the last three points (centres 750, 770, 790) by hand, against Eq. 1 there
    c_last = np.array([750, 770, 790]) * PER_STEP / 1000
    drop = 0.1 * (c_last - 102.4) / 102.4
    assert bad["mae"] == pytest.approx(float(np.mean(drop)), abs=0.01)
    floor = math.sqrt(2 / math.pi) * float(np.mean(np.sqrt(eq1(c_last, **TRUE) * (1 - eq1(c_last, **TRUE)) / N)))
    assert bad["noise_floor"] == pytest.approx(floor, rel=0.05)
    # over the second half (centres 410..790, mean compute 153.6k) the fall averages 0.1 x 51.2 / 102.4 = 0.05;
    # the floor there is ~sqrt(2/pi) x sqrt(0.6 x 0.4 / 1600) ~ 0.0098
    assert bad["second_half"]["bias"] == pytest.approx(-0.05, abs=0.005) and bad["second_half"]["ratio"] > 4
    assert res["summary"] == {"runs": 2, "scored": 2, "first_half_identified": 2, "most_identified": True}
    text = (out / "README.md").read_text()
    assert text.startswith("# head") and text.rstrip().endswith("tail") and "old" not in text
    assert "**2 of 2**" in text and "c0ffee" in text and (out / "forecast_samples.png").stat().st_size > 10_000
    # the committed copies (run_config.yaml included) analyse to the same result without the sweep
    assert (out / "runs" / "scalerl" / "seed0" / "run_config.yaml").is_file()
    again = analyse4(sweep_dir=None, out_dir=out)
    assert json.loads(json.dumps(again["runs"])) == json.loads(json.dumps(res["runs"]))


def test_an_unfinished_run_is_scored_at_its_planned_half_and_says_so(tmp_path, capsys):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    write_run(sweep / "predictability" / "seed0", upto=600, noise_seed=3)
    write_run(sweep / "predictability" / "seed1", upto=440)  # 2 points past the half (centres 410, 430): not scored
    res = analyse4(sweep_dir=sweep, out_dir=out)
    v = res["runs"]["scalerl/seed0"]
    assert not v["finished"] and v["steps_logged"] == 600
    assert v["half_compute"] == pytest.approx(0.5 * 790 * 256 / 1000)  # the planned half, not half of 600 steps
    assert "registered" not in v  # nothing was registered
    assert res["runs"]["scalerl/seed1"]["incomplete"] == "not yet 3 points past half its planned compute"
    assert res["summary"]["scored"] == 1
    # the CLI: register, then analyse the committed copies
    assert reproduce_main(["register", "--sweep-dir", str(sweep), "--out", str(out)]) == 0
    assert "registered scalerl/seed0" in capsys.readouterr().out
    assert reproduce_main(["analyse", "--design", "predictability", "--out", str(out), "--no-collect"]) == 0
    assert "(unfinished)" in (out / "README.md").read_text()


def test_the_cli_registers_and_analyses_the_designs_runs_only(tmp_path, capsys):
    """`--design predictability`: the design's run name is found, registered and analysed, its runs collected as
    curves; the runs of another overlay in the same directory are not."""
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    write_run(sweep / "predictability" / "seed0", upto=420)
    write_run(sweep / "loo_scalerl" / "seed1", upto=420)
    assert reproduce_main(["register", "--design", "predictability", "--sweep-dir", str(sweep), "--out", str(out)]) == 0
    assert "registered scalerl/seed0" in capsys.readouterr().out
    reg = json.loads((out / "forecasts.json").read_text())["runs"]
    assert list(reg) == ["scalerl/seed0"] and reg["scalerl/seed0"]["A"] == pytest.approx(TRUE["A"], abs=0.01)
    write_run(sweep / "predictability" / "seed0", upto=STEPS)
    assert reproduce_main(["analyse", "--sweep-dir", str(sweep), "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert list(res["runs"]) == ["scalerl/seed0"] and res["runs"]["scalerl/seed0"]["registered"]["same_fit"]
    assert (out / "runs" / "scalerl" / "seed0" / "curve.jsonl.xz").is_file()
    assert not (out / "runs" / "scalerl" / "seed0" / "metrics.jsonl").exists()
    assert "predictability" in (out / "README.md").read_text()


def test_a_verdict_with_a_pipe_stays_in_its_table_cell():
    """The misfit verdict says "mean |error|": escaped, the row keeps its 9 columns."""
    from reproduction.predictability_analysis import markdown as markdown4

    row = {"verdict": "A not identified: misfit: mean |error| 0.03", "half_compute": 1.0, "predicted": None,
           "observed": [0.5, 0.5, 0.5], "ratio": None, "unvetted_mae": 0.01, "finished": True, "steps_logged": 10,
           "whole_run": {"A": None, "A_interval": [0.5, 1.0], "B": 1.0}}
    text = markdown4({"summary": {"runs": 1, "scored": 1, "first_half_identified": 0, "most_identified": False},
                      "runs": {"scalerl/seed0": row}})
    line = next(x for x in text.splitlines() if x.startswith("| scalerl/seed0"))
    assert "mean \\|error\\|" in line and len(line.replace("\\|", "").split("|")) == 11
