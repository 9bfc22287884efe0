"""The predictability design (`python -m reproduction.reproduce ... --design predictability`): the final recipe
(conf/experiment/reproduction/predictability.yaml, 6,400 steps on a one-pass prompt stream) fitted on the first half
of each seed's compute and extrapolated to the second (paper Fig. 1, Sec. 6), with the forecast registered before
the second half is observed; reproduction/predictability/README.md holds the method and the results.

    python -m reproduction.reproduce sweep    --design predictability --seeds 0   # a run
    python -m reproduction.reproduce register --design predictability             # forecasts.json, once halfway
    python -m reproduction.reproduce analyse  --design predictability [--no-collect]

`register` fits every run of the sweep that has passed half its steps on the validation points of its first half
(the points at or below half the run's planned compute: `planned_half`) by the identification rule
(`scalerl_mega.scaling.holdout.first_half_assessment`), and writes the Eq. 1 parameters, A's interval and the
verdict to `<out>/forecasts.json` with the commit; a run already registered keeps its entry. Committing that file
before the run goes on is the registration.

`analyse` collects each run (finished or not: `finished` says which) as a curve into `<out>/runs/scalerl/seed<N>/`,
repeats the first-half fit (and checks that it is the registered one), and scores the forecast on every second-half
point and on the last 3 against the binomial noise floor (`scalerl_mega.scaling.holdout`); where A is not
identified there is no forecast and the unvetted fit's error is reported as what a forecast would have missed by.
Compute axis: cumulative generated samples in thousands (`reproduction.common.SAMPLES_AXIS`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from scalerl_mega.metrics.writer import read_metrics
from scalerl_mega.scaling.band import forecast_band
from scalerl_mega.scaling.holdout import FINAL_POINTS, first_half_assessment, half_fit, overdispersion, params, \
    score_later
from scalerl_mega.scaling.identify import verdict_text
from scalerl_mega.scaling.io import run_metrics_file
from scalerl_mega.scaling.plot import ForecastPanel, plot_forecasts

from reproduction.common import (BEGIN, END, SAMPLES_AXIS, collect, fmt, json_safe, read_curve, recipe_name,
                                 run_assessment, run_finished, write_analysis_json, write_generated)

RUN_NAME = "predictability"
"""The design's overlay (conf/experiment/reproduction/predictability.yaml) and run name."""
FORECASTS = "forecasts.json"
SAME_FIT_TOL = 1e-9
"""Largest difference in A, B or C_mid between the registered first-half fit and the analysis' repeat of it."""


def planned_half(run_dir: Path) -> float:
    """Half the compute (thousands of samples) of the run's planned last validation point: its run_config's
    `train.steps` x prompts x samples per step, less half a window where validation is spread over windows
    (the point sits at the window's centre). The half-fit of the finished run uses half of its last point's
    compute: the same number."""
    import yaml

    path = run_dir / "run_config.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: missing (the run's config gives its planned steps; collect copies it)")
    try:
        t = yaml.safe_load(path.read_text())["train"]
        per_step = float(t["prompts_per_step"]) * float(t["generations_per_prompt"])
        last = float(t["steps"]) - (0.5 * float(t["val_every"]) if t.get("val_mode") == "window" else 0.0)
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: needs train.steps, train.prompts_per_step, train.generations_per_prompt and "
                         f"train.val_every ({type(e).__name__}: {e})") from e
    return 0.5 * last * per_step * SAMPLES_AXIS.scale


def register(*, sweep_dir: Path, out_dir: Path, commit: str | None, run_name: str = RUN_NAME) -> dict[str, Any]:
    """Write `<out_dir>/forecasts.json` (module docstring) for the runs of `run_name`; returns its content. A run
    not yet past half its planned compute is named in `pending`."""
    path = out_dir / FORECASTS
    reg = json.loads(path.read_text()) if path.is_file() else {"axis": SAMPLES_AXIS.unit, "runs": {}}
    pending = []
    setting = recipe_name(run_name)
    for d in sorted((sweep_dir / run_name).glob("seed*")):
        key = f"{setting}/{d.name}"
        if key in reg["runs"] or not (d / "metrics.jsonl").is_file():
            continue
        half = planned_half(d)
        c, r, n = read_curve(d)
        if c.size == 0 or float(c.max()) <= half:
            pending.append(f"{key}: {float(c.max()) if c.size else 0.0:.1f}k of the half's {half:.1f}k samples")
            continue
        a = first_half_assessment(c, r, n, half=half)
        f = a.fit
        reg["runs"][key] = {"commit": commit, "half_k_samples": half, "points": int((c <= half).sum()),
                            "observed_to_k_samples": float(c.max()), "verdict": verdict_text(a), **a.summary(),
                            "fit": params(f)}
        print(f"registered {key}: {verdict_text(a)}")
    for p in pending:
        print(f"not yet halfway: {p}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(reg), indent=1) + "\n")
    return reg


def score_run(c: np.ndarray, r: np.ndarray, n: np.ndarray, *, half: float, registered: dict | None) -> dict[str, Any]:
    """The first-half fit scored on the second half: `holdout.half_fit` at the planned half, `holdout.score_later`
    over every point past it, and whether the fit is the registered one."""
    h = half_fit(c, r, n, half_compute=half)
    fit = params(h.assessment.fit)
    out: dict[str, Any] = {f: getattr(h, f) for f in h.__dataclass_fields__ if f != "assessment"}
    out["first_half"] = h.assessment.summary()
    out["fit"] = fit
    if registered is not None:
        diff = max(abs(registered["fit"][k] - fit[k]) for k in ("A", "B", "C_mid"))
        out["registered"] = {"commit": registered.get("commit"), "same_fit": diff <= SAME_FIT_TOL,
                             "observed_to_k_samples": registered.get("observed_to_k_samples"), "max_difference": diff}
    later = score_later(c, r, n, half=h)
    if later is not None:
        out["second_half"] = later
        out["band"] = band_check(c, r, n, half=half, fit=h.assessment.fit)
    return out


BAND_CHECKPOINTS = (0.625, 0.75, 0.875, 1.0)
"""Where the README reads the band: these shares of the run's last compute (the half is 0.5)."""
WINDOW = 20
"""Observed points averaged around each checkpoint (a point's binomial SE is ~0.012; 20 average to ~0.003)."""


def band_check(c: np.ndarray, r: np.ndarray, n: np.ndarray, *, half: float, fit) -> dict[str, Any]:
    """What the 95% forecast band of the first-half fit (`scalerl_mega.scaling.band`, fitted on the points up to the
    half only, as registered) says about the second half: at each checkpoint the forecast and its band next to the
    mean of the WINDOW observed points closest to it (with that mean's binomial SE), and the share of second-half
    points inside the band widened by 2 binomial SE (a single point's noise)."""
    first, later = c <= half, c > half
    band = forecast_band(c[first], r[first], fit=fit, at=c[later], n_samples=n[first])
    two_se = 2.0 * np.sqrt(np.clip(r[later] * (1 - r[later]), 0, None) / n[later])
    inside = (r[later] >= band.lo - two_se) & (r[later] <= band.hi + two_se)
    rows = []
    for q in BAND_CHECKPOINTS:
        target = q * float(c.max())
        k = int(np.argmin(np.abs(band.compute - target)))
        near = np.argsort(np.abs(c - band.compute[k]))[:WINDOW]
        mean = float(r[near].mean())
        se = float(np.sqrt(np.mean(r[near] * (1 - r[near]) / n[near]) / near.size))
        rows.append({"compute": float(band.compute[k]), "reward": float(band.reward[k]), "lo": float(band.lo[k]),
                     "hi": float(band.hi[k]), "observed_mean": mean, "observed_se": se,
                     "covered": bool(band.lo[k] <= mean <= band.hi[k])})
    return {"kappa": band.kappa, "inside_2se": int(inside.sum()), "points": int(later.sum()), "checkpoints": rows}


def analyse(*, sweep_dir: Path | None, out_dir: Path, run_name: str = RUN_NAME, label: str = RUN_NAME
            ) -> dict[str, Any]:
    """Collect the runs of `run_name` (unless `sweep_dir` is None; unfinished runs too), score and write `out_dir`
    (module docstring). `label`: the design's name in the plot title and messages."""
    setting = recipe_name(run_name)
    runs_dir = out_dir / "runs" / setting
    if sweep_dir is not None:
        collect(sweep_dir, out_dir / "runs", run_names=(run_name,), unfinished=True)
    reg_path = out_dir / FORECASTS
    reg = json.loads(reg_path.read_text())["runs"] if reg_path.is_file() else {}
    rows: dict[str, Any] = {}
    curves = {}
    for d in sorted(runs_dir.glob("seed*")):
        key = f"{setting}/{d.name}"
        c, r, n = curves[key] = read_curve(d)
        half = planned_half(d)
        if int((c > half).sum()) < FINAL_POINTS:
            rows[key] = {"steps_logged": _last_step(d),
                         "incomplete": f"not yet {FINAL_POINTS} points past half its planned compute"}
            continue
        row = score_run(c, r, n, half=half, registered=reg.get(key))
        whole = run_assessment(c, r, n)
        row["whole_run"] = {"verdict": verdict_text(whole), **whole.summary(),
                            "overdispersion": overdispersion(whole.fit, c, n)}
        row["finished"] = run_finished(d)
        row["steps_logged"] = _last_step(d)
        row["planned_k_samples"] = 2.0 * half
        rows[key] = row
    if not rows:
        raise ValueError(f"{runs_dir}: no runs of {run_name} (run `make reproduce-sweep DESIGN={label}`)")
    scored = [v for v in rows.values() if "incomplete" not in v]
    ident = sum(1 for v in scored if v["identified"])
    summary = {"runs": len(rows), "scored": len(scored), "first_half_identified": ident,
               "most_identified": bool(scored) and ident > len(scored) / 2}
    results = {"axis": SAMPLES_AXIS.key, "summary": summary, "runs": rows}
    results["plots"] = _plot(rows, curves, out_dir / "forecast_samples.png", label=label) if scored else []
    write_analysis_json(out_dir / "results.json", results)
    write_generated(out_dir / "README.md", markdown(results), title=label)
    return results


def _last_step(d: Path) -> int:
    return max((int(x["step"]) for x in read_metrics(run_metrics_file(d), kind="train")), default=0)


def _cell(text: str) -> str:
    """`text` inside a markdown table cell (a verdict's "mean |error|" would end the cell)."""
    return text.replace("|", "\\|")


def markdown(results: dict[str, Any]) -> str:
    """The generated section: one row per seed."""
    s = results["summary"]
    lines = [BEGIN, "",
             f"First half identifies A for **{s['first_half_identified']} of {s['scored']}** scored runs"
             f" ({s['runs']} in all); the design asks for most: "
             f"**{'met' if s['most_identified'] else 'not met'}**.", "",
             "| run | steps | first half (fit to) | forecast at the last 3 points (observed) | last 3: error / floor "
             "| second half: points, mean error / floor, bias, inside A's band | unvetted fit's error at the last 3 "
             "| whole run | registered |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, v in results["runs"].items():
        if "incomplete" in v:
            lines.append(f"| {key} | {v['steps_logged']} | {v['incomplete']} | | | | | | |")
            continue
        pred = "no forecast" if v["predicted"] is None else ", ".join(f"{x:.3f}" for x in v["predicted"])
        obs = ", ".join(f"{x:.3f}" for x in v["observed"])
        sh = v.get("second_half") or {}
        sh_txt = (f"{sh['points']}, {sh['mae']:.4f} / {sh['noise_floor']:.4f} = {sh['ratio']:.1f}x, "
                  f"{sh['bias']:+.4f}, {sh['inside_band']}" + ("" if sh.get("forecast") else " (unvetted)")) if sh else "-"
        last = "-" if v["ratio"] is None else f"{v['mae']:.4f} / {v['noise_floor']:.4f} = {v['ratio']:.1f}x"
        reg = v.get("registered")
        reg_txt = "not registered" if reg is None else (
            f"{(reg['commit'] or '?')[:7]} (at {reg['observed_to_k_samples']:.0f}k)"
            + ("" if reg["same_fit"] else f"; **differs by {reg['max_difference']:.2g}**"))
        w = v["whole_run"]
        whole = f"A {fmt(w['A'], '.3f')} ({w['A_interval'][0]:.3f}..{w['A_interval'][1]:.3f}), B {w['B']:.2f}"
        state = "" if v["finished"] else " (unfinished)"
        lines.append(f"| {key} | {v['steps_logged']}{state} | {_cell(v['verdict'])} ({v['half_compute']:.1f}k) | {pred} ({obs}) "
                     f"| {last} | {sh_txt} | {v['unvetted_mae']:.4f} | {whole} | {reg_txt} |")
    lines += ["", "Compute: cumulative generated samples, thousands. Noise floor: sqrt(2/pi) x the mean binomial SE "
              "of the points scored (the mean |error| a perfect forecast would still show). Inside A's band: "
              "second-half points within Eq. 1 at A's 95% interval +- 2 binomial SE.", ""]
    lines += _band_lines(results)
    lines += ["", "![first half fitted, second half forecast](forecast_samples.png)", "", END]
    return "\n".join(lines)


def _band_lines(results: dict[str, Any]) -> list[str]:
    """What the 95% forecast band (`scaling.band`) of each registered first-half fit says, checkpoint by checkpoint:
    the forecast, the band, and the mean of the 20 observed points around it."""
    runs = {k: v["band"] for k, v in results["runs"].items() if v.get("band")}
    if not runs:
        return []
    cps = next(iter(runs.values()))["checkpoints"]
    lines = ["The 95% forecast band of each first-half fit (`scalerl_mega/scaling/band.py`: parameter uncertainty and "
             "the misfit of Eq. 1 measured on the first half's own tail), at 5/8, 3/4, 7/8 and all of the run's "
             "compute: forecast [band], then the mean of the 20 observed points around it (+- its binomial SE).", "",
             "| run | kappa | " + " | ".join(f"{cp['compute']:.0f}k" for cp in cps) + " | second-half points in the band "
             "+- 2 SE |", "|---|---|" + "---|" * len(cps) + "---|"]
    for key, b in runs.items():
        cells = [f"{cp['reward']:.3f} [{cp['lo']:.3f}, {cp['hi']:.3f}]: {cp['observed_mean']:.3f} +- "
                 f"{cp['observed_se']:.3f}{'' if cp['covered'] else ' **outside**'}" for cp in b["checkpoints"]]
        lines.append(f"| {key} | {b['kappa']:.4f} | " + " | ".join(cells) + f" | {b['inside_2se']} of {b['points']} |")
    return lines


def _plot(rows: dict[str, Any], curves: dict[str, tuple[np.ndarray, ...]], path: Path, *, label: str) -> list[str]:
    """One panel per scored run (`scaling.plot.plot_forecasts`): the first half fitted, the second observed, the
    forecast with A's band where the first half identifies A (the fit dashed where it does not)."""
    panels = []
    for key, v in rows.items():
        if "incomplete" in v:
            continue
        c, r, n = curves[key]
        ratio = v["second_half"]["ratio"] if v.get("second_half") else math.nan
        panels.append(ForecastPanel(
            title=f"{key}{'' if v['finished'] else ' (unfinished)'}: second half off by {ratio:.1f}x the noise floor",
            compute=c, reward=r, n_samples=n, fitted_to=v["half_compute"], params=v["fit"],
            A_interval=tuple(v["first_half"]["A_interval"]), identified=v["identified"],
            extend_to=v["planned_k_samples"]))
    return [p.name for p in plot_forecasts(
        panels, path=path, xlabel=SAMPLES_AXIS.label, ncols=3,
        title=f"{label}: the reference recipe fitted on the first half of its compute, forecast over the second")]
