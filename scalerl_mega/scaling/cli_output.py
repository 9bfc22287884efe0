"""What `scalerl-fit` prints: the per-run rows (JSON) and the tables, from the fits `scaling/cli.py` made."""

from __future__ import annotations

import math

import numpy as np

from scalerl_mega.scaling.identify import verdict_text

def compact(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def loo_json(loo) -> dict | None:
    if loo is None:
        return None
    return {"A_mean": None if math.isnan(loo.A_mean) else loo.A_mean, "margin": loo.margin, "best": loo.best, "excluded": list(loo.excluded),
            "runs": [{"run": r.label, "A": r.fit.A if r.fit.identified else None, "A_minus_mean": r.A_offset,
                      "within_margin": r.within_margin, "B_at_A_mean": r.B, "C_mid_at_A_mean": r.C_mid}
                     for r in loo.runs]}


def print_loo(loo) -> None:
    n_ident = len(loo.runs) - len(loo.excluded)
    if n_ident == 0:
        print(f"leave-one-out (paper Sec. 6 / App. A.5): no common A to refit at: none of the {len(loo.runs)} runs "
              "has an identified A (each run's notes above say why); B and C_mid above are each run's own fit")
        return
    print(f"leave-one-out at the common A={loo.A_mean:.4f} (the A of the one identified run" if n_ident == 1 else
          f"leave-one-out at the common A={loo.A_mean:.4f} (mean over {n_ident} identified runs", end="")
    print("; every run refit at it, paper Sec. 6 / App. A.5):")
    table = [("run", "A", "A - mean", "B at mean A", "C_mid at mean A", "note")]
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


def json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _text_verdict(identified: bool, A, interval, reason: str) -> str:
    """`identify.verdict_text` from a row's (converted) fields."""
    iv = f"95% interval {interval[0]:.3f}..{interval[1]:.3f}"
    return f"A = {A:.3f} ({iv})" if identified else f"A not identified ({iv}): {reason}"


ON_UNIT_SCALE = "on the 0-1 scale of --y-range: "
"""Prefix of the identification reasons under `--y-range`: their values and widths are on the fitted scale."""


def in_units(row: dict, y_range) -> dict:
    """A run's row (`run_row`, fitted on (y - LO) / (HI - LO) under `scalerl-fit --y-range LO HI`) with every
    reward-valued field back in the metric's units: values map as LO + (HI - LO) v, errors and widths scale by
    HI - LO, squared errors by its square; ratios, computes and B are unchanged. `y_range` None or (0, 1): the row."""
    if y_range is None or tuple(y_range) == (0.0, 1.0):
        return row
    lo, w = float(y_range[0]), float(y_range[1]) - float(y_range[0])

    def aff(v):
        return None if v is None else [aff(u) for u in v] if isinstance(v, list) else lo + w * v

    def sc(v):
        return None if v is None else w * v

    row = {**row, "A": aff(row["A"]), "R0": aff(row["R0"]), "A_interval": aff(row["A_interval"]),
           "sse": w * w * row["sse"]}
    row["reason"] = f"{ON_UNIT_SCALE}{row['reason']}" if row["reason"] else ""
    row["verdict"] = _text_verdict(row["identified"], row["A"], row["A_interval"], row["reason"])
    if "forecast" in row:
        row["forecast"] = [{k: aff(v) if k != "compute" else v for k, v in f.items()} for f in row["forecast"]]
    if "refined" in row:
        row["refined"] = {**row["refined"], "A": aff(row["refined"]["A"]), "sse": w * w * row["refined"]["sse"]}
    if "misfit_check" in row:
        m = row["misfit_check"]
        row["misfit_check"] = {**m, "mae": sc(m["mae"]), "noise_floor": sc(m["noise_floor"])}
    if "bootstrap_points" in row:
        row["bootstrap_points"] = {**row["bootstrap_points"], "A": aff(row["bootstrap_points"]["A"])}
    if "holdout" in row:
        h = dict(row["holdout"])
        h.update(A=aff(h["A"]), A_interval=aff(h["A_interval"]), delta_A=sc(h["delta_A"]))
        h["verdict"] = _text_verdict(h["identified"], h["A"], h["A_interval"],
                                     ON_UNIT_SCALE + h["verdict"].split(": ", 1)[-1])
        if h.get("later"):
            h["later"] = {**h["later"], **{k: sc(h["later"][k]) for k in ("mae", "noise_floor", "bias")}}
        fp = h["final_points"]
        h["final_points"] = {**fp, "observed": aff(fp["observed"]), "predicted": aff(fp["predicted"]),
                             **{k: sc(fp[k]) for k in ("mae", "noise_floor", "unvetted_mae")}}
        row["holdout"] = h
    return row


def loo_in_units(loo, y_range):
    """The leave-one-out comparison (`compare.compare_loo`, made on the 0-1 scale of `--y-range LO HI`) with its
    A values, offsets and margin in the metric's units (`in_units`); `y_range` None or (0, 1): `loo`."""
    if loo is None or y_range is None or tuple(y_range) == (0.0, 1.0):
        return loo
    from dataclasses import replace

    lo, w = float(y_range[0]), float(y_range[1]) - float(y_range[0])
    runs = tuple(replace(r, fit=replace(r.fit, A=lo + w * r.fit.A), A_offset=w * r.A_offset) for r in loo.runs)
    return replace(loo, A_mean=lo + w * loo.A_mean, margin=w * loo.margin, runs=runs)


def seeds_in_units(seeds: dict | None, y_range) -> dict | None:
    """`--same-config`'s seed summary in the metric's units (`in_units`)."""
    if seeds is None or y_range is None or tuple(y_range) == (0.0, 1.0):
        return seeds
    lo, w = float(y_range[0]), float(y_range[1]) - float(y_range[0])
    return {**seeds, "per_seed_A": [None if a is None else lo + w * a for a in seeds["per_seed_A"]],
            "half_range_A": None if seeds["half_range_A"] is None else w * seeds["half_range_A"],
            "A": [lo + w * a for a in seeds["A"]], "seed_margin_A": w * seeds["seed_margin_A"]}


def run_row(s, a, ex, ex_note) -> dict:
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
        row["refined"] = {"A": f.refined.A if a.identified else None, "B": f.refined.B, "C_mid": f.refined.C_mid, "sse": f.refined.sse,
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


def print_table(desc, rows, loo, plots, seeds=None, *, not_fitted=()) -> None:
    print(f"grid: {desc}")
    head = ("run", "n", "A", "A 95% interval", "B", "C_mid", "identified", "forecast error / floor", "dA(half)")
    table = [head]
    notes = []
    for r in rows:
        ex = r.get("holdout")
        later = (ex or {}).get("later") or {}
        a = num(r["A"], ".3f") if r["identified"] else "not identified"
        table.append((
            r["run"], str(r["n_points"]), a, f"{r['A_interval'][0]:.3f}..{r['A_interval'][1]:.3f}",
            num(r["B"], ".3f"), num(r["C_mid"], ".4g"),  # as report.md: the fit's B and C_mid, identified or not
            "yes" if r["identified"] else "NO",
            (f"{later['mae']:.4f} / {later['noise_floor']:.4f} = {later['ratio']:.1f}x"
             + ("" if later["forecast"] else " (unvetted)")) if later else "-",
            num(ex["delta_A"], "+.3f") if ex else "-",
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
            a_text = "A not identified" if q["A"] is None else f"A={q['A']:.4f}"
            notes.append(f"{r['run']}: continuous refit {a_text} B={q['B']:.3f} C_mid={q['C_mid']:.4g}"
                         + (" (differs from the grid optimum)" if q["differs"] else ""))
        if ex:
            notes.append(f"{r['run']}: fit on compute <= {compact(ex['split_compute'])} (the first "
                         f"{ex['fraction']:g}): {ex['verdict']}"
                         + ("" if ex["identified"] else "; no forecast (the error shown is the unvetted fit's)"))
        for key in ("holdout_note", "forecast_note"):
            if key in r:
                notes.append(f"{r['run']}: {r[key]}")
        notes.append(f"{r['run']}: R0={r['R0']:.4f} ({r['r0_source']}); {r['verdict']}")
    for r in not_fitted:
        table.append((r["run"], "-", "not fitted", "-", "-", "-", "NO", "-", "-"))
        notes.append(f"{r['run']}: not fitted: {r['error']}")
    widths = [max(len(str(row[k])) for row in table) for k in range(len(head))]
    for k, row in enumerate(table):
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    for n in notes:
        print("  " + n)
    if seeds is not None:
        per = ", ".join(f"{name} {'not identified' if a is None else format(a, '.3f')}"
                        for name, a in zip(seeds["runs"], seeds["per_seed_A"]))
        n_ident = sum(a is not None for a in seeds["per_seed_A"])
        half = (f"half-range {seeds['half_range_A']:.4f} (paper: <= 0.015, margin {seeds['seed_margin_A']:g})"
                if seeds["half_range_A"] is not None else
                f"no half-range: A identified for {n_ident} of {len(seeds['per_seed_A'])} runs (needs 2)")
        print(f"seeds of one config: A per seed: {per}; {half}; seed-bootstrap interval of the pooled fit's A "
              f"{seeds['A'][0]:.3f}..{seeds['A'][1]:.3f} (n={seeds['n_ok']})")
    for r in rows:
        print_forecast(r)
    if loo is not None:
        print_loo(loo)
    for p in plots:
        print(f"wrote {p}")


MAX_FORECAST_ROWS = 12
"""Forecast rows shown per run in the table (evenly spaced, the last always); --json has every row."""


def print_forecast(row: dict) -> None:
    """A run's forecast rows: the expected reward with its 95% band (and the observed point where there is one)."""
    rows = row.get("forecast") or []
    if not rows:
        return
    shown = rows if len(rows) <= MAX_FORECAST_ROWS else [
        rows[int(round(k * (len(rows) - 1) / (MAX_FORECAST_ROWS - 1)))] for k in range(MAX_FORECAST_ROWS)]
    kind = "" if row["identified"] else " (A not identified: the band spans what the data allow)"
    print(f"forecast for {row['run']}{kind}: expected reward, 95% band"
          + (f" ({len(shown)} of {len(rows)} rows; --json has all)" if len(shown) < len(rows) else ""))
    table = [("compute", "reward", "95% band", "observed")]
    for f in shown:
        obs = f"{f['observed']:.4f}" if "observed" in f else "-"
        table.append((compact(f["compute"]), f"{f['reward']:.4f}", f"{f['lo']:.4f}..{f['hi']:.4f}", obs))
    widths = [max(len(t[k]) for t in table) for k in range(4)]
    for k, t in enumerate(table):
        print("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))
