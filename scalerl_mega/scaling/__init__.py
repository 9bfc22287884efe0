"""Compute-scaling curves (paper Eq. 1, Sec. 2.1, App. A.4-A.8): fit, compare, forecast, plot.

Modules (import them directly; nothing heavy is imported here):
- `fit`: the sigmoid law R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), the paper's grid fit (`method="grid"`),
  an exact vectorised equivalent (`method="fast"`), continuous refinement, the power law, the fixed-A
  refit and the LOO log-F transform.
- `compare`: the +-0.02 seed-margin rule on A, fixed-A refits to compare B, bootstrap intervals,
  extrapolation error next to the noise floor.
- `identify`: the one rule for "A is identified" (95% profile interval <= 0.04 wide, enough points after the
  fit cut, hold-out misfit check) used by `scalerl-fit`, the live forecast and report.md.
- `forecast`: the live forecast a training loop calls (numbers in, dataclass out).
- `plot`: the paper's figures (PNG and SVG, matplotlib Agg, no pyplot state).
- `io`: reading metrics.jsonl / CSV / run directories with errors that name the file and line.
- `cli`: the `scalerl-fit` console script.
"""
