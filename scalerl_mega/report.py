"""Final run report: `report.md` + `scaling.png` with the fitted sigmoid (paper Eq. sigmoid_law).

Reads the run's metrics.jsonl (validation lines), fits R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on
all validation points with compute > 0 (scaling/fit.py, relative grids: a CPU run's compute is far
below the paper's GPU-hour grid), draws it (scaling/plot.py) and writes a short markdown summary.
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


def write_report(run_dir: str | Path, *, title: str = "scalerl-mega run", budget: float | None = None,
                 extra: dict[str, str] | None = None) -> Path:
    """Write <run_dir>/report.md (and scaling.png when a fit is possible); returns the markdown path.
    `extra`: more "- key: value" summary lines (wall times, ...)."""
    from scalerl_mega.metrics.rollout_stats import domain_key
    from scalerl_mega.scaling.plot import CurvePlot, plot_scaling

    run_dir = Path(run_dir)
    val = read_metrics(run_dir / "metrics.jsonl", kind="validation")
    train = read_metrics(run_dir / "metrics.jsonl", kind="train")
    key = compute_key(val)
    unit = "GPU-hours" if key == "compute_gpu_hours" else "device-hours"
    points = [(float(r[key]), float(r["val_pass_rate"]), int(r["step"])) for r in val]
    lines = [f"# {title}", ""]
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
    lines.append("")
    positive = [(c, r) for c, r, _ in points if c > 0]
    fit, note = _fit(positive, r0=points[0][1] if points else None, budget=budget)
    curves = []
    if note:
        lines.append(note)
    if fit is not None:
        budget = budget or 2 * max(c for c, _ in positive)
        lines += [
            "## Fitted scaling curve (paper Eq. 1)",
            "",
            "| A | B | C_mid | R0 | predicted at budget | budget | A identified |",
            "|---|---|---|---|---|---|---|",
            f"| {fit.A:.3f} | {fit.B:.3f} | {fit.C_mid:.4g} | {fit.R0:.3f} | {float(fit.predict(budget)):.3f} | "
            f"{budget:.4g} {unit} | {fit.identified} |",
            "",
        ]
        curves.append(CurvePlot(label=title, compute=[c for c, _ in positive], reward=[r for _, r in positive],
                                fit=fit))
    domains = sorted({k[len("val/"):-len("_pass_rate")] for r in val for k in r
                      if k.startswith("val/") and k.endswith("_pass_rate")})
    if len(domains) > 1:
        lines += ["## Per domain", "", "| domain | first | last | change | A | B | C_mid |", "|---|---|---|---|---|---|---|"]
        for d in domains:
            pts = [(float(r[key]), float(r[domain_key(d)])) for r in val if domain_key(d) in r]
            dfit, _ = _fit([(c, y) for c, y in pts if c > 0], r0=pts[0][1], budget=budget)
            cells = [f"{dfit.A:.3f}", f"{dfit.B:.3f}", f"{dfit.C_mid:.4g}"] if dfit is not None else ["-"] * 3
            lines.append(f"| {d} | {pts[0][1]:.3f} | {pts[-1][1]:.3f} | {pts[-1][1] - pts[0][1]:+.3f} | "
                         + " | ".join(cells) + " |")
            if dfit is not None:
                curves.append(CurvePlot(label=d, compute=[c for c, y in pts if c > 0],
                                        reward=[y for c, y in pts if c > 0], fit=dfit))
        lines.append("")
    if curves:
        files = plot_scaling(curves, path=run_dir / "scaling", formats=("png",), title=title,
                             xlabel=f"Compute ({unit})", extend_to=budget)
        lines.append(f"![scaling curve]({files[0].name})")
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _fit(positive: list[tuple[float, float]], *, r0: float | None, budget: float | None):
    """(fit, note): the sigmoid fit of (compute > 0, reward) points on relative grids, or None and why."""
    from scalerl_mega.scaling.fit import fit_sigmoid, relative_grids

    if len(positive) < 4:
        return None, f"No fit: {len(positive)} validation point(s) with compute > 0 (need 4)."
    cs, rs = [c for c, _ in positive], [r for _, r in positive]
    a_grid, cm_grid = relative_grids(min(cs), max(max(cs), budget or 0.0))
    try:
        return fit_sigmoid(cs, rs, r0=r0, fit_from=None, method="fast", a_grid=a_grid, cmid_grid=cm_grid), ""
    except ValueError as e:
        return None, f"Fit failed: {e}"
