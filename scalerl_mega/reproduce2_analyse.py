"""`python -m scalerl_mega.reproduce analyse --sweep repro3`: issue 29's analysis (reproduction/design/README.md).

Input: the finished runs of `make reproduce` (`outputs/reproduce3/<run_name>/seed<N>/`), copied to
`<out>/runs/<setting>/seed<N>/` (metrics.jsonl xz-compressed: `reproduce_report.collect`) (or, with `--no-collect`, the committed copies alone). Compute axis: the
cumulative generated samples (`sum:samples`, in thousands), so the batch sizes share one axis (paper Sec. 5
compares them on compute, not steps). Everything is judged by the project's one identification rule
(`scaling.identify.assess`) and its seed rules (`scaling.seeds`):

- **Predictability** (paper Fig. 1, Sec. 6): every run's first half of compute is fitted on its own and
  extrapolated to its last 3 validation points (`reproduce2_report.half_fit`); the error is set against
  the binomial noise floor of those points. No forecast where the first half does not identify A.
- **Batch size** (paper Sec. 5, "Global batch size"): 64 vs 16 prompts per step by the paper's rule
  (A within +-0.02, then B at the common A; `seeds.compare_recipe`), by the paired final pass rates, and by
  the paired early/late differences (`reproduce2_report.crossing`: do the curves cross?). The same-maths
  control (the reference batch in micro-batches) measures what seeds and numerics alone produce: its own row
  against the reference, and each batch size compared with it as with the reference (`<var>_vs_control`: an
  effect that is real shows against both runs of the reference recipe, paired by seed).
- **No-Positive-Resampling** over ~2.1 passes of the pool: the same three checks against the reference, and
  against the control (`no_npr_vs_control`).

Output: `fits.json`, `results.json`, PNG plots and the section of `<out>/README.md` between the GENERATED
markers. An axis with fewer than 2 finished seeds on a side is reported as *incomplete* (how many seeds are
finished), never as a result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from scalerl_mega.reproduce2_markdown import markdown
from scalerl_mega.reproduce2_report import (CONTROL, CONTROLLED_VARIANTS, EXPECTED_SEEDS, MIN_SEEDS, REFERENCE, REPRO3_RUN_NAMES,
                                            SAMPLES_AXIS, SETTINGS, crossing, half_fit, irregular_points,
                                            overdispersion)
from scalerl_mega.reproduce_report import (ACTIVE_KEY, EPOCH_KEY, collect, discover, final_pass_rates,
                                           fit_axis, last_train_values, per_seed, plot_axis,
                                           write_analysis_json, write_generated)


def _curves(res: dict[str, Any], rec: str, runs: dict[str, dict[int, Path]]) -> dict[int, tuple[np.ndarray, ...]]:
    return {s: res["series"][f"{rec}/seed{s}"] for s in runs.get(rec, {})}


def _finals(fin: dict[str, Any], runs: dict[str, dict[int, Path]], rec: str) -> dict[int, float]:
    return dict(zip(runs[rec], fin[rec]["per_seed"])) if rec in fin else {}


def _pair_rows(runs: dict[str, dict[int, Path]], res: dict[str, Any], fin: dict[str, Any], *, ref: str,
               var: str) -> dict[str, Any]:
    """`var` against `ref`: the paper's rule on per-seed A and B at the common A, the paired final pass rates,
    and the early/late crossing. Incomplete (no comparison) below `MIN_SEEDS` finished seeds on a side."""
    from scalerl_mega.scaling.seeds import compare_paired, compare_recipe

    n_ref, n_var = len(runs.get(ref, {})), len(runs.get(var, {}))
    row: dict[str, Any] = {"reference": ref, "variant": var, "seeds": [n_ref, n_var]}
    if min(n_ref, n_var) < MIN_SEEDS:
        row["incomplete"] = (f"{n_ref} {ref} and {n_var} {var} seed(s) finished of {len(EXPECTED_SEEDS)}; "
                             f"a verdict needs {MIN_SEEDS} on each side (`make reproduce` continues the sweep)")
        return row

    def seeds_of(rec: str, field: str) -> list[float]:
        return per_seed(res["per_run"], runs, rec, field)

    rule = compare_recipe(A_ref=seeds_of(ref, "A"), A_var=seeds_of(var, "A"), B_ref=seeds_of(ref, "B_at_common_A"),
                          B_var=seeds_of(var, "B_at_common_A"))
    row["rule"] = rule.__dict__
    row["final"] = compare_paired(_finals(fin, runs, ref), _finals(fin, runs, var)).__dict__
    cross = crossing(_curves(res, ref, runs), _curves(res, var, runs))
    row["crossing"] = {"outcome": cross["outcome"],
                       **{w: {"window": cross[w].window, "points": cross[w].points, **cross[w].paired.__dict__}
                          for w in ("early", "late")}}
    return row


def _band(curves: dict[int, tuple[np.ndarray, np.ndarray]], *, single_var) -> tuple[np.ndarray, ...]:
    """Seed mean and +-2 SE on the points every seed has: SE over seeds (sd / sqrt(k)) with 2+ seeds; with one
    seed, sqrt(single_var(points, values)) (the binomial variance of that run's points)."""
    at = [dict(zip(c.tolist(), r.tolist())) for c, r in curves.values()]
    common = sorted(set.intersection(*[set(a) for a in at]))
    ys = np.array([[a[x] for x in common] for a in at])
    mean = ys.mean(axis=0)
    k = ys.shape[0]
    se = ys.std(axis=0, ddof=1) / math.sqrt(k) if k > 1 else np.sqrt(single_var(np.asarray(common), mean))
    return np.asarray(common), mean, mean - 2 * se, mean + 2 * se


def _axis_panels(runs: dict[str, dict[int, Path]], res: dict[str, Any], shown: list[str],
                 pairs: list[tuple[str, str]], binom) -> list[Any]:
    """Seed-mean curves of `shown` with +-2 SE bands, and the paired differences b - a of `pairs` (where both
    ran; seeds paired): a crossing is where such a difference goes from below zero to above it."""
    from scalerl_mega.scaling.plot import BandCurve, BandPanel

    panels = [BandPanel(title="seed means +- 2 SE", ylabel="validation pass rate",
                        curves=[BandCurve(label=f"{rec} ({len(runs[rec])} seeds)", **dict(zip(
                            ("x", "y", "lo", "hi"), _band(_curves(res, rec, runs), single_var=binom))))
                                for rec in shown])]
    curves = []
    for a, b in pairs:
        if a not in runs or b not in runs:
            continue
        ca, cb = _curves(res, a, runs), _curves(res, b, runs)
        diffs = {s: (cb[s][0], cb[s][1] - np.interp(cb[s][0], *ca[s])) for s in ca if s in cb}
        if not diffs:
            continue

        def diff_var(x: np.ndarray, _d: np.ndarray, ca=ca, cb=cb, s=next(iter(diffs))) -> np.ndarray:
            return binom(x, np.interp(x, *cb[s])) + binom(x, np.interp(x, *ca[s]))  # one seed: both points' variances

        x, m, lo, hi = _band(diffs, single_var=diff_var)
        curves.append(BandCurve(label=f"{b} - {a} ({len(diffs)} seeds)", x=x, y=m, lo=lo, hi=hi))
    if curves:
        panels.append(BandPanel(title="paired by seed (+- 2 SE); the table's windows: first and last quarter",
                                ylabel="difference in pass rate", curves=curves, zero_line=True))
    return panels


def _plots2(runs: dict[str, dict[int, Path]], res: dict[str, Any], half: dict[str, Any], out_dir: Path,
            n_per_point: float) -> list[str]:
    from scalerl_mega.scaling.plot import CurvePlot, plot_bands, plot_scaling

    def binom(_x: np.ndarray, p: np.ndarray) -> np.ndarray:
        return np.clip(p * (1 - p), 0, None) / n_per_point

    written = [p.name for p in plot_axis(res, out_dir)]
    hf = [CurvePlot(label=k, compute=res["series"][k][0], reward=res["series"][k][1], fit=h.assessment.fit,
                    heldout_from=h.half_compute, assessment=h.assessment)
          for k, h in half.items() if k.startswith(f"{REFERENCE}/")]
    written += [p.name for p in plot_scaling(
        hf, path=out_dir / "half_fit_samples.png", formats=("png",), xlabel=SAMPLES_AXIS.label, log_x=False,
        figsize=(10.0, 6.0), title="fit on the first half of compute (stars), extrapolated (dashed, only where it "
                                   "identifies A)\nagainst the second half (crosses)")]
    axes = ((("batch_small", REFERENCE, "batch_large", CONTROL),
             [(REFERENCE, "batch_large"), (REFERENCE, "batch_small"), (REFERENCE, CONTROL), (CONTROL, "batch_large")],
             "batch_samples.png",
             "batch-size axis (paper Sec. 5: larger is slower early, higher late)"),
            ((REFERENCE, "no_npr", CONTROL), [(REFERENCE, "no_npr"), (CONTROL, "no_npr")], "npr_samples.png",
             "No-Positive-Resampling over ~2.1 passes (reference: on; no_npr: off)"))
    for shown, pairs, name, title in axes:
        shown = [rec for rec in shown if rec in runs]
        if not any(b in runs for _, b in pairs):
            continue
        written += [p.name for p in plot_bands(_axis_panels(runs, res, shown, pairs, binom), path=out_dir / name,
                                               xlabel=SAMPLES_AXIS.label, title=title)]
    return written


def analyse2(*, sweep_dir: Path | None, out_dir: Path) -> dict[str, Any]:
    """Collect (unless `sweep_dir` is None), fit, compare and write `out_dir` (module docstring)."""
    runs_dir = out_dir / "runs"
    if sweep_dir is not None:
        collect(sweep_dir, runs_dir, run_names=REPRO3_RUN_NAMES, compress_metrics=True)
    runs = discover(runs_dir, run_names=REPRO3_RUN_NAMES)
    res = fit_axis(runs, SAMPLES_AXIS, reference=REFERENCE, controls=frozenset({CONTROL}))
    half, disp = {}, {}
    for key, (c, r) in res["series"].items():  # compute already in SAMPLES_AXIS units
        n = res["n_samples"][key]
        if n is None:
            raise ValueError(f"{key}: its validation lines do not record val_prompts x val_samples_per_prompt")
        half[key] = half_fit(c, r, n)
        disp[key] = overdispersion(res["fits"][key], c, n)
    fin = final_pass_rates(runs, res["series"], reference=REFERENCE)
    pairs = {var: _pair_rows(runs, res, fin, ref=REFERENCE, var=var) for var in SETTINGS if var != REFERENCE}
    pairs["batch_large_vs_small"] = _pair_rows(runs, res, fin, ref="batch_small", var="batch_large")
    for var in CONTROLLED_VARIANTS:  # the same comparisons against the reference recipe rerun in micro-batches
        pairs[f"{var}_vs_control"] = _pair_rows(runs, res, fin, ref=CONTROL, var=var)
    missing = [f"{rec}/seed{s}" for rec in SETTINGS for s in EXPECTED_SEEDS if s not in runs.get(rec, {})]
    plots = _plots2(runs, res, half, out_dir, n_per_point=min(float(n[-1]) for n in res["n_samples"].values()))
    last = last_train_values(runs, (EPOCH_KEY, ACTIVE_KEY))
    prov = {k: _provenance(runs, k) for k in res["per_run"]}
    results = {"reference": REFERENCE, "axis": SAMPLES_AXIS.key, "missing": missing, "plots": plots,
               "runs": {k: {**v, "half_fit": {f: getattr(half[k], f) for f in half[k].__dataclass_fields__
                                              if f != "assessment"},
                            "epoch_at_end": None if last[k][EPOCH_KEY] is None else int(last[k][EPOCH_KEY]),
                            "active_prompts_at_end": last[k][ACTIVE_KEY],
                            "overdispersion": disp[k],
                            "irregular_points": _irregular(runs, k, res["n_samples"][k], last_step=prov[k]["steps"]),
                            **prov[k]}
                        for k, v in res["per_run"].items()},
               "final_pass_rate": fin, "comparisons": pairs, "common_A": res["loo"].A_mean}
    fits = {k: {f: v[f] for f in ("A", "B", "C_mid", "A_interval", "identified", "reason")}
            for k, v in res["per_run"].items()}
    write_analysis_json(out_dir / "fits.json", fits)
    write_analysis_json(out_dir / "results.json", results)
    write_generated(out_dir / "README.md", markdown(results), title="Issue 29's sweep")
    return results


def _irregular(runs: dict[str, dict[int, Path]], key: str, n_samples, *, last_step: int | None) -> list[str]:
    """`reproduce2_report.irregular_points` of a run: its schedule from its own validation lines (the median
    step between two points) up to `last_step` (its summary's; None: its last point)."""
    from scalerl_mega.metrics.writer import read_metrics
    from scalerl_mega.scaling.io import run_metrics_file

    rec, seed = key.split("/seed")
    d = runs[rec][int(seed)]
    steps = [int(r["step"]) for r in read_metrics(run_metrics_file(d), kind="validation")]
    if len(steps) < 2:
        return []
    every = int(np.median(np.diff(steps)))
    return irregular_points(steps, n_samples, every=every, last_step=steps[-1] if last_step is None else last_step)


def _provenance(runs: dict[str, dict[int, Path]], key: str) -> dict[str, Any]:
    rec, seed = key.split("/seed")
    d = runs[rec][int(seed)]
    p = d / "provenance.json"
    s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    prov = json.loads(p.read_text()) if p.is_file() else {}
    segments = prov.get("segments") or []
    wall = s.get("wall_s")  # a resumed run's summary times its last launch only: add the earlier ones
    if len(segments) > 1 and all(g.get("wall_s") is not None for g in segments):
        wall = sum(g["wall_s"] for g in segments)
    return {"commit": prov.get("commit"), "dirty": prov.get("dirty"), "wall_s": wall,
            "steps": s.get("steps"), "segments": segments}
