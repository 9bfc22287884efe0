"""`scalerl-fit`: fit Eq. 1 to one or more runs, print a table, write plots (paper Sec. 2.1, App. A.5).

    scalerl-fit RUN_DIR_OR_FILE [...] [--x auto] [--y val_pass_rate] [--grid auto|paper|relative]
                [--fit-from auto|none|X] [--cut-fraction 0.1] [--fit-to X] [--forecast-at C ...] [--r0 X]
                [--method fast|grid] [--refine] [--val-samples N] [--holdout 0.5] [--plot-dir DIR] [--json]
                [--label NAME ...]

The x axis (`--x auto`, the default): GPU-hours where a run logged any (a GPU run), else device-hours (a CPU run,
whose GPU-hours are all 0); the choice is printed. Forecasts (`scaling.band`): every run gets the expected reward
with a 95% band at every point beyond `--fit-to` (checking the fit against the rest of the run) and at each
`--forecast-at` compute (default: twice the run's last compute), whether or not A is identified; the band covers
the fit's parameter uncertainty and the misfit of Eq. 1 estimated from the run's own tail.

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
A run that cannot be read or fitted (a NaN on a line, too few points, a curve Eq. 1 cannot be fitted to) gets a
line saying why, naming the file and line, and the other runs are fitted; the exit status is 0 when at least one
run was fitted, else 2 with one line naming each file and its problem.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl_mega.scaling.band import Band, forecast_band
from scalerl_mega.scaling.cli_output import (compact, in_units, json_default, loo_in_units, loo_json, print_table,
                                             run_row, seeds_in_units)
from scalerl_mega.scaling.fit import FitOptions
from scalerl_mega.scaling.holdout import HalfFit, half_fit, score_later
from scalerl_mega.scaling.identify import CUT_FRACTION, Assessment, assess, auto_grid, options_for
from scalerl_mega.scaling.io import DEVICE_X, GPU_X, run_label
from scalerl_mega.suggest import SuggestingArgumentParser

if TYPE_CHECKING:
    from scalerl_mega.scaling.io import Series


def _parser() -> argparse.ArgumentParser:
    p = SuggestingArgumentParser(prog="scalerl-fit", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run directories, metrics.jsonl files or CSV files")
    p.add_argument("--x", default="auto",
                   help="compute key/column (default auto: compute_gpu_hours where a run logged GPU-hours, else "
                        "compute_device_hours); in a metrics.jsonl, sum:<key> is the running sum of <key> over "
                        "earlier lines, e.g. sum:batch/tokens (rollout tokens so far)")
    p.add_argument("--y", default="val_pass_rate", help="reward key/column (default val_pass_rate)")
    p.add_argument("--y-range", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="the range of --y when it is not a pass rate (default 0 1: a value outside [0, 1] is "
                        "refused, naming its file and line); the fit, its band and the plot work on "
                        "(y - LO) / (HI - LO) and print A, R0 and the bands in the metric's units")
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
    p.add_argument("--fit-to", type=float, default=None,
                   help="upper compute bound of the fit (cut a collapse); the points beyond it get forecast rows")
    p.add_argument("--forecast-at", type=float, nargs="+", default=None, metavar="C",
                   help="computes to forecast the expected reward at, with its 95%% band (default: twice the "
                        "run's last compute)")
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


def _run(args) -> int:
    from scalerl_mega.scaling.compare import (
        SEED_MARGIN_A,
        bootstrap_points,
        bootstrap_seeds,
        compare_loo,
    )

    x_note = _resolve_x(args)
    series, failed = _read_all(args)
    rows, extraps, assessed, fitted = [], [], [], []
    base, grid, fit_from, desc = _options(args, series) if series else (None, "relative", None, "-")
    for s in series:
        try:
            row, a, ex = _fit_one(s, args, base=base, grid=grid, fit_from=fit_from)
        except ValueError as e:
            failed.append((s.name, s.source, f"{s.source}: {e}"))
            continue
        fitted.append(s)
        assessed.append(a)
        extraps.append(ex)
        rows.append(row)
        if args.bootstrap > 0:
            opts = _opts_for(s, base, grid, fit_from, args)
            bp = bootstrap_points(s.compute, s.reward, options=opts, n_boot=args.bootstrap)
            rows[-1]["bootstrap_points"] = {"n_ok": bp.n_ok, "level": bp.level, "A": list(bp.A), "B": list(bp.B),
                                            "C_mid": list(bp.C_mid), "seed_margin_A": SEED_MARGIN_A}
    if not fitted:
        errors = [e for _, _, e in failed]
        raise ValueError(errors[0] if len(errors) == 1 else
                         f"none of the {len(errors)} runs could be fitted: " + "; ".join(errors))
    series = fitted
    not_fitted = [{"run": name, "source": src, "fitted": False, "error": e} for name, src, e in failed]
    seeds = None
    if args.same_config:
        if len(series) < 2:
            raise ValueError("--same-config needs at least 2 runs" + (
                f" that can be fitted ({len(failed)} could not)" if failed else ""))
        bs = bootstrap_seeds([(s.compute, s.reward) for s in series],
                             options=_opts_for(series[0], base, grid, fit_from, args),
                             n_boot=args.bootstrap or 100)
        per_seed = [a.A for a in assessed]  # None where A is not identified: never a number for such a run
        ident = [v for v in per_seed if v is not None]
        seeds = {"runs": [s.name for s in series], "per_seed_A": per_seed,
                 "half_range_A": (max(ident) - min(ident)) / 2.0 if len(ident) >= 2 else None, "n_ok": bs.n_ok,
                 "A": list(bs.A), "B": list(bs.B), "C_mid": list(bs.C_mid), "seed_margin_A": SEED_MARGIN_A}
    loo = None
    if len(series) > 1:
        loo = compare_loo([(s.compute, s.reward) for s in series], labels=[s.name for s in series],
                          options=[_opts_for(s, base, grid, fit_from, args) for s in series],
                          identified=[a.identified for a in assessed])
    plots = []
    if args.plot_dir:
        plots = _plots(args, series, assessed, extraps, loo)
    loo, seeds = loo_in_units(loo, args.y_range), seeds_in_units(seeds, args.y_range)
    y_note = "" if args.y_range is None else (
        f"y: {args.y} in [{args.y_range[0]:g}, {args.y_range[1]:g}] (--y-range): fitted as (y - LO) / (HI - LO); "
        "A, R0, the bands and errors are shown in its units, the identification rule's widths on the 0-1 scale")
    if args.json:
        print(json.dumps({"grid": desc, "x": args.x, "y": args.y, "y_range": args.y_range, "x_note": x_note,
                          "runs": rows,
                          "not_fitted": not_fitted, "forecast_method": FORECAST_METHOD, "loo": loo_json(loo),
                          "seeds": seeds, "plots": [str(p) for p in plots]}, indent=2, default=json_default))
    else:
        for note in (x_note, y_note):
            if note:
                print(note)
        print_table(desc, rows, loo, plots, seeds, not_fitted=not_fitted)
    return 0


def _fit_one(s: Series, args, *, base: FitOptions, grid: str,
             fit_from) -> tuple[dict, Assessment, _Holdout | None]:
    """One run's row, assessment and forecast check; ValueError (in plain words) when the run cannot be fitted.
    A forecast check or a band that cannot be made is a note in the row, not a failure of the run."""
    opts = _opts_for(s, base, grid, fit_from, args)
    a = assess(s.compute, s.reward, options=opts, n_samples=_n_samples(s, args))
    ex, ex_note = None, ""
    if args.holdout > 0:
        try:
            ex = _holdout(s, a, args, grid=grid, fit_from=fit_from, base=base)
        except ValueError as e:
            ex_note = f"forecast check skipped: {e}"
    row = run_row(s, a, ex, ex_note)
    try:
        band = _forecast(s, a, args)
    except ValueError as e:
        row["forecast_note"] = f"no forecast band: {e}"
        band = None
    if band is not None:
        observed = dict(zip(s.compute.tolist(), s.reward.tolist()))
        row["forecast"] = [{**r, **({"observed": observed[r["compute"]]} if r["compute"] in observed else {})}
                           for r in band.rows()]
        row["forecast_kappa"] = band.kappa
    return in_units(row, args.y_range), a, ex


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


FORECAST_METHOD = ("expected reward, 95% band: profile likelihood of Eq. 1's parameters, widened by the misfit of "
                   "Eq. 1 measured on the run's own held-out tails (scaling/band.py)")


def _forecast(s: Series, a: Assessment, args) -> Band | None:
    """The forecast rows of one run: every point beyond `--fit-to`, and `--forecast-at` (default: twice the last
    compute when there is no `--fit-to`)."""
    targets = [float(c) for c in s.compute if args.fit_to is not None and c > args.fit_to]
    extra = args.forecast_at if args.forecast_at is not None else (
        [] if args.fit_to is not None else [2.0 * float(s.compute.max())])
    targets += [float(c) for c in extra]
    if not targets:
        return None
    return forecast_band(s.compute, s.reward, fit=a.fit, at=sorted(targets), n_samples=_n_samples(s, args))


def _resolve_x(args) -> str:
    """`--x auto` (`io.auto_x`): sets `args.x` and returns the line that says which and why ("" for an explicit
    --x)."""
    from scalerl_mega.scaling.io import auto_x

    if args.x != "auto":
        return ""
    args.x, note = auto_x(args.paths, y=args.y if not args.domains else "val_pass_rate")
    return note


def _read_all(args) -> tuple[list[Series], list[tuple[str, str, str]]]:
    """The curves named on the command line (one per path, or with --domains one per val/<domain>_pass_rate key
    of each path, named `<label>/<domain>`) and, for each path that cannot be read, (name, path, why): a run
    whose file is bad (NaN, a decreasing compute, ...) or whose compute is 0 throughout (with the axis to use)
    does not take the other runs down with it."""
    labels = args.label or []
    if labels and len(labels) != len(args.paths):
        raise ValueError(f"--label got {len(labels)} names for {len(args.paths)} paths")
    series, failed = [], []
    for k, p in enumerate(args.paths):
        q = Path(p)
        name = labels[k] if labels else run_label(q)
        try:
            got = _read_path(p, args, label=labels[k] if labels else None)
        except ValueError as e:
            failed.append((name, str(p), str(e)))
            continue
        for s in got:
            if float(s.compute.max()) <= 0:
                hint = (f"a CPU run logs no GPU-hours: use --x {DEVICE_X} (or the default --x auto)"
                        if s.x_key == GPU_X else "nothing to fit against")
                failed.append((s.name, s.source,
                               f"{s.source}: every {s.x_key} is 0 ({s.compute.size} points): {hint}"))
            else:
                series.append(s)
    return _distinct(series), failed


def _distinct(series: list[Series]) -> list[Series]:
    """The curves with distinct names: a name two runs share (two `demo/seed0` in different output directories)
    gets its file's folder appended, so tables and legends tell them apart."""
    names = [s.name for s in series]
    return [replace(s, name=f"{s.name} ({Path(s.source).parent})") if names.count(s.name) > 1 else s
            for s in series]


def _read_path(p, args, *, label: str | None) -> list[Series]:
    """The curves of one path, each checked against the reward range (`io.check_range`) and mapped onto [0, 1]
    (`io.to_unit_range`) when `--y-range` declares another."""
    from scalerl_mega.scaling.io import check_range, domain_keys, read_series, to_unit_range

    if not args.domains:
        got = [read_series(p, x=args.x, y=args.y, name=label)]
    else:
        keys = domain_keys(p)
        if not keys:
            raise ValueError(f"{p}: --domains found no val/<domain>_pass_rate key")
        base_name = label or read_series(p, x=args.x, y=keys[0]).name
        got = [read_series(p, x=args.x, y=key, name=f"{base_name}/{key[len('val/'):-len('_pass_rate')]}")
               for key in keys]
    for s in got:
        check_range(s, args.y_range)
    return got if args.y_range is None else [to_unit_range(s, args.y_range) for s in got]


def _plots(args, series, assessed, extraps, loo=None) -> list[Path]:
    from scalerl_mega.scaling.plot import CurvePlot, plot_loo, plot_scaling

    out_dir = Path(args.plot_dir)
    xlabel = {"compute_gpu_hours": "Compute (GPU-hours)",
              "compute_device_hours": "Compute (device-hours)",
              "sum:batch/tokens": "Rollout tokens trained on (cumulative)"}.get(args.x, args.x)
    ylabel = {"val_pass_rate": "Validation pass rate"}.get(args.y, args.y)
    written = []
    yr = None if args.y_range is None else tuple(args.y_range)
    curves = [CurvePlot(label=s.name, compute=s.compute, reward=s.reward, fit=a.fit, assessment=a, y_range=yr)
              for s, a in zip(series, assessed)]
    written += plot_scaling(curves, path=out_dir / "scaling.png", xlabel=xlabel, ylabel=ylabel)
    for s, ex in zip(series, extraps):
        if ex is None or ex.later is None:
            continue
        cv = CurvePlot(label=s.name, compute=s.compute, reward=s.reward, fit=ex.half.assessment.fit,
                       heldout_from=ex.half.half_compute, y_range=yr)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in s.name)
        kind = "forecast" if ex.later["forecast"] else "unvetted fit (A not identified)"
        written += plot_scaling([cv], path=out_dir / f"extrapolation_{safe}.png", xlabel=xlabel, ylabel=ylabel,
                                title=f"{s.name}: fit on compute <= {compact(ex.half.half_compute)}; {kind} off by "
                                f"{ex.later['ratio']:.1f}x the noise floor")
    if loo is not None and loo.best is not None:  # Fig. 7 at the common A, with the table's B and C_mid
        loo_curves = [CurvePlot(label=s.name, compute=s.compute, reward=s.reward,
                                fit=replace(r.fixed, B=r.B, C_mid=r.C_mid))
                      for s, r in zip(series, loo.runs) if r.fixed is not None]
        a_mean = curves[0].units(loo.A_mean)  # log F(R) itself is the same on either scale
        written += plot_loo(loo_curves, path=out_dir / "loo.png", title=f"common A = {a_mean:.4f}")
    else:
        ident = [cv for cv in curves if cv.assessment.identified]
        if ident:
            written += plot_loo(ident, path=out_dir / "loo.png")
    return written


def _check_args(args) -> None:
    """What the command line alone refuses, before any run is read or fitted."""
    if args.y_range is not None:
        lo, hi = args.y_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"--y-range needs two finite numbers LO < HI, got {lo:g} {hi:g}")
    if args.same_config and len(args.paths) < 2:
        raise ValueError(f"--same-config compares seeds of one config: it needs at least 2 runs, got "
                         f"{len(args.paths)} ({args.paths[0]})")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check_args(args)
        return _run(args)
    except ValueError as e:
        print(f"scalerl-fit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
