"""Final run report: `report.md` + `scaling.png` with the fitted sigmoid (paper Eq. sigmoid_law).

Reads the run's metrics.jsonl (validation lines), fits R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) and
judges it with `scaling.identify.assess` -- the rule `scalerl-fit` and the live forecast use: the cut
(the paper's 1.5k GPU-hours on a GPU-hour axis that reaches it, else `cut_fraction` x the final compute),
A's 95% interval, and A only when A is identified -- gives the expected reward at the run's budget (its final
compute, or `budget`) and at twice it with their 95% bands (`scaling.band`, identified or not), says the verdict
in plain words (also on the console), draws the curve with the bands and the cut (scaling/plot.py) and writes a
short markdown summary.
Multi-task runs (validation lines with several `val/<domain>_pass_rate`) also get one row and one
fitted curve per domain (paper Sec. 5: math and code scale differently).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from scalerl_mega.metrics.writer import read_metrics


def compute_key(records: list[dict[str, Any]]) -> str:
    """GPU-hours when the run had GPUs, else device (process) hours."""
    if records and any(r.get("compute_gpu_hours", 0.0) for r in records):
        return "compute_gpu_hours"
    return "compute_device_hours"


def _summary_lines(points: list[tuple[float, float, int]], train: list[dict], *, extra: dict[str, str] | None,
                   unit: str) -> list[str]:
    """The report's "- key: value" lines: first/last validation, `extra`, the trainer's last step."""
    lines = []
    if points:
        first, last = points[0], points[-1]
        lines += [
            f"- validation points: {len(points)}",
            f"- first validation (step {first[2]}): pass rate {first[1]:.3f}",
            f"- last validation (step {last[2]}): pass rate {last[1]:.3f} "
            f"(change {last[1] - first[1]:+.3f})",
            f"- compute at the end: {last[0]:.4g} {unit}",
        ]
    for k, v in (extra or {}).items():
        lines.append(f"- {k}: {v}")
    if train:
        tail = train[-1]
        lines.append(f"- trainer steps: {tail['step']}; last truncation rate {tail.get('truncation_rate', math.nan):.1%}")
    return lines


def _turn_lines(val: list[dict]) -> list[str]:
    """Episode runs: the "- passed at turn t" lines, the share of validation episodes that passed at each turn
    (`episode/pass_at_turn_<t>`, metrics/val_window.py) at the first and the last validation; [] otherwise."""
    if not val:
        return []
    turns = sorted(int(k.rsplit("_", 1)[1]) for k in val[-1] if k.startswith("episode/pass_at_turn_"))
    first, last = val[0], val[-1]
    share = lambda r, t: float(r.get(f"episode/pass_at_turn_{t}", 0.0))  # noqa: E731
    return [f"- passed at turn {t} (share of validation episodes): {share(first, t):.3f} at step {first['step']} -> "
            f"{share(last, t):.3f} at step {last['step']}" for t in turns]


def _reward_error_lines(train: list[dict]) -> list[str]:
    """The "- reward calls that failed" line when any scoring call raised or its worker died (the loop's
    `reward/errors` and `reward/first_error` metrics, `inflight.reward_error_metrics`): the count over the run and
    the first error of the first step that had one; [] when none failed."""
    failed = [r for r in train if r.get("reward/errors")]
    if not failed:
        return []
    total = sum(float(r["reward/errors"]) for r in train if r.get("reward/errors"))
    samples = sum(float(r.get("samples", 0) or 0) for r in train)
    of = f" of {samples:.0f} scored samples" if samples else ""
    first = failed[0].get("reward/first_error") or next(iter(failed[0].get("reward/errors_by_kind") or {}),
                                                        "not recorded")
    return [f"- reward calls that failed: {total:.0f}{of} in {len(failed)} step(s); first error (step "
            f"{failed[0]['step']}): {first} (each error's first traceback is in the run's log; they scored as "
            "incorrect)"]


def _domain_lines(val: list[dict], *, key: str, curves: list, cut_fraction: float | None,
                  fit_from: float | None) -> list[str]:
    """The "Per domain" table when validation has more than one domain (each domain's fitted curve is
    appended to `curves`); [] otherwise."""
    from scalerl_mega.metrics.rollout_stats import domain_key
    from scalerl_mega.scaling.plot import CurvePlot

    domains = sorted({k[len("val/"):-len("_pass_rate")] for r in val for k in r
                      if k.startswith("val/") and k.endswith("_pass_rate")})
    if len(domains) <= 1:
        return []
    lines = ["## Per domain", "", "| domain | first | last | change | A | A 95% interval | B | C_mid |",
             "|---|---|---|---|---|---|---|---|"]
    for d in domains:
        pts = [(float(r[key]), float(r[domain_key(d)])) for r in val if domain_key(d) in r]
        dn = [r.get(f"val/{d}_samples") for r in val if domain_key(d) in r]
        da, _ = _assess([c for c, _ in pts], [y for _, y in pts],
                        n_samples=None if any(v is None for v in dn) else dn, gpu_hours=key == "compute_gpu_hours",
                        cut_fraction=cut_fraction, fit_from=fit_from)
        if da is not None:
            cells = [f"{da.fit.A:.3f}" if da.identified else "not identified",
                     f"{da.A_interval[0]:.3f}..{da.A_interval[1]:.3f}", f"{da.fit.B:.3f}", f"{da.fit.C_mid:.4g}"]
        else:
            cells = ["-"] * 4
        lines.append(f"| {d} | {pts[0][1]:.3f} | {pts[-1][1]:.3f} | {pts[-1][1] - pts[0][1]:+.3f} | "
                     + " | ".join(cells) + " |")
        if da is not None:
            curves.append(CurvePlot(label=d, compute=[c for c, _ in pts], reward=[y for _, y in pts],
                                    fit=da.fit, assessment=da))
    return lines + [""]


def write_report(run_dir: str | Path, *, title: str = "scalerl-mega run", budget: float | None = None,
                 extra: dict[str, str] | None = None, cut_fraction: float | None = None,
                 fit_from: float | None = None, quantization: str = "none", is_correction: str = "none") -> Path:
    """Write <run_dir>/report.md (and scaling.png when a fit is possible); returns the markdown path.
    `extra`: more "- key: value" summary lines (wall times, ...); `cut_fraction`: the fit cut off the
    paper's GPU-hour scale (default `identify.CUT_FRACTION`, as `forecast.cut_fraction`); `fit_from`: a
    fixed cut instead (`forecast.fit_from`). A quantized generator (`quantization`, `rollout.quantization`) adds
    the mismatch section (metrics/mismatch.py) under the run's `is_correction` (`loss.is_correction`)."""
    from scalerl_mega.scaling.plot import CurvePlot, plot_scaling

    run_dir = Path(run_dir)
    val = read_metrics(run_dir / "metrics.jsonl", kind="validation")
    train = read_metrics(run_dir / "metrics.jsonl", kind="train")
    key = compute_key(val)
    unit = "GPU-hours" if key == "compute_gpu_hours" else "device-hours"
    points = [(float(r[key]), float(r["val_pass_rate"]), int(r["step"])) for r in val]
    from scalerl_mega.metrics.untrained import report_lines as untrained_lines

    lines = [f"# {title}", "", *_summary_lines(points, train, extra=extra, unit=unit), *_turn_lines(val),
             *_reward_error_lines(train), *untrained_lines(train), ""]
    n_samples = [float(r["val_prompts"]) * float(r["val_samples_per_prompt"]) if "val_prompts" in r and
                 "val_samples_per_prompt" in r else None for r in val]
    ns = None if any(v is None for v in n_samples) else n_samples
    gpu = key == "compute_gpu_hours"
    a, note = _assess([c for c, _, _ in points], [r for _, r, _ in points], n_samples=ns, gpu_hours=gpu,
                      cut_fraction=cut_fraction, fit_from=fit_from)
    curves = []
    if note:
        lines.append(note)
    if a is not None:
        budget = budget or points[-1][0]
        band = _band(points, a, ns, budget=budget)
        lines += _fit_lines(a, band, points=points, unit=unit, budget=budget)
        curves.append(CurvePlot(label=title, compute=[c for c, _, _ in points], reward=[r for _, r, _ in points],
                                fit=a.fit, assessment=a, band=band))
    lines += _domain_lines(val, key=key, curves=curves, cut_fraction=cut_fraction, fit_from=fit_from)
    from scalerl_mega.metrics.mismatch import report_lines as mismatch_lines

    lines += mismatch_lines(train, quantization=quantization, is_correction=is_correction)
    if curves:
        files = plot_scaling(curves, path=run_dir / "scaling", formats=("png",), title=title,
                             xlabel=f"Compute ({unit})", extend_to=2 * budget if budget else None)
        lines.append(f"![scaling curve]({files[0].name})")
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _band(points, a, n_samples, *, budget: float):
    """The 95% band at `budget` and at twice it, and on a grid from the fitted data's end to twice the budget
    (for the plot); None when the fit has too few points for one."""
    import numpy as np

    from scalerl_mega.scaling.band import forecast_band

    end = a.fit.compute_range[1]
    at = sorted({budget, 2.0 * budget, *np.geomspace(max(end, 1e-12), 2.0 * budget, 40).tolist()})
    try:
        return forecast_band([c for c, _, _ in points], [r for _, r, _ in points], fit=a.fit, at=at,
                             n_samples=n_samples)
    except ValueError:
        return None


def _fit_lines(a, band, *, points, unit: str, budget: float) -> list[str]:
    """The report's fit section: the parameters, the forecast at the budget and at twice it with their bands, the
    verdict in plain words and the rule's own words; the verdict also goes to the console (the run's last line)."""
    import logging

    import numpy as np

    from scalerl_mega.scaling.forecast import ceiling_words
    from scalerl_mega.scaling.identify import verdict_text

    fit = a.fit
    lo, hi = a.A_interval
    cut = "-" if a.fit_from is None else f"{a.fit_from:.4g} {unit}"
    lines = ["## Fitted scaling curve (paper Eq. 1)", "",
             "| A | A 95% interval | B | C_mid | R0 | fit from | points | A identified |",
             "|---|---|---|---|---|---|---|---|",
             f"| {f'{fit.A:.3f}' if a.identified else 'not identified'} | {lo:.3f}..{hi:.3f} | {fit.B:.3f} | "
             f"{fit.C_mid:.4g} | {fit.R0:.3f} | {cut} | {a.n_points} | {a.identified} |", ""]
    first, last = points[0][1], points[-1][1]
    verdict = f"the pass rate went from {first:.3f} to {last:.3f}; {ceiling_words(a)}"
    if band is not None:
        k1, k2 = (int(np.argmin(np.abs(band.compute - x))) for x in (budget, 2.0 * budget))
        lines += ["| expected pass rate at | compute | forecast | 95% band |", "|---|---|---|---|"]
        for name, k in (("this run's budget", k1), ("twice the budget", k2)):
            lines.append(f"| {name} | {band.compute[k]:.4g} {unit} | {band.reward[k]:.3f} | "
                         f"{band.lo[k]:.3f}..{band.hi[k]:.3f} |")
        lines += ["", "The band covers the fit's parameter uncertainty and the misfit of Eq. 1 measured on the "
                  "run's own tail (scaling/band.py)."]
        verdict += (f"; with twice this compute expect {band.reward[k2]:.3f} "
                    f"(95% band {band.lo[k2]:.3f}-{band.hi[k2]:.3f})")
    logging.getLogger("scalerl_mega.report").info("verdict: %s", verdict)
    return lines + ["", f"**Verdict**: {verdict}.", "", f"The rule's words: {verdict_text(a)}.", ""]


def _assess(compute: list[float], reward: list[float], *, n_samples, gpu_hours: bool, cut_fraction: float | None,
            fit_from: float | None = None):
    """(assessment, note): `identify.assess` with the shared options (`identify.options_for`), or None and why."""
    from scalerl_mega.scaling.fit import FitOptions
    from scalerl_mega.scaling.identify import CUT_FRACTION, assess, auto_grid, options_for

    positive = [c for c in compute if c > 0]
    if len(positive) < 4:
        return None, f"No fit: {len(positive)} validation point(s) with compute > 0 (need 4)."
    grid = auto_grid([max(compute)], gpu_hours=gpu_hours)
    opts = options_for(compute, grid=grid, cut_fraction=CUT_FRACTION if cut_fraction is None else cut_fraction,
                       fit_from="auto" if fit_from is None else fit_from, base=FitOptions(method="fast"))
    try:
        return assess(compute, reward, options=opts, n_samples=n_samples), ""
    except ValueError as e:
        return None, f"Fit failed: {e}"
