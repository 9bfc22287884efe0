"""Benchmark: the paper's grid fit (7,100 curve_fit calls) vs the exact vectorised `fast` method.

Run: .venv/bin/python bench/fit.py [--accuracy]
Prints, for a 100-point and a 1000-point ScaleRL-like series (A=0.610, B=1.92, C_mid=2542, noise 0.0075):
wall time of each method (best of `--repeat` for fast), the speed-up, and whether both return the same cell.
`--accuracy` also prints recovery rates of the six paper runs over 40 seeds (fast == grid cell; see tests).
Target (issue 4): >= 50x faster with the same optimum.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from scalerl_mega.scaling.fit import fit_sigmoid, sigmoid_law

PAPER_RUNS = {
    "scalerl": (2542.0, 1.92, 0.610), "32k": (11272.0, 1.89, 0.645), "8gen": (2542.0, 2.44, 0.585),
    "scout": (4242.0, 1.65, 0.710), "bs2048": (10909.0, 1.70, 0.645), "mathcode_code": (1675.0, 1.09, 0.615),
}


def series(n: int, *, seed: int = 0, noise: float = 0.0075):
    cm, B, A = PAPER_RUNS["scalerl"]
    C = np.linspace(0.0, 5 * cm, n)
    rng = np.random.default_rng(seed)
    return C, sigmoid_law(C, A=A, B=B, C_mid=cm, R0=0.3) + rng.normal(0.0, noise, n)


def speed(repeat: int) -> bool:
    fit_sigmoid(*series(50), r0=0.3, method="fast")  # warm imports
    ok_all = True
    print(f"{'points':>6}  {'grid s':>8}  {'fast s':>8}  {'speed-up':>8}  same cell  grid (A, C_mid, B)  fast B")
    for n in (100, 1000):
        C, R = series(n)
        t0 = time.perf_counter()
        g = fit_sigmoid(C, R, r0=0.3, method="grid")
        t_grid = time.perf_counter() - t0
        t_fast = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            f = fit_sigmoid(C, R, r0=0.3, method="fast")
            t_fast = min(t_fast, time.perf_counter() - t0)
        same = (g.A, g.C_mid) == (f.A, f.C_mid)
        ok_all &= same
        print(f"{n:>6}  {t_grid:>8.3f}  {t_fast:>8.4f}  {t_grid / t_fast:>7.1f}x  {str(same):>9}  "
              f"({g.A:.3f}, {g.C_mid:.0f}, {g.B:.4f})  {f.B:.4f}")
    return ok_all


def forecast_speed() -> None:
    """Live forecast (relative grids, 200 x 200 cells) on a tiny device-hour run: time per refit."""
    from scalerl_mega.scaling.forecast import forecast

    forecast([0.0, 0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.35, 0.37], budget=1.0)  # warm-up
    C = np.linspace(0.0, 1.25, 60)
    R = sigmoid_law(C, A=0.72, B=1.6, C_mid=0.25, R0=0.1) + np.random.default_rng(0).normal(0.0, 0.005, C.size)
    for n in (20, 60):
        t0, p0 = time.perf_counter(), time.process_time()
        f = forecast(C[:n], R[:n], budget=2.0)
        dt, dp = time.perf_counter() - t0, time.process_time() - p0
        print(f"forecast on {n} points: {dt * 1000:.1f} ms wall, {dp * 1000:.1f} ms CPU  A={f.A:.3f} C_mid={f.C_mid:.3g} "
              f"identified={f.identified} predicted@budget={f.predicted_reward_at_budget:.3f}")


def accuracy(seeds: int = 40) -> None:
    print(f"\nrecovery over {seeds} seeds (fast method; paper grid; 101 points up to 5 x C_mid; fit_from 1500; "
          "R0 given): fraction with |A-A*|<=0.02, B and C_mid within 10% (grid optimum / continuous refit)")
    for noise in (0.005, 0.0075, 0.01):
        cells = []
        for name, (cm, B, A) in PAPER_RUNS.items():
            ok = rok = 0
            for seed in range(seeds):
                rng = np.random.default_rng(seed)
                C = np.linspace(0.0, 5 * cm, 101)
                R = sigmoid_law(C, A=A, B=B, C_mid=cm, R0=0.3) + rng.normal(0.0, noise, C.size)
                f = fit_sigmoid(C, R, r0=0.3, method="fast", refine=True)
                ok += abs(f.A - A) <= 0.02 and abs(f.B - B) <= 0.1 * B and abs(f.C_mid - cm) <= 0.1 * cm
                q = f.refined
                rok += abs(q.A - A) <= 0.02 and abs(q.B - B) <= 0.1 * B and abs(q.C_mid - cm) <= 0.1 * cm
            cells.append(f"{name} {ok / seeds:.2f}/{rok / seeds:.2f}")
        print(f"  noise {noise}: " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--accuracy", action="store_true")
    args = ap.parse_args()
    same = speed(args.repeat)
    forecast_speed()
    if args.accuracy:
        accuracy()
    if not same:
        raise SystemExit("grid and fast disagree on the optimum cell")


if __name__ == "__main__":
    main()
