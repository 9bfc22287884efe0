"""Collect a Hydra sweep directory into one table and one plot of fitted scaling curves.

    python tools/sweep_report.py multirun/ablations [--x compute_device_hours] [--out DIR]

Every sub-directory holding a `metrics.jsonl` is one point (labelled by its `.hydra/overrides.yaml`
when present, else its directory name). Its validation records (reward vs compute) are fitted with
the paper's sigmoid (Eq. 1) and judged by the project's one identification rule
(`scalerl_mega.scaling.identify.assess`, the rule of `scalerl-fit`, report.md and the live forecast: relative
grids, the cut at 0.1 of the run's compute, A only when its 95% interval is <= 0.04 wide with >= 8 points after
the cut and no misfit); the table lists A (or "not identified" and why), A's interval, B, C_mid, R0, the last
validation pass rate and whether the run finished (summary.json); the plot overlays all fitted curves
(`scalerl_mega.scaling.plot.plot_scaling`). The x axis (`--x auto`): GPU-hours where a run logged any, else
device-hours. Writes `sweep_report.md` and `sweep_curves.png` into the sweep directory (or --out) and prints the
table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class PointResult:
    name: str
    path: Path
    finished: bool
    steps: int | None
    n_val: int
    last_val: float | None
    fit: Any = None  # SigmoidFit or None
    assessment: Any = None  # identify.Assessment of `fit` or None
    error: str = ""
    compute: Any = None  # np.ndarray of the validation points
    reward: Any = None


def point_dirs(sweep_dir: Path) -> list[Path]:
    """Directories under `sweep_dir` (any depth) with a metrics.jsonl, sorted."""
    return sorted(p.parent for p in sweep_dir.rglob("metrics.jsonl") if ".submitit" not in p.parts)


def point_overrides(path: Path) -> list[str]:
    ov = path / ".hydra" / "overrides.yaml"
    if not ov.is_file():
        return []
    return [line[2:].strip() for line in ov.read_text().splitlines() if line.startswith("- ")]


def point_names(dirs: list[Path], sweep_dir: Path) -> list[str]:
    """Each point's overrides minus those every point shares (the swept values), else its path."""
    ovs = [point_overrides(d) for d in dirs]
    common = set.intersection(*(set(o) for o in ovs)) if len(ovs) > 1 else set()
    names = [" ".join(x for x in o if x not in common) for o in ovs]
    return [n or str(d.relative_to(sweep_dir)) for n, d in zip(names, dirs)]


def collect(sweep_dir: Path, *, x: str, y: str = "val_pass_rate") -> list[PointResult]:
    from scalerl_mega.scaling.fit import FitOptions
    from scalerl_mega.scaling.identify import assess, options_for
    from scalerl_mega.scaling.io import read_series

    out = []
    dirs = point_dirs(sweep_dir)
    for d, name in zip(dirs, point_names(dirs, sweep_dir)):
        summary = d / "summary.json"
        steps = json.loads(summary.read_text()).get("steps") if summary.is_file() else None
        res = PointResult(name=name, path=d, finished=summary.is_file(), steps=steps,
                          n_val=0, last_val=None)
        try:
            s = read_series(d, x=x, y=y, name=res.name)
        except ValueError as e:
            res.error = str(e)
            out.append(res)
            continue
        res.n_val, res.last_val = len(s.reward), float(s.reward[-1])
        pos = s.compute[s.compute > 0]
        if len(pos) < 4:
            res.error = f"{len(pos)} validation point(s) with compute > 0: too few to fit (need 4)"
        else:
            try:
                res.assessment = assess(s.compute, s.reward, n_samples=s.n_samples, options=options_for(
                    s.compute, grid="relative", base=FitOptions(method="fast")))
            except ValueError as e:
                res.error = str(e)
            else:
                res.fit, res.compute, res.reward = res.assessment.fit, s.compute, s.reward
        out.append(res)
    return out


def table(points: list[PointResult]) -> str:
    head = "| point | finished | steps | val points | last val | A | A 95% interval | B | C_mid | R0 | identified |\n"
    head += "|---|---|---|---|---|---|---|---|---|---|---|\n"
    rows = []
    for p in points:
        a = p.assessment
        if a is not None:
            f, (lo, hi) = a.fit, a.A_interval
            fitcols = (f"{f.A:.3f} | " if a.identified else "not identified | ") + (
                f"{lo:.3f}..{hi:.3f} | {f.B:.3g} | {f.C_mid:.3g} | {f.R0:.3f} | "
                + ("yes" if a.identified else "no: " + a.reason.replace("|", "\\|")))
        else:
            fitcols = f"- | - | - | - | - | {p.error or 'no fit'}"
        last = f"{p.last_val:.3f}" if p.last_val is not None else "-"
        rows.append(f"| {p.name} | {'yes' if p.finished else 'no'} | {p.steps if p.steps is not None else '-'} | "
                    f"{p.n_val} | {last} | {fitcols} |")
    return head + "\n".join(rows) + "\n"


def write_report(sweep_dir: Path, *, out_dir: Path, x: str) -> tuple[Path, list[Path], list[PointResult]]:
    from scalerl_mega.scaling.plot import CurvePlot, plot_scaling

    points = collect(sweep_dir, x=x)
    if not points:
        raise ValueError(f"{sweep_dir}: no metrics.jsonl below this directory (not a sweep output?)")
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = [CurvePlot(label=p.name, compute=p.compute, reward=p.reward, fit=p.fit, assessment=p.assessment)
              for p in points if p.fit is not None]
    plots = plot_scaling(curves, path=out_dir / "sweep_curves", formats=("png",), xlabel=x,
                         title=f"sweep {sweep_dir.name}: {len(curves)} fitted curve(s)") if curves else []
    md = out_dir / "sweep_report.md"
    md.write_text(f"# Sweep report: {sweep_dir}\n\nx = `{x}`, y = `val_pass_rate`, fit: paper Eq. 1 (sigmoid), "
                  "relative grids, judged by the one identification rule (scalerl_mega/scaling/identify.py)."
                  f"\n\n{table(points)}\n"
                  + "".join(f"![curves]({p.name})\n" for p in plots))
    return md, plots, points


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--x", default="auto",
                    help="compute key (default auto: compute_gpu_hours where a run logged GPU-hours, else "
                         "compute_device_hours)")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: the sweep directory)")
    a = ap.parse_args(argv)
    if not a.sweep_dir.is_dir():
        print(f"error: {a.sweep_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        x = a.x
        if x == "auto":
            from scalerl_mega.scaling.io import auto_x

            x, note = auto_x(point_dirs(a.sweep_dir))
            print(note)
        md, plots, points = write_report(a.sweep_dir, out_dir=a.out or a.sweep_dir, x=x)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(points))
    print(f"report: {md}" + "".join(f"\nplot: {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
