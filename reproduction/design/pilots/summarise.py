"""Print what reproduction/design/README.md quotes from the pilots (issue 29): each pilot's validation points, its
Eq. 1 fit by the identification rule with the overdispersion (residual SD / binomial SE), and per 100 steps the
groups that kept a gradient (zero-variance filter), the gradient norm and the No-Positive-Resampling pool.

    PYTHONPATH=$PWD .venv/bin/python reproduction/design/pilots/summarise.py [pilot ...]
    PYTHONPATH=$PWD .venv/bin/python reproduction/design/pilots/summarise.py reproduction/repro3/runs/scalerl/seed0

Each pilot directory holds the run's `run_config.yaml` (the resolved config it ran with) and its xz-compressed
`metrics.jsonl`; the x axis is cumulative generated samples (thousands), as in the sweep's analysis.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def summarise(name: str) -> None:
    from scalerl_mega.reproduce2_report import overdispersion
    from scalerl_mega.scaling.identify import assess, options_for
    from scalerl_mega.metrics.writer import read_metrics
    from scalerl_mega.scaling.io import read_series, run_metrics_file

    run_dir = Path(name) if Path(name).is_dir() else HERE / name  # a pilot, or a committed sweep run
    metrics = run_metrics_file(run_dir)
    if metrics is None:
        raise SystemExit(f"{run_dir}: no metrics.jsonl(.xz/.gz)")
    rows = read_metrics(metrics)
    s = read_series(metrics, x="sum:samples")
    c, r, n = s.compute / 1e3, s.reward, s.n_samples
    print(f"== {name}: {len(c)} validation points, last step {rows[-1].get('step')}")
    print("   " + " ".join(f"{a:.0f}:{b:.3f}" for a, b in zip(c, r)))
    if len(c) >= 8:
        a = assess(c, r, options=options_for(c, grid="relative"), n_samples=n)
        od = overdispersion(a.fit, c, n)
        print(f"   fit: A {a.fit.A:.3f} (95% {a.A_interval[0]:.3f}..{a.A_interval[1]:.3f}, identified {a.identified}), "
              f"B {a.fit.B:.2f}, C_mid {a.fit.C_mid:.1f}k; residual SD / binomial SE = "
              f"{od['residual_sd']:.4f} / {od['binomial_se']:.4f} = {od['ratio']:.2f}")
    train = [x for x in rows if x.get("kind") == "train"]
    for lo in range(0, len(train), 100):
        seg = train[lo:lo + 100]
        gn = sorted(x["train/grad_norm"] for x in seg if x.get("train/grad_norm"))
        kept = [x.get("filter/prompts_kept", 0.0) for x in seg]
        if gn:
            print(f"   steps {lo + 1}-{lo + len(seg)}: groups kept {statistics.mean(kept):.1f}, grad norm median "
                  f"{statistics.median(gn):.2f} max {gn[-1]:.2f}, pool {seg[-1].get('curriculum/curriculum/active_prompts')}")


def main(argv: list[str]) -> None:
    from scalerl_mega.scaling.io import run_metrics_file

    names = argv or sorted(p.name for p in HERE.iterdir() if p.is_dir() and run_metrics_file(p) is not None)
    for name in names:
        summarise(name)


if __name__ == "__main__":
    main(sys.argv[1:])
