"""The leave-one-out design (`python -m reproduction.reproduce analyse --design loo`): the paper's LOO experiment
(Sec. 6, Fig. 7) at toy scale on the CPU demo; reproduction/loo/README.md holds the method and the results.

Input: the runs of the `conf/experiment/reproduction/loo_*.yaml` overlays, collected as curves into
`<out>/runs/<recipe>/seed<N>/` (`reproduction.common.collect`). Every run is fitted with Eq. 1 and judged by the
project's one identification rule (`scalerl_mega.scaling.identify.assess`: relative grids, the fit cut at 0.1 of
each run's compute, A only when its 95% interval is <= 0.04 wide, >= 8 points after the cut and the hold-out
misfit check passes) on two compute axes:

- `tokens`: the cumulative rollout tokens (prompt + generated) of the steps trained so far (`sum:batch/tokens`), in
  millions -- independent of what else the machine was running;
- `wallclock`: `compute_device_hours` (wall time x trainer and engine processes), which on a shared machine also
  measures the other jobs.

Per axis: every run's own fit; the common-A refit of all runs (`compare.compare_loo`, App. A.5) for B per seed; per
recipe the seed half-range of A against the +-0.02 margin and `seeds.compare_recipe` against the reference; the
seed-mean curve of every recipe with its own LOO table (the paper's Fig. 7 view). Verdicts are taken on the `tokens`
axis. Output: `fits.json` (tokens axis), `fits_wallclock.json`, `results.json` (everything), two plots (tokens axis:
the seed means with their fits, every run with its own) and the section of `README.md` between the GENERATED markers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalerl_mega.metrics.writer import read_metrics
from scalerl_mega.scaling.compare import SEED_MARGIN_A, compare_loo
from scalerl_mega.scaling.identify import assess
from scalerl_mega.scaling.io import read_series, run_metrics_file
from scalerl_mega.scaling.plot import CurvePlot, plot_scaling
from scalerl_mega.scaling.seeds import (NOT_SEPARABLE, REFERENCE_BETTER, compare_means, compare_paired, compare_recipe,
                                        half_range, seed_mean_curve)

from reproduction.common import (BEGIN, END, TOKENS_AXIS, WALLCLOCK_AXIS, Axis, collect, discover, fmt, json_safe,
                                 recipe_name, run_fit_options, write_analysis_json, write_generated)

RUN_NAMES = ("loo_scalerl", "loo_dapo", "loo_no_zvf", "loo_no_fp32_head", "loo_no_npr")
"""The design's overlays (conf/experiment/reproduction/); the first is the reference recipe."""
REFERENCE = recipe_name(RUN_NAMES[0])
AXES = (TOKENS_AXIS, WALLCLOCK_AXIS)
PLOTTED = TOKENS_AXIS.slug
"""The axis whose plots are drawn (the verdicts' axis)."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    title: str
    paper: str
    control: bool = False
    needs_epochs: bool = False
    """The variant acts only from the second pass over the training prompts (No-Positive-Resampling removes
    prompts from later epochs): untestable where no run of either recipe got past epoch 0."""


FINDINGS = {
    "dapo": Finding(title="CISPO instead of DAPO", paper="similar A, CISPO more efficient: B 2.01 vs 1.77 at the "
                    "common A (Sec. 6, Fig. 7; App. A.16: CISPO also more robust to eps_max)"),
    "no_zvf": Finding(title="zero-variance filtering", paper="LOO variants reach a similar A; ScaleRL has the "
                      "highest B at the common A (Sec. 6, Fig. 7)"),
    "no_fp32_head": Finding(title="FP32 LM head", paper="little difference for the dense 8B in the LOO (Sec. 6); "
                            "here the body is FP32 too, so the head is FP32 either way: a same-maths control",
                            control=True),
    "no_npr": Finding(title="No-Positive-Resampling", paper="LOO variants reach a similar A; ScaleRL has the "
                      "highest B at the common A (Sec. 6, Fig. 7)", needs_epochs=True),
}


CONTROLS = frozenset(rec for rec, f in FINDINGS.items() if f.control)
"""The leave-one-out sweep's same-maths controls (their verdict expects "not separable")."""


def verdict(outcome: str, *, control: bool) -> str:
    """The README's words for a `seeds.compare_recipe` outcome (paper: ScaleRL is at least as good)."""
    if control:
        return ("control: not separable, as expected" if outcome == NOT_SEPARABLE
                else f"control separates ({outcome}): the noise estimate is too small")
    if outcome == REFERENCE_BETTER:
        return "reproduced at toy scale"
    return "not separable within noise" if outcome == NOT_SEPARABLE else "contradicted"


EPOCH_KEY = "curriculum/curriculum/epoch"
"""The `train` line key of the curriculum's epoch (0 = still in the first pass over the training prompts)."""


ACTIVE_KEY = "curriculum/curriculum/active_prompts"
"""The `train` line key of the prompts still in the curriculum's pool (No-Positive-Resampling removes the rest)."""


def last_train_values(runs: dict[str, dict[int, Path]], keys: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """`<recipe>/seed<N>` -> {key: the value of the run's last `train` line that has it, None when never logged},
    each metrics.jsonl read once for all `keys`."""

    out: dict[str, dict[str, float | None]] = {}
    for rec, seeds in runs.items():
        for seed, d in seeds.items():
            last: dict[str, float | None] = dict.fromkeys(keys)
            for r in read_metrics(run_metrics_file(d), kind="train"):
                last.update({k: float(r[k]) for k in keys if k in r})
            out[f"{rec}/seed{seed}"] = last
    return out


def last_epochs(runs: dict[str, dict[int, Path]]) -> dict[str, int | None]:
    """`<recipe>/seed<N>` -> the curriculum epoch of the run's last `train` line (None when not logged)."""
    return {k: None if v[EPOCH_KEY] is None else int(v[EPOCH_KEY])
            for k, v in last_train_values(runs, (EPOCH_KEY,)).items()}


def untestable(rec: str, runs: dict[str, dict[int, Path]], epochs: dict[str, int | None]) -> str:
    """Why a finding cannot be tested by this sweep ("" when it can)."""
    if not FINDINGS[rec].needs_epochs:
        return ""
    keys = [f"{r}/seed{s}" for r in (REFERENCE, rec) for s in runs.get(r, {})]
    ep = [epochs.get(k) for k in keys]
    if ep and all(e == 0 for e in ep):
        return (f"untestable here: every {REFERENCE} and {rec} run ended in epoch 0 (the first pass over the "
                "training prompts); No-Positive-Resampling removes prompts only from later epochs, so both "
                "recipes trained the same prompts at every step")
    return ""


def fit_axis(runs: dict[str, dict[int, Path]], axis: Axis, *, reference: str = REFERENCE,
             controls: frozenset[str] = CONTROLS) -> dict[str, Any]:
    """Every run's own Eq. 1 fit and assessment on `axis`, the common-A refit (B per seed), the per-recipe rows
    against `reference` (`controls` are judged as same-maths controls) and the seed-mean curves' fits."""

    series, opts, fits, assessed, n_samples = {}, {}, {}, {}, {}
    for rec, seeds in runs.items():
        for seed, d in seeds.items():
            s = read_series(d, x=axis.key, y="val_pass_rate")
            key = f"{rec}/seed{seed}"
            series[key] = (s.compute * axis.scale, s.reward)
            n_samples[key] = s.n_samples
            opts[key] = run_fit_options(series[key][0])
            assessed[key] = assess(*series[key], options=opts[key], n_samples=s.n_samples)
            fits[key] = assessed[key].fit
    keys = list(series)
    loo = compare_loo([series[k] for k in keys], labels=keys, options=[opts[k] for k in keys],
                      identified=[assessed[k].identified for k in keys])
    loo_by = {r.label: r for r in loo.runs}
    per_run = {k: {**assessed[k].summary(), "B_at_common_A": None if math.isnan(loo_by[k].B) else loo_by[k].B,
                   "last_val_pass_rate": float(series[k][1][-1])} for k in keys}
    recipes = _recipe_rows(runs, per_run, reference=reference, controls=controls)
    mean_curves, mean_assessed, loo_mean = _fit_seed_means(runs, series, n_samples)
    return {"axis": axis, "series": series, "n_samples": n_samples, "fits": fits, "assessed": assessed,
            "per_run": per_run, "loo": loo,
            "recipes": recipes, "mean_curves": mean_curves, "mean_assessed": mean_assessed,
            "mean_fits": {rec: a.fit for rec, a in mean_assessed.items()}, "loo_mean": loo_mean}


def per_seed(per_run: dict[str, dict[str, Any]], runs: dict[str, dict[int, Path]], rec: str,
             field: str) -> list[float]:
    """`field` of each seed of `rec` in `fit_axis`'s per-run rows, in seed order (None -> nan)."""
    return [math.nan if (v := per_run[f"{rec}/seed{s}"][field]) is None else v for s in runs[rec]]


def _recipe_rows(runs: dict[str, dict[int, Path]], per_run: dict[str, dict[str, Any]], *, reference: str,
                 controls: frozenset[str]) -> dict[str, Any]:
    """Per recipe: its seeds' A and B (at the common A), their spread, and (for the variants) the paired and
    seed-aware comparison against the `reference` recipe with its verdict."""

    def seed_values(rec: str, field: str) -> list[float]:
        return per_seed(per_run, runs, rec, field)

    recipes: dict[str, Any] = {}
    for rec in runs:
        a = [v for v in seed_values(rec, "A") if not math.isnan(v)]
        b = [v for v in seed_values(rec, "B_at_common_A") if not math.isnan(v)]
        row: dict[str, Any] = {
            "seeds": list(runs[rec]), "A_per_seed": seed_values(rec, "A"),
            "A_mean": float(np.mean(a)) if a else None, "A_half_range": half_range(a) if a else None,
            "within_seed_margin": (half_range(a) <= SEED_MARGIN_A) if a else None,
            "B_at_common_A_per_seed": seed_values(rec, "B_at_common_A"),
            "B_mean": float(np.mean(b)) if b else None, "B_sd": float(np.std(b, ddof=1)) if len(b) > 1 else None,
        }
        if rec != reference:
            pa = compare_paired({sd: v for sd, v in zip(runs[reference], seed_values(reference, "A"))},
                                {sd: v for sd, v in zip(runs[rec], seed_values(rec, "A"))})
            row["paired_A"] = json_safe(pa.__dict__)
            cmp = compare_recipe(A_ref=seed_values(reference, "A"), A_var=seed_values(rec, "A"),
                                 B_ref=seed_values(reference, "B_at_common_A"), B_var=seed_values(rec, "B_at_common_A"))
            row["comparison"] = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                                 for k, v in cmp.__dict__.items()}
            row["verdict"] = verdict(cmp.outcome, control=rec in controls)
        recipes[rec] = row
    return recipes


def _fit_seed_means(runs: dict[str, dict[int, Path]], series: dict[str, Any],
                    n_samples: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Fit each recipe's seed-mean curve (with the summed sample counts) and compare them by leave-one-out.
    Returns (mean_curves, mean_assessed, loo_mean)."""

    mean_curves = {rec: seed_mean_curve([series[f"{rec}/seed{s}"] for s in runs[rec]]) for rec in runs}
    mean_opts = {rec: run_fit_options(c) for rec, (c, _) in mean_curves.items()}
    mean_assessed = {}
    for rec in runs:  # a mean of k seeds rests on k times the samples of one
        ns = [n_samples[f"{rec}/seed{s}"] for s in runs[rec]]
        m = len(mean_curves[rec][0])
        total = None if any(v is None for v in ns) else np.sum([v[:m] for v in ns], axis=0)
        mean_assessed[rec] = assess(*mean_curves[rec], options=mean_opts[rec], n_samples=total)
    loo_mean = compare_loo(list(mean_curves.values()), labels=list(mean_curves), options=list(mean_opts.values()),
                           identified=[mean_assessed[rec].identified for rec in mean_curves])
    return mean_curves, mean_assessed, loo_mean


FINAL_POINTS = 3
"""The model-free check averages the last validation points of a run (steps 40, 45, 50 in the sweep)."""


def final_pass_rates(runs: dict[str, dict[int, Path]], series: dict[str, Any], *,
                     reference: str = REFERENCE) -> dict[str, Any]:
    """Per recipe: each seed's mean pass rate over its last `FINAL_POINTS` validations, and the variant vs
    reference `seeds.compare_means` (no fit involved: it still compares where A is not identified)."""

    per = {rec: [float(np.mean(series[f"{rec}/seed{s}"][1][-FINAL_POINTS:])) for s in seeds]
           for rec, seeds in runs.items()}
    out = {}
    for rec, vals in per.items():
        row: dict[str, Any] = {"per_seed": vals, "mean": float(np.mean(vals)),
                               "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else None}
        if rec != reference:
            m = compare_means(per[reference], vals)
            row.update(delta=m.delta, se=None if math.isnan(m.se) else m.se, outcome=m.outcome)
            pa = compare_paired(dict(zip(runs[reference], per[reference])), dict(zip(runs[rec], vals)))
            row["paired"] = json_safe(pa.__dict__)
        out[rec] = row
    return out


def plot_axis(res: dict[str, Any], out_dir: Path) -> list[Path]:
    """The design's two plots on one axis: the seed-mean curves with their Eq. 1 fits (`scaling_<axis>.png`) and
    every run with its own fit (`runs_<axis>.png`)."""
    axis: Axis = res["axis"]
    curves = [CurvePlot(label=f"{rec} (mean of {len(res['recipes'][rec]['seeds'])} seeds)", compute=c, reward=r,
                        fit=res["mean_fits"][rec], assessment=res["mean_assessed"][rec])
              for rec, (c, r) in res["mean_curves"].items()]
    written = plot_scaling(curves, path=out_dir / f"scaling_{axis.slug}.png", formats=("png",), xlabel=axis.label,
                           title=f"seed-mean curves and their Eq. 1 fits ({axis.slug} axis)", log_x=False)
    runs = [CurvePlot(label=k, compute=c, reward=r, fit=res["fits"][k], assessment=res["assessed"][k])
            for k, (c, r) in res["series"].items()]
    written += plot_scaling(runs, path=out_dir / f"runs_{axis.slug}.png", formats=("png",), xlabel=axis.label,
                            title=f"every run and its own fit ({axis.slug} axis)", log_x=False, figsize=(10.0, 7.0),
                            dpi=85)
    return written


# ------------------------------------------------------------------------------------------------ report
def _axis_lines(res: dict[str, Any]) -> list[str]:
    """One axis's recipe table against the reference and its seed-mean leave-one-out table."""
    lines: list[str] = []
    ax = res["axis"]
    lines += ["", f"### Recipes against {REFERENCE} ({ax.slug} axis)", "",
              "| recipe | A per seed | A mean | A half-range (margin 0.02) | B at common A, mean +- sd | "
              "delta A | noise A | delta B | 2 x SE(delta B) | outcome |", "|" + "---|" * 10]
    for rec, r in res["recipes"].items():
        c = r.get("comparison") or {}
        per = ", ".join(fmt(a, ".3f") for a in r["A_per_seed"])
        lines.append(f"| {rec} | {per} | {fmt(r['A_mean'], '.3f')} | {fmt(r['A_half_range'], '.3f')} | "
                     f"{fmt(r['B_mean'], '.2f')} +- {fmt(r['B_sd'], '.2f')} | {fmt(c.get('delta_A'), '+.3f')} | "
                     f"{fmt(c.get('noise_A'), '.3f')} | {fmt(c.get('delta_B'), '+.2f')} | "
                     f"{fmt(None if c.get('se_B') is None else 2 * c['se_B'], '.2f')} | "
                     f"{c.get('outcome', 'reference')} |")
    lm = res["loo_mean"]
    lines += ["", f"Seed-mean curves, leave-one-out table at their common A = {fmt(lm.A_mean, '.3f')} "
              "(the paper's Fig. 7 view):", "",
              "| recipe | own A | A - mean | B at common A | C_mid at common A |", "|---|---|---|---|---|"]
    for r in lm.runs:
        lines.append(f"| {r.label}{' (best B)' if r.label == lm.best else ''} | "
                     f"{fmt(r.fit.A if r.fit.identified else None, '.3f')} | {fmt(r.A_offset, '+.3f')} | "
                     f"{fmt(r.B, '.2f')} | {fmt(r.C_mid, '.3g')} |")
    return lines


def _verdict_lines(results: dict[str, Any], *, tok: dict[str, Any], wall: dict[str, Any]) -> list[str]:
    """The verdict table: one line per finding (tokens axis, the wall-clock verdict and the paired check)."""
    fin = results["final_pass_rate"]
    lines = ["", "### Verdicts (tokens axis)", "",
             "| finding | paper | outcome here (A, then B at the common A) | verdict | wall-clock axis | "
             "final pass rate (model-free, paired by seed) |", "|---|---|---|---|---|---|"]
    for rec, f in FINDINGS.items():
        r = tok["recipes"].get(rec)
        if r is None:
            lines.append(f"| {f.title} ({rec}) | {f.paper} | no finished run | - | - | - |")
            continue
        why = results["untestable"].get(rec, "")
        if why:
            lines.append(f"| {f.title} ({rec}) | {f.paper} | {why} | **untestable here** | - | - |")
            continue
        w = wall["recipes"][rec]
        q = fin[rec]
        pa = q.get("paired") or {}
        lines.append(f"| {f.title} ({rec}) | {f.paper} | {r['comparison']['reason']} | **{r['verdict']}** | "
                     f"{w['verdict']} | {pa.get('outcome', '-')} ({fmt(pa.get('mean'), '+.3f')} +- "
                     f"{fmt(pa.get('half_width'), '.3f')}) |")
    return lines


def _markdown(results: dict[str, Any], by_axis: dict[str, dict[str, Any]], missing: list[str]) -> str:
    tok, wall = by_axis["tokens"], by_axis["wallclock"]
    lines = [BEGIN, ""]
    if missing:
        lines += [f"**Partial results**: {len(missing)} of the sweep's runs are not finished and not included: "
                  + ", ".join(missing) + ".", ""]
    prov = results["provenance"]
    if prov:
        lines += ["Sweep invocations (the sweep directory's `provenance.jsonl`, copied to `provenance.jsonl`):", ""]
        for p in prov:
            lines.append(f"- {p.get('started')} -> {p.get('finished', 'unfinished')}: commit "
                         f"`{(p.get('commit') or '?')[:12]}`{' (dirty tree)' if p.get('dirty') else ''}, "
                         f"exit {p.get('rc', '?')}, {fmt(p.get('wall_s'), '.0f')} s: `{p.get('command')}`")
        lines.append("")
    lines += ["### Per-run fits", "",
              f"Eq. 1 per run; tokens axis (C_mid in {tok['axis'].unit}) and wall-clock axis (C_mid in "
              f"{wall['axis'].unit}). B at the common A: every run refit at the mean A of all identified runs "
              f"(tokens A = {fmt(tok['loo'].A_mean, '.3f')}; App. A.5).", "",
              "| run | A | A 95% interval | B | C_mid | identified | B at common A | last pass rate | A (wall clock) "
              "| B (wall clock) | C_mid (wall clock) | wall s | SFT |", "|" + "---|" * 13]
    for k, row in tok["per_run"].items():
        w = wall["per_run"][k]
        s = results["summaries"][k]
        iv = row["A_interval"]
        lines.append(f"| {k} | {fmt(row['A'], '.3f')} | {fmt(iv[0], '.3f')}..{fmt(iv[1], '.3f')} | "
                     f"{fmt(row['B'], '.2f')} | {fmt(row['C_mid'], '.3g')} | "
                     f"{'yes' if row['identified'] else 'NO'} | {fmt(row['B_at_common_A'], '.2f')} | "
                     f"{row['last_val_pass_rate']:.3f} | {fmt(w['A'], '.3f')} | {fmt(w['B'], '.2f')} | "
                     f"{fmt(w['C_mid'], '.3g')} | {fmt(s.get('wall_s'), '.0f')} | {s.get('sft', '-')} |")
    unident = [f"- {k}: {r['reason']}" for k, r in tok["per_run"].items() if not r["identified"]]
    if unident:
        lines += ["", "Not identified (tokens axis; `scaling.identify`: 95% interval <= 0.04 wide, >= 8 points "
                  "after the cut at 0.1 of the run's compute, hold-out error <= 2x the binomial noise floor):", ""]
        lines += unident
    for res in (tok, wall):
        lines += _axis_lines(res)
    fin = results["final_pass_rate"]
    lines += ["", f"### Model-free check: final pass rate (mean of the last {FINAL_POINTS} validations per run)", "",
              "Welch: difference of the seed means against 2 SE. Paired by seed: the mean of the per-seed "
              "differences (same seed = same warm start and prompt order) against t_0.975(dof) x sd / sqrt(k); "
              "the paper's +-0.02 rule on that mean next to it.", "",
              "| recipe | per seed | mean +- sd | delta vs reference | 2 x SE | Welch outcome | paired mean diff | "
              "t half-width (dof) | paired outcome | +-0.02 rule |", "|" + "---|" * 10]
    for rec, r in fin.items():
        pa = r.get("paired") or {}
        lines.append(f"| {rec} | {', '.join(f'{v:.3f}' for v in r['per_seed'])} | {r['mean']:.3f} +- "
                     f"{fmt(r['sd'], '.3f')} | {fmt(r.get('delta'), '+.3f')} | "
                     f"{fmt(None if r.get('se') is None else 2 * r['se'], '.3f')} | {r.get('outcome', 'reference')} | "
                     f"{fmt(pa.get('mean'), '+.3f')} | {fmt(pa.get('half_width'), '.3f')} ({pa.get('dof', '-')}) | "
                     f"{pa.get('outcome', '-')} | {pa.get('margin_rule', '-')} |")
    lines += _verdict_lines(results, tok=tok, wall=wall)
    lines += ["", "### Plots", ""] + [f"![{p}]({p})" for p in results["plots"]] + ["", END]
    return "\n".join(lines)


def analyse(*, sweep_dir: Path | None, out_dir: Path) -> dict[str, Any]:
    """Collect (unless `sweep_dir` is None), fit, compare and write `out_dir` (module docstring)."""
    runs_dir = out_dir / "runs"
    if sweep_dir is not None:
        collect(sweep_dir, runs_dir, run_names=RUN_NAMES)
    runs = discover(runs_dir, run_names=RUN_NAMES)
    expected = sorted({int(d.name[4:]) for rec in runs.values() for d in rec.values()} | {0, 1, 2})
    missing = [f"{recipe_name(n)}/seed{s}" for n in RUN_NAMES for s in expected
               if s not in runs.get(recipe_name(n), {})]
    by_axis = {ax.slug: fit_axis(runs, ax) for ax in AXES}
    plots = [p.name for p in plot_axis(by_axis[PLOTTED], out_dir)]
    summaries = {}
    for rec, seeds in runs.items():
        for seed, d in seeds.items():
            s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
            sft = "ran here" if (d / "sft.jsonl").is_file() else "loaded"
            summaries[f"{rec}/seed{seed}"] = {"wall_s": s.get("wall_s"), "rl_s": s.get("rl_s"), "sft_s": s.get("sft_s"),
                                              "steps": s.get("steps"), "sft": sft}
    prov_path = out_dir / "provenance.jsonl"
    prov = [json.loads(x) for x in prov_path.read_text().splitlines() if x.strip()] if prov_path.is_file() else []
    epochs = last_epochs(runs)
    results = {"reference": REFERENCE, "missing": missing, "last_epochs": epochs,
               "untestable": {rec: why for rec in FINDINGS if rec in runs and (why := untestable(rec, runs, epochs))},
               "provenance": prov, "summaries": summaries, "plots": plots,
               "final_pass_rate": final_pass_rates(runs, by_axis["tokens"]["series"]),
               "axes": {slug: {"x": res["axis"].key, "unit": res["axis"].unit, "runs": res["per_run"],
                               "recipes": res["recipes"], "common_A": res["loo"].A_mean,
                               "loo_seed_means": {"A_mean": res["loo_mean"].A_mean, "best": res["loo_mean"].best,
                                                  "runs": [{"recipe": r.label,
                                                            "A": r.fit.A if r.fit.identified else None,
                                                            "B_at_common_A": r.B, "C_mid_at_common_A": r.C_mid}
                                                           for r in res["loo_mean"].runs]}}
                        for slug, res in by_axis.items()}}
    for slug, name in (("tokens", "fits.json"), ("wallclock", "fits_wallclock.json")):
        fits = {k: {f: v[f] for f in ("A", "B", "C_mid", "A_interval", "identified", "reason")}
                for k, v in by_axis[slug]["per_run"].items()}
        write_analysis_json(out_dir / name, fits)
    write_analysis_json(out_dir / "results.json", results)
    write_generated(out_dir / "README.md", _markdown(results, by_axis, missing), title="Leave-one-out design")
    return results
