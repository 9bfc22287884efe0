"""Issue 29's predictability test at twice the compute: each repro3 run whose whole 1,600-step (409,600-sample)
curve identifies Eq. 1's A is a first half; its fit is registered as a forecast before the run is continued
to twice its compute, and the continuation is then checked against it (paper Fig. 1, Sec. 6). See README.md.

    PYTHONPATH=$PWD .venv/bin/python reproduction/repro3_extend/extend.py register   # forecasts.json (before the runs)
    PYTHONPATH=$PWD .venv/bin/python reproduction/repro3_extend/extend.py start scalerl 1   # copy the run, print the command
    PYTHONPATH=$PWD .venv/bin/python reproduction/repro3_extend/extend.py check      # results.json, README table, plot

`register` fits the committed runs in reproduction/repro3/runs exactly as its analysis does (compute in thousands
of samples, `identify.assess` with the relative grid and the fast fit) and writes every run's verdict; only an
identified A gets a forecast. `start` copies outputs/reproduce3/<recipe>/seed<N> (its checkpoint at the end of
the 1,600 steps) to outputs/reproduce3_x2/<recipe>/seed<N> and prints the `scalerl_mega.train` command that
continues it with `train.steps` doubled (resume=auto: the metrics before the checkpoint are kept as they are).
`check` reads each continued run (outputs/reproduce3_x2, else its committed copy under runs/), evaluates the
registered Eq. 1 at the continuation's last 3 validation points and reports the error against the noise
floor (sqrt(2/pi) x the mean binomial SE, as reproduction/repro3's half-fit table does).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from scalerl_mega.reproduce2_report import read_curve
from scalerl_mega.reproduce_report import run_assessment
from scalerl_mega.scaling.io import run_metrics_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = ROOT / "reproduction" / "repro3" / "runs"
SWEEP = ROOT / "outputs" / "reproduce3"
OUT = ROOT / "outputs" / "reproduce3_x2"
FINAL_POINTS = 3


def recipes() -> dict[str, str]:
    """Setting (the directory under runs/) -> its experiment name, in sweep order."""
    from scalerl_mega.reproduce2_report import REPRO3_RUN_NAMES
    from scalerl_mega.reproduce_report import recipe_name

    return {recipe_name(n): n for n in REPRO3_RUN_NAMES}


def register(_args) -> None:
    from scalerl_mega.scaling.identify import verdict_text

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    entries = []
    for setting in recipes():
        for d in sorted((RUNS / setting).glob("seed*")):
            c, r, n = read_curve(d)
            a = run_assessment(c, r, n)
            c2 = 2.0 * float(c.max())
            e = {"run": f"{setting}/{d.name}", "identified": a.identified, "verdict": verdict_text(a),
                 "fitted_to_k_samples": float(c.max()), "target_k_samples": c2, **a.summary()}
            if a.identified:
                e["forecast_at_target"] = float(a.predict(c2))
            entries.append(e)
            print(f"{e['run']}: {e['verdict']}" + (f"; forecast at {c2:.1f}k samples: {e['forecast_at_target']:.3f}"
                                                   if a.identified else ""))
    (HERE / "forecasts.json").write_text(json.dumps({"registered_at_commit": commit, "axis": "k samples",
                                                     "runs": entries}, indent=1) + "\n")


def start(args) -> None:
    import yaml

    experiment = recipes()[args.setting]
    src = SWEEP / experiment / f"seed{args.seed}"
    dst = OUT / experiment / f"seed{args.seed}"
    if not (src / "checkpoints").is_dir():
        sys.exit(f"{src}: no checkpoints to continue from")
    steps = int(yaml.safe_load((src / "run_config.yaml").read_text())["train"]["steps"])
    if not dst.exists():
        shutil.copytree(src, dst)
        print(f"copied {src} -> {dst}", file=sys.stderr)
    print(f"OMP_NUM_THREADS=1 python -m scalerl_mega.train experiment={experiment} seed={args.seed} "
          f"train.steps={2 * steps} sft.checkpoint=outputs/reproduce3/sft hydra.run.dir={dst.relative_to(ROOT)}")


def continued_dir(run: str) -> Path | None:
    setting, seed = run.split("/")
    live = OUT / recipes()[setting] / seed
    if (live / "metrics.jsonl").exists():  # running or finished (its summary.json is the 1,600-step run's until then)
        return live
    kept = HERE / "runs" / setting / seed
    return kept if run_metrics_file(kept) is not None else None


def check(_args) -> None:
    from scalerl_mega.reproduce2_report import REPRO3_RUN_NAMES
    from scalerl_mega.reproduce_report import collect
    from scalerl_mega.scaling.fit import sigmoid_law
    from scalerl_mega.scaling.identify import binomial_noise_floor

    if OUT.is_dir():  # finished continuations (and the launch record) are kept next to this script
        collect(OUT, HERE / "runs", run_names=REPRO3_RUN_NAMES, compress_metrics=True)
    reg = json.loads((HERE / "forecasts.json").read_text())
    rows, curves = [], {}
    for e in reg["runs"]:
        d = continued_dir(e["run"])
        if not e["identified"] or d is None:
            continue
        c, r, n = curves[e["run"]] = read_curve(d)

        def registered(x, A=e["A"]):
            return sigmoid_law(x, A=A, B=e["B"], C_mid=e["C_mid"], R0=e["R0"])

        fc, fr, fn = c[-FINAL_POINTS:], r[-FINAL_POINTS:], n[-FINAL_POINTS:]
        pred, lo, hi = registered(fc), registered(fc, A=e["A_interval"][0]), registered(fc, A=e["A_interval"][1])
        floor = binomial_noise_floor(pred, fn)
        mae = float(np.mean(np.abs(pred - fr)))
        later = c > e["fitted_to_k_samples"]
        two_se = 2 * np.sqrt(fr * (1 - fr) / fn)
        row = {"run": e["run"], "A": e["A"], "A_interval": e["A_interval"], "final_k_samples": fc.tolist(),
               "observed": fr.tolist(), "predicted": pred.tolist(), "band": [lo.tolist(), hi.tolist()],
               "mae": mae, "noise_floor": floor, "ratio": mae / floor,
               "inside_band": int(np.sum((fr >= lo - two_se) & (fr <= hi + two_se))),
               "second_half_points": int(later.sum()),
               "second_half_mae": float(np.mean(np.abs(registered(c[later]) - r[later]))) if later.any() else None,
               "finished": float(c.max()) >= 0.999 * e["target_k_samples"]}
        rows.append(row)
        print(f"{e['run']}: forecast {np.round(pred, 3).tolist()} (A {e['A']:.3f}, {e['A_interval'][0]:.3f}.."
              f"{e['A_interval'][1]:.3f}) observed {np.round(fr, 3).tolist()} at {np.round(fc, 1).tolist()}k: "
              f"|error| {mae:.4f} = {mae / floor:.1f}x the floor {floor:.4f}; over all {row['second_half_points']} "
              f"points after the fitted range {row['second_half_mae'] or float('nan'):.4f}"
              + ("" if row["finished"] else f" (run not finished: {c.max():.0f}k of {e['target_k_samples']:.0f}k)"))
    (HERE / "results.json").write_text(json.dumps({"forecasts_registered_at": reg["registered_at_commit"],
                                                   "rows": rows}, indent=1) + "\n")
    plot(reg, rows, curves)


def plot(reg: dict, rows: list[dict], curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    from scalerl_mega.scaling.plot import ForecastPanel, plot_forecasts

    if not rows:
        return
    by_run = {e["run"]: e for e in reg["runs"]}
    panels = []
    for row in rows:
        e = by_run[row["run"]]
        c, r, n = curves[row["run"]]
        state = "" if row["finished"] else f" (stopped at {c.max():.0f}k of {e['target_k_samples']:.0f}k)"
        panels.append(ForecastPanel(title=f"{row['run']}: last 3 points off by {row['ratio']:.1f}x the noise floor{state}",
                                    compute=c, reward=r, n_samples=n, fitted_to=e["fitted_to_k_samples"],
                                    params={k: e[k] for k in ("A", "B", "C_mid", "R0")},
                                    A_interval=tuple(e["A_interval"]), extend_to=e["target_k_samples"]))
    plot_forecasts(panels, path=HERE / "forecast_x2.png", xlabel="Generated samples trained on (cumulative, thousands)",
                   ylim=(0.3, 0.75), title="Fit on the first half, forecast the second (registered before the runs "
                                           "were continued)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("register").set_defaults(fn=register)
    s = sub.add_parser("start")
    s.add_argument("setting", choices=sorted(recipes()))
    s.add_argument("seed", type=int)
    s.set_defaults(fn=start)
    sub.add_parser("check").set_defaults(fn=check)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
