"""One-off design check (reproduction/design/README.md, "Why the first half cannot pin A"): does averaging a
setting's 3 seeds, which cuts each validation point's binomial SE by sqrt(3), let Eq. 1 identify A from the
first half of the compute, or from the whole run?

    PYTHONPATH=$PWD .venv/bin/python reproduction/design/seed_mean_fit.py

For every setting of reproduction/repro3/runs, the seeds' pass rates are pooled at the compute values all of
them share (sample-weighted: the pooled point counts every seed's validation samples), then judged by the
project's rule exactly as a single run is (`reproduce2_report.half_fit` and `identify.assess`). "ref+control"
pools the reference with its same-maths control (6 runs of one recipe; a seed's two runs share their warm start
and data order, so the pool is less than 6 independent runs). Prints one block per setting.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from scalerl_mega.reproduce2_report import half_fit, read_run
from scalerl_mega.scaling.identify import assess, options_for, verdict_text

RUNS = Path(__file__).resolve().parents[1] / "repro3" / "runs"


def pooled(run_dirs: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, pooled pass rate, pooled samples) at the compute values present in every run."""
    series = [read_run(d) for d in run_dirs]
    common = sorted(set.intersection(*(set(c.tolist()) for c, _, _ in series)))
    rates, counts = [], []
    for c, r, n in series:
        at = dict(zip(c.tolist(), zip(r.tolist(), np.broadcast_to(n, c.shape).tolist())))
        rates.append([at[x][0] for x in common])
        counts.append([at[x][1] for x in common])
    r_SP, n_SP = np.asarray(rates), np.asarray(counts)
    return np.asarray(common), (r_SP * n_SP).sum(0) / n_SP.sum(0), n_SP.sum(0)


def main() -> None:
    settings = sorted(p.name for p in RUNS.iterdir() if p.is_dir())
    groups = {s: sorted((RUNS / s).glob("seed*")) for s in settings}
    groups["ref+control"] = groups["scalerl"] + groups["batch_control"]
    for name, dirs in groups.items():
        c, r, n = pooled(dirs)
        half = half_fit(c, r, n)
        whole = assess(c, r, options=options_for(c, grid="relative"), n_samples=n)
        print(f"{name}: {len(dirs)} runs, {c.size} common points, last 3 pooled {np.round(r[-3:], 3).tolist()}")
        print(f"  first half: {half.verdict}; unvetted forecast off by {half.unvetted_mae:.4f} at the last 3 "
              f"points (noise floor {half.noise_floor:.4f})")
        print(f"  whole run:  {verdict_text(whole)}; B {whole.fit.B:.2f}, C_mid {whole.fit.C_mid / 1e3:.1f}k")


if __name__ == "__main__":
    main()
