"""`scalerl-fit`: fit Eq. 1 to one or more runs, print a table, write plots (paper Sec. 2.1, App. A.5).

    scalerl-fit RUN_DIR_OR_FILE [...] [--x compute_gpu_hours] [--y val_pass_rate] [--grid auto|paper|relative]
                [--fit-from auto|none|X] [--cut-fraction 0.1] [--fit-to X] [--r0 X] [--method fast|grid]
                [--refine] [--val-samples N] [--holdout 0.5] [--plot-dir DIR] [--json] [--label NAME ...]

Grids: `paper` = App. A.5 (A 0.450..0.800 step 0.005, C_mid linspace(100, 40000, 100)) with fit_from 1500;
`relative` = `fit.relative_grids` over the fitted compute range (small runs, any unit);
`auto` = paper when the axis is GPU-hours (`--x compute_gpu_hours`) and every run reaches 1500, else
relative (a token or device-hour axis never gets the GPU-hour grid). The choice is printed.
The cut (`--fit-from auto`): 1500 on the paper grid, else `--cut-fraction` (0.1) x each run's largest
compute (`scaling.identify.fit_cut`). Every run gets A, its 95% interval and the verdict of
`scaling.identify.assess` (the rule report.md and the live forecast use): A is printed only when
identified; otherwise "not identified", the interval and the reason.
`--domains` fits one curve per validation domain of each run (`val/math_pass_rate`, `val/code_pass_rate`).
With several runs, the leave-one-out table of the paper (Sec. 6, App. A.5): A averaged over all runs,
every run refit at that common A, B compared (runs whose own A is beyond the +-0.02 seed margin of the
mean are flagged); `--plot-dir` draws them in loo.png (Fig. 7) at the common A.
Bad input exits with status 2 and one line naming the file and the problem.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scalerl_mega.scaling.fit import FitOptions
from scalerl_mega.scaling.holdout import HalfFit, half_fit, score_later
from scalerl_mega.scaling.identify import CUT_FRACTION, Assessment, assess, auto_grid, options_for, verdict_text
from scalerl_mega.suggest import SuggestingArgumentParser

if TYPE_CHECKING:
    from scalerl_mega.scaling.io import Series


def _parser() -> argparse.ArgumentParser:
    p = SuggestingArgumentParser(prog="scalerl-fit", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run directories, metrics.jsonl files or CSV files")
    p.add_argument("--x", default="compute_gpu_hours",
                   help="compute key/column (default compute_gpu_hours); in a metrics.jsonl, sum:<key> is the "
                        "running sum of <key> over earlier lines, e.g. sum:batch/tokens (rollout tokens so far)")
    p.add_argument("--y", default="val_pass_rate", help="reward key/column (default val_pass_rate)")
    p.add_argument("--label", nargs="*", default=None, help="names for the runs (default: directory/file names)")
    p.add_argument("--domains", action="store_true",
                   help="one curve per validation domain of each run (val/<domain>_pass_rate: e.g. math and "
                        "code of a math+code run, paper Sec. 5) instead of --y")
    p.add_argument("--grid", choices=("auto", "paper", "relative"), default="auto",
                   help="paper: App. A.5 grids + fit from 1500; relative: scale-free grids; "
                        "auto: paper when --x is compute_gpu_hours and every run reaches 1500")
    p.add_argument("--fit-from", default="auto",
                   help="lower compute bound of the fit: auto (1500 on the paper grid, else --cut-fraction x the "
                        "largest compute), none or a number")
    p.add_argument("--cut-fraction", type=float, default=CUT_FRACTION,
                   help="the auto cut off the paper grid: points below this share of the largest compute are "
                        f"not fitted (default {CUT_FRACTION:g})")
    p.add_argument("--val-samples", type=float, default=None, metavar="N",
                   help="validation samples per point for the noise floor (default: val_prompts x "
                        "val_samples_per_prompt of the metrics.jsonl lines; unknown for CSV)")
    p.add_argument("--fit-to", type=float, default=None, help="upper compute bound of the fit (cut a collapse)")
    p.add_argument("--r0", type=float, default=None, help="R0 (default: reward at the smallest compute)")
    p.add_argument("--method", choices=("fast", "grid"), default="fast",
                   help="fast (default, same cell) or grid (the paper's 7,100 curve_fit calls)")
    p.add_argument("--refine", action="store_true", help="also report the continuous refit from the grid optimum")
    p.add_argument("--holdout", type=float, default=0.5,
                   help="forecast check (scaling.holdout): fit on compute <= this fraction of the max by the "
                        "identification rule, forecast every later point, score it against the noise floor "
                        "(0 disables)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help="N point-bootstrap resamples per run: A/B intervals printed next to the +-0.02 seed margin")
    p.add_argument("--same-config", action="store_true",
                   help="the runs are seeds of one config: also report per-seed A, their half-range and a "
                        "seed bootstrap (N from --bootstrap, default 100)")
    p.add_argument("--plot-dir", default=None, help="write scaling.png/.svg, per-run extrapolation plots, loo")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    return p


def _options(args, series) -> tuple[FitOptions, str, object, str]:
    """Base fit options, the grid kind ("paper"/"relative"), the fit_from spec and a line describing them."""
    if args.fit_from == "auto":
        fit_from = "auto"
    elif args.fit_from.lower() == "none":
        fit_from = None
    else:
        try:
            fit_from = float(args.fit_from)
        except ValueError:
            raise ValueError(f"--fit-from must be auto, none or a number, got {args.fit_from!r}") from None
    grid = args.grid
    if grid == "auto":
        grid = auto_grid([float(s.compute.max()) for s in series], gpu_hours=args.x == "compute_gpu_hours")
    opts = FitOptions(r0=args.r0, fit_to=args.fit_to, method=args.method, refine=args.refine)
    if grid == "paper":
        desc = "paper (A 0.450..0.800 step 0.005 x C_mid linspace(100, 40000, 100))"
    else:
        desc = "relative (A 0.005..1.000 step 0.005 x C_mid geometric 0.1x..100x of the fitted compute, 200)"
    if fit_from == "auto":
        cut = "1500" if grid == "paper" else f"{args.cut_fraction:g} x each run's largest compute"
    else:
        cut = "-" if fit_from is None else f"{fit_from:g}"
    desc += f", fit from {cut} to {'-' if args.fit_to is None else f'{args.fit_to:g}'}, method {args.method}"
    return opts, grid, fit_from, desc


def _opts_for(series, base: FitOptions, grid: str, fit_from, args) -> FitOptions:
    return options_for(series.compute, grid=grid, fit_from=fit_from, cut_fraction=args.cut_fraction, base=base)


def _n_samples(series, args):
    return args.val_samples if args.val_samples is not None else series.n_samples


def _compact(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _run(args) -> int:
    from scalerl_mega.scaling.compare import SEED_MARGIN_A, bootstrap_points, bootstrap_seeds, compare_loo

    series = _read_all(args)
    base, grid, fit_from, desc = _options(args, series)
    rows, fits, extraps, assessed = [], [], [], []
    for s in series:
        opts = _opts_for(s, base, grid, fit_from, args)
        try:
            a = assess(s.compute, s.reward, options=opts, n_samples=_n_samples(s, args))
        except ValueError as e:
            raise ValueError(f"{s.source}: {e}") from None
        f = a.fit
        assessed.append(a)
        ex, ex_note = None, ""
        if args.holdout > 0:
            try:
                ex = _holdout(s, a, args, grid=grid, fit_from=fit_from, base=base)
            except ValueError as e:
                ex_note = f"forecast check skipped: {e}"
        fits.append(f)
        extraps.append(ex)
        rows.append(_row(s, a, ex, ex_note))
        if args.bootstrap > 0:
            bp = bootstrap_points(s.compute, s.reward, options=opts, n_boot=args.bootstrap)
            rows[-1]["bootstrap_points"] = {"n_ok": bp.n_ok, "level": bp.level, "A": list(bp.A), "B": list(bp.B),
                                            "C_mid": list(bp.C_mid), "seed_margin_A": SEED_MARGIN_A}
    seeds = None
    if args.same_config:
        if len(series) < 2:
            raise ValueError("--same-config needs at least 2 runs")
        bs = bootstrap_seeds([(s.compute, s.reward) for s in series],
                             options=_opts_for(series[0], base, grid, fit_from, args),
                             n_boot=args.bootstrap or 100)
        seeds = {"per_seed_A": list(bs.per_seed_A), "half_range_A": bs.seed_half_range, "n_ok": bs.n_ok,
                 "A": list(bs.A), "B": list(bs.B), "C_mid": list(bs.C_mid), "seed_margin_A": SEED_MARGIN_A}
    loo = None
    if len(series) > 1:
        loo = compare_loo([(s.compute, s.reward) for s in series], labels=[s.name for s in series],
                          options=[_opts_for(s, base, grid, fit_from, args) for s in series],
                          identified=[a.identified for a in assessed])
    plots = []
    if args.plot_dir:
        plots = _plots(args, series, assessed, extraps, loo)
    if args.json:
        print(json.dumps({"grid": desc, "x": args.x, "y": args.y, "runs": rows, "loo": _loo_json(loo),
                          "seeds": seeds, "plots": [str(p) for p in plots]}, indent=2, default=_json_default))
    else:
        _print_table(desc, rows, loo, plots, seeds)
    return 0


@dataclass(frozen=True, kw_only=True)
class _Holdout:
    """`--holdout F`: the first-F fit (`holdout.half_fit`), its score on every later point (`holdout.score_later`)
    and the whole run's A for comparison."""

    fraction: float
    half: HalfFit
    later: dict
    whole_A: float | None


def _holdout(s: Series, whole: Assessment, args, *, grid: str, fit_from, base: FitOptions) -> _Holdout:
    """The forecast check of one run; without validation sample counts (a CSV) the noise floor comes from the
    residual SD of the whole run's fit."""
    if not 0.0 < args.holdout < 1.0:
        raise ValueError(f"--holdout must be in (0, 1) or 0 to disable, got {args.holdout}")
    n = _n_samples(s, args)
    noise_std = None if n is not None else math.sqrt(whole.fit.sse / max(whole.fit.n_points - 3, 1))
    half = half_fit(s.compute, s.reward, n, half_compute=args.holdout * float(s.compute.max()), noise_std=noise_std,
                    grid=grid, fit_from=fit_from, base=base)
    later = score_later(s.compute, s.reward, n, half=half, noise_std=noise_std)
    return _Holdout(fraction=args.holdout, half=half, later=later, whole_A=whole.A)


def _read_all(args) -> list[Series]:
    """The curves named on the command line: one per path, or with --domains one per val/<domain>_pass_rate key
    of each path (named `<label>/<domain>`)."""
    from scalerl_mega.scaling.io import domain_keys, read_series

    labels = args.label or []
    if labels and len(labels) != len(args.paths):
        raise ValueError(f"--label got {len(labels)} names for {len(args.paths)} paths")
    if not args.domains:
        return [read_series(p, x=args.x, y=args.y, name=labels[k] if labels else None)
                for k, p in enumerate(args.paths)]
    series = []
    for k, p in enumerate(args.paths):
        keys = domain_keys(p)
        if not keys:
            raise ValueError(f"{p}: --domains found no val/<domain>_pass_rate key")
        base_name = labels[k] if labels else read_series(p, x=args.x, y=keys[0]).name
        series += [read_series(p, x=args.x, y=key, name=f"{base_name}/{key[len('val/'):-len('_pass_rate')]}")
                   for key in keys]
    return series


def _loo_json(loo) -> dict | None:
    if loo is None:
        return None
    return {"A_mean": loo.A_mean, "margin": loo.margin, "best": loo.best, "excluded": list(loo.excluded),
            "runs": [{"run": r.label, "A": r.fit.A if r.fit.identified else None, "A_minus_mean": r.A_offset,
                      "within_margin": r.within_margin, "B_at_A_mean": r.B, "C_mid_at_A_mean": r.C_mid}
                     for r in loo.runs]}


def _print_loo(loo) -> None:
    print(f"leave-one-out at the common A={loo.A_mean:.4f} (mean over {len(loo.runs) - len(loo.excluded)} runs; "
          "every run refit at it, paper Sec. 6 / App. A.5):")
    table = [("run", "A", "A - mean", "B at mean A", "C_mid at mean A", "")]
    for r in sorted(loo.runs, key=lambda r: -r.B if r.fixed is not None else math.inf):
        if r.fixed is None:
            table.append((r.label, "not identified", "-", "-", "-", "excluded"))
            continue
        note = "best B" if r.label == loo.best else ""
        if not r.within_margin:
            note = (note + "; " if note else "") + f"A beyond the +-{loo.margin:g} seed margin of the mean"
        table.append((r.label, f"{r.fit.A:.3f}", f"{r.A_offset:+.3f}", f"{r.B:.3f}", f"{r.C_mid:.4g}", note))
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    for k, row in enumerate(table):
        print("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _row(s, a, ex, ex_note) -> dict:
    f = a.fit
    row = {
        "run": s.name, "source": s.source, **a.summary(), "verdict": verdict_text(a),
        "r0_source": f.r0_source, "sse": f.sse, "widened": list(f.widened), "compute_range": list(f.compute_range),
    }
    if a.holdout is not None:
        h = a.holdout
        row["misfit_check"] = {"n_fit": h.n_fit, "n_heldout": h.n_heldout, "split_compute": h.split_compute,
                               "mae": h.mae, "noise_floor": h.noise_floor, "ratio": h.ratio,
                               "noise_source": h.noise_source, "passed": h.passed}
    if f.refined is not None:
        row["refined"] = {"A": f.refined.A, "B": f.refined.B, "C_mid": f.refined.C_mid, "sse": f.refined.sse,
                          "differs": f.refined.differs}
    if ex is not None:
        h, first = ex.half, ex.half.assessment
        row["holdout"] = {"fraction": ex.fraction, "split_compute": h.half_compute, "n_fit": first.fit.n_points,
                          "identified": h.identified, "verdict": h.verdict, "A": first.A,
                          "A_interval": list(first.A_interval),
                          "delta_A": None if first.A is None or ex.whole_A is None else first.A - ex.whole_A,
                          "later": ex.later, "final_points": {"compute": list(h.final_compute),
                                                              "observed": list(h.observed),
                                                              "predicted": None if h.predicted is None
                                                              else list(h.predicted),
                                                              "mae": h.mae, "noise_floor": h.noise_floor,
                                                              "unvetted_mae": h.unvetted_mae}}
    elif ex_note:
        row["holdout_note"] = ex_note
    return row


def _print_table(desc, rows, loo, plots, seeds=None) -> None:
    print(f"grid: {desc}")
    head = ("run", "n", "A", "A 95% interval", "B", "C_mid", "identified", "forecast error / floor", "dA(half)")
    table = [head]
    notes = []
    for r in rows:
        ex = r.get("holdout")
        later = (ex or {}).get("later") or {}
        a = _num(r["A"], ".3f") if r["identified"] else "not identified"
        table.append((
            r["run"], str(r["n_points"]), a, f"{r['A_interval'][0]:.3f}..{r['A_interval'][1]:.3f}",
            _num(r["B"], ".3f") if r["identified"] else "-",
            _num(r["C_mid"], ".4g") if r["identified"] else "-",
            "yes" if r["identified"] else "NO",
            (f"{later['mae']:.4f} / {later['noise_floor']:.4f} = {later['ratio']:.1f}x"
             + ("" if later["forecast"] else " (unvetted)")) if later else "-",
            _num(ex["delta_A"], "+.3f") if ex else "-",
        ))
        if r.get("widened"):
            edges = sorted(set(r["widened"]), key=r["widened"].index)
            notes.append(f"{r['run']}: grid widened at {', '.join(edges)} ({len(r['widened'])} step(s))")
        if "bootstrap_points" in r:
            q = r["bootstrap_points"]
            notes.append(f"{r['run']}: A {100 * q['level']:.0f}% point-bootstrap {q['A'][0]:.3f}..{q['A'][1]:.3f} "
                         f"(n={q['n_ok']}); compare runs with the +-{q['seed_margin_A']:g} seed margin: point "
                         "intervals understate seed variance")
        if "refined" in r:
            q = r["refined"]
            notes.append(f"{r['run']}: continuous refit A={q['A']:.4f} B={q['B']:.3f} C_mid={q['C_mid']:.4g}"
                         + (" (differs from the grid optimum)" if q["differs"] else ""))
        if ex:
            notes.append(f"{r['run']}: fit on compute <= {_compact(ex['split_compute'])} (the first "
                         f"{ex['fraction']:g}): {ex['verdict']}"
                         + ("" if ex["identified"] else "; no forecast (the error shown is the unvetted fit's)"))
        if "holdout_note" in r:
            notes.append(f"{r['run']}: {r['holdout_note']}")
        notes.append(f"{r['run']}: R0={r['R0']:.4f} ({r['r0_source']}); {r['verdict']}")
    widths = [max(len(str(row[k])) for row in table) for k in range(len(head))]
    for k, row in enumerate(table):
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    for n in notes:
        print("  " + n)
    if seeds is not None:
        per = ", ".join(f"{a:.3f}" for a in seeds["per_seed_A"])
        print(f"seeds of one config: A per seed {per}; half-range {seeds['half_range_A']:.4f} "
              f"(paper: <= 0.015, margin {seeds['seed_margin_A']:g}); seed-bootstrap A "
              f"{seeds['A'][0]:.3f}..{seeds['A'][1]:.3f} (n={seeds['n_ok']})")
    if loo is not None:
        _print_loo(loo)
    for p in plots:
        print(f"wrote {p}")


def _plots(args, series, assessed, extraps, loo=None) -> list[Path]:
    from scalerl_mega.scaling.plot import CurvePlot, plot_loo, plot_scaling

    out_dir = Path(args.plot_dir)
    xlabel = {"compute_gpu_hours": "Compute (GPU-hours)",
              "compute_device_hours": "Compute (device-hours)",
              "sum:batch/tokens": "Rollout tokens trained on (cumulative)"}.get(args.x, args.x)
    ylabel = {"val_pass_rate": "Validation pass rate"}.get(args.y, args.y)
    written = []
    curves = [CurvePlot(label=s.name, compute=s.compute, reward=s.reward, fit=a.fit, assessment=a)
              for s, a in zip(series, assessed)]
    written += plot_scaling(curves, path=out_dir / "scaling.png", xlabel=xlabel, ylabel=ylabel)
    for s, ex in zip(series, extraps):
        if ex is None or ex.later is None:
            continue
        cv = CurvePlot(label=s.name, compute=s.compute, reward=s.reward, fit=ex.half.assessment.fit,
                       heldout_from=ex.half.half_compute)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in s.name)
        kind = "forecast" if ex.later["forecast"] else "unvetted fit (A not identified)"
        written += plot_scaling([cv], path=out_dir / f"extrapolation_{safe}.png", xlabel=xlabel, ylabel=ylabel,
                                title=f"{s.name}: fit on compute <= {_compact(ex.half.half_compute)}; {kind} off by "
                                f"{ex.later['ratio']:.1f}x the noise floor")
    if loo is not None and loo.best is not None:  # Fig. 7 at the common A, with the table's B and C_mid
        loo_curves = [CurvePlot(label=s.name, compute=s.compute, reward=s.reward,
                                fit=replace(r.fixed, B=r.B, C_mid=r.C_mid))
                      for s, r in zip(series, loo.runs) if r.fixed is not None]
        written += plot_loo(loo_curves, path=out_dir / "loo.png", title=f"common A = {loo.A_mean:.4f}")
    else:
        ident = [cv for cv in curves if cv.assessment.identified]
        if ident:
            written += plot_loo(ident, path=out_dir / "loo.png")
    return written


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ValueError as e:
        print(f"scalerl-fit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
