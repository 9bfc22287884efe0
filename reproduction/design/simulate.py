"""Design simulation for issue 29: how often does the identification rule (scalerl_mega.scaling.identify,
docs/forecast_identification.md) pin Eq. 1's A at a candidate CPU sweep design?

Synthetic validation curves follow Eq. 1 (paper Sec. 2.1) on the step axis,
    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B),
with binomial noise of N = val_prompts x val_samples samples per point (each point's mean pass rate is
Binomial(N, R)/N: independent samples, which understates prompt-level correlation; see reproduction/design/README.md). Each
simulated run is assessed exactly as report.py does (relative grid, 10% cut, n_samples=N). Reported per
design and truth: P(identified) and P(identified and |A_hat - A| > 0.02) (a confidently wrong A).

Usage: python reproduction/design/simulate.py [--reps 10] [--set main|slow|pilot|repro3|shallow|measured] [--out reproduction/design]
Writes sim[_slow|_pilot|_repro3|_shallow|_measured].json and .png into --out; each row also gives P(half identified): the first half
of the run on its own (the forecast's precondition, reproduce2_report.half_fit). Pure CPU, a few minutes at the defaults.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from scalerl_mega.scaling.fit import sigmoid_law
from scalerl_mega.scaling.identify import assess, options_for

# (name, steps, val_every, N samples per point)
DESIGNS = [
    ("old: 50 steps, val/5, 100x4", 50, 5, 400),
    ("800 steps, val/20, 100x4", 800, 20, 400),
    ("800 steps, val/20, 200x8", 800, 20, 1600),
    ("1200 steps, val/30, 200x8", 1200, 30, 1600),
]
# Follow-up (`--set slow`): for a shallow curve (B = 1.5) that the designs above rarely identify, does more
# validation (denser points or more samples) help, or only a longer run?
SLOW_DESIGNS = [
    ("800 steps, val/10, 200x8", 800, 10, 1600),
    ("800 steps, val/20, 400x8", 800, 20, 3200),
    ("1600 steps, val/40, 200x8", 1600, 40, 1600),
]
SLOW_TRUTHS = [dict(R0=0.30, A=0.70, B=1.5, C_mid=150.0)]
# After the pilot (`--set pilot`, README "Pilot and profile"): the observed shape (low A, early C_mid) with the
# observed point-to-point scatter: binomial alone vs binomial plus policy noise of SD 0.035 (~3x the binomial SE).
PILOT_DESIGNS = [
    ("800 steps, val/20, 200x8", 800, 20, 1600, 0.0),
    ("800 steps, val/20, 200x8, +policy noise", 800, 20, 1600, 0.035),
    ("1600 steps, val/20, 200x8, +policy noise", 1600, 20, 1600, 0.035),
]
PILOT_TRUTHS = [dict(R0=0.20, A=0.42, B=2.0, C_mid=40.0)]
# The repro3 design (`--set repro3`, reproduction/design/README.md): window validation leaves ~1.5x the binomial
# scatter (extra SD 0.013 on top of N = 1,600); the reference run's first 280 steps (R0 0.07, a slow start, ~0.45
# by step 200) bracket the truth between a steep and a shallow sigmoid.
REPRO3_DESIGNS = [
    ("800 steps, window/20, 200x8", 800, 20, 1600, 0.013),
    ("1600 steps, window/20, 200x8", 1600, 20, 1600, 0.013),
]
REPRO3_TRUTHS = [dict(R0=0.07, A=0.62, B=2.0, C_mid=110.0), dict(R0=0.07, A=0.62, B=1.5, C_mid=130.0),
                 dict(R0=0.07, A=0.65, B=1.0, C_mid=150.0)]
# The toy's measured shape (`--set shallow`, reproduction/design/README.md "Why the first half cannot pin A"):
# every pilot and finished run of the task family fits B 0.3-1.0 (ref seed 0: 0.38 over 1,600 steps and 0.83
# over its first 220; batch_large seed 0: 0.99; pilot b before its pool drained: 0.86-0.90) with C_mid ~75
# reference steps (~19k samples). How long must a run be for its first half to pin A?
SHALLOW_DESIGNS = [
    ("1600 steps, window/20, 200x8", 1600, 20, 1600, 0.013),
    ("3200 steps, window/40, 200x8", 3200, 40, 1600, 0.013),
    ("6400 steps, window/80, 200x8", 6400, 80, 1600, 0.013),
]
SHALLOW_TRUTHS = [dict(R0=0.085, A=0.65, B=0.8, C_mid=75.0), dict(R0=0.085, A=0.65, B=1.0, C_mid=75.0)]
# The finished sweep's shape (`--set measured`, reproduction/design/README.md "Pooling the seeds"): its five
# identified runs fit A 0.610-0.635, B 1.19-1.48, C_mid 27-38k samples (~113 reference steps of 256 samples),
# R0 ~0.09. How long would a reference run at that shape have to be for its first half to pin A?
MEASURED_DESIGNS = [
    ("1600 steps, window/20, 200x8", 1600, 20, 1600, 0.013),
    ("3200 steps, window/40, 200x8", 3200, 40, 1600, 0.013),
    ("6400 steps, window/80, 200x8", 6400, 80, 1600, 0.013),
    ("12800 steps, window/160, 200x8", 12800, 160, 1600, 0.013),
    ("3200 steps, window/20, 200x8", 3200, 20, 1600, 0.013),   # the same validation share of each step
    ("6400 steps, window/20, 200x8", 6400, 20, 1600, 0.013),
]
MEASURED_TRUTHS = [dict(R0=0.09, A=0.62, B=1.2, C_mid=113.0), dict(R0=0.09, A=0.62, B=1.45, C_mid=113.0)]
# Truths: R0 = start pass rate, A = ceiling, B = steepness, C_mid in steps.
TRUTHS = [
    dict(R0=0.30, A=0.70, B=1.5, C_mid=150.0),
    dict(R0=0.30, A=0.70, B=1.5, C_mid=300.0),
    dict(R0=0.30, A=0.85, B=2.5, C_mid=200.0),
]


def simulate(*, steps: int, val_every: int, n: int, truth: dict, reps: int, rng: np.random.Generator,
             extra_sd: float = 0.0) -> dict:
    """`extra_sd`: Gaussian noise added to each point on top of the binomial (the policy moving between
    validations); the rule is still told only the binomial N, as it is for a real run."""
    c = np.arange(0, steps + 1, val_every, dtype=np.float64)
    p = sigmoid_law(np.maximum(c, 1e-9), A=truth["A"], B=truth["B"], C_mid=truth["C_mid"], R0=truth["R0"])
    p[0] = truth["R0"]
    ident = wrong = half_ident = half_wrong = 0
    errs = []
    first = c <= 0.5 * c.max()
    for _ in range(reps):
        r = rng.binomial(n, p) / n + (rng.normal(0.0, extra_sd, p.shape) if extra_sd else 0.0)
        try:
            a = assess(c, r, options=options_for(c, grid="relative"), n_samples=n)
            h = assess(c[first], r[first], options=options_for(c[first], grid="relative"), n_samples=n)
        except ValueError:
            continue
        if a.identified:
            ident += 1
            errs.append(abs(a.A - truth["A"]))
            wrong += abs(a.A - truth["A"]) > 0.02
        if h.identified:  # the first half on its own (reproduce2_report.half_fit): the forecast's precondition
            half_ident += 1
            half_wrong += abs(h.A - truth["A"]) > 0.02
    return {"p_identified": ident / reps, "p_wrong_and_identified": wrong / reps,
            "p_half_identified": half_ident / reps, "p_half_wrong_and_identified": half_wrong / reps,
            "median_abs_err_identified": float(np.median(errs)) if errs else None,
            "points_after_cut": int((c >= 0.1 * c.max()).sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", choices=["main", "slow", "pilot", "repro3", "shallow", "measured"], default="main")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    designs, truths = {"main": (DESIGNS, TRUTHS), "slow": (SLOW_DESIGNS, SLOW_TRUTHS),
                       "pilot": (PILOT_DESIGNS, PILOT_TRUTHS), "repro3": (REPRO3_DESIGNS, REPRO3_TRUTHS),
                       "shallow": (SHALLOW_DESIGNS, SHALLOW_TRUTHS),
                       "measured": (MEASURED_DESIGNS, MEASURED_TRUTHS)}[args.set]
    designs = [d if len(d) == 5 else (*d, 0.0) for d in designs]
    suffix = "" if args.set == "main" else f"_{args.set}"
    rows = []
    t0 = time.perf_counter()
    for name, steps, every, n, extra in designs:
        for truth in truths:
            res = simulate(steps=steps, val_every=every, n=n, truth=truth, reps=args.reps, rng=rng, extra_sd=extra)
            rows.append({"design": name, "steps": steps, "val_every": every, "n": n, "extra_sd": extra,
                         "truth": truth, **res})
            print(f"{name:32s} A={truth['A']:.2f} B={truth['B']:.1f} C_mid={truth['C_mid']:5.0f} "
                  f"pts={res['points_after_cut']:3d} P(id)={res['p_identified']:.2f} "
                  f"P(id & |err|>0.02)={res['p_wrong_and_identified']:.2f} "
                  f"P(half id)={res['p_half_identified']:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"sim{suffix}.json").write_text(json.dumps({"reps": args.reps, "seed": args.seed, "rows": rows,
                                                   "cpu_seconds": time.perf_counter() - t0}, indent=1) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / len(truths)
    for j, truth in enumerate(truths):
        ys = [r["p_identified"] for r in rows if r["truth"] is truth]
        ax.bar(np.arange(len(designs)) + j * w, ys, w,
               label=f"A={truth['A']} B={truth['B']} C_mid={truth['C_mid']:.0f}")
    ax.set_xticks(np.arange(len(designs)) + 0.4 - w / 2, [d[0] for d in designs], rotation=15, fontsize=7)
    ax.set_ylabel("P(A identified)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / f"sim{suffix}.png", dpi=110)


if __name__ == "__main__":
    main()
