"""Compare the reference recipe's runs by engine setup, from the committed run data alone.

Prints, per run of repro6 (one engine of 256 rows), repro6_fast (two engines of 256 rows each) and repro6_twin (two
engines of 128 rows each): the mean token lag behind the trainer (`token_lag_mean`), the groups kept per step
(`filter/prompts_kept`) and the pre-clip gradient norm (`train/grad_norm`) over steps 800-1,600, the mean
validation pass rate per window of steps (points by `val_center_step`), the lowest point after step 800, the mean
step time and the run's wall-clock minutes (from its provenance segments).

    PYTHONPATH=$PWD .venv/bin/python reproduction/repro6_twin/compare.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scalerl_mega.metrics.writer import read_metrics
from scalerl_mega.scaling.io import run_metrics_file

HERE = Path(__file__).resolve().parent
REPRO = HERE.parent
SETUPS = (("one engine, 256 rows", REPRO / "repro6" / "runs" / "scalerl"),
          ("two engines, 256 rows each", REPRO / "repro6_fast" / "runs" / "fast"),
          ("two engines, 128 rows each", REPRO / "repro6_twin" / "runs" / "twin"))
WINDOWS = ((0, 400), (400, 800), (800, 1600), (1600, 2400), (2400, 3200), (3200, 4800), (4800, 5600), (5600, 6400))
"""Validation windows (by the point's centre step, half-open on the left)."""
TRAIN_SPAN = (800, 1600)
"""Steps whose training records are averaged (the middle of the run, where the setups differed)."""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def run_row(run: Path) -> dict:
    """The comparison's figures for one committed run directory (its metrics file: `run_metrics_file`)."""
    recs = read_metrics(run_metrics_file(run))
    train = [r for r in recs if r.get("kind") == "train"]
    val = [r for r in recs if r.get("kind") == "validation" and "val_pass_rate" in r]
    mid = [r for r in train if TRAIN_SPAN[0] < r["step"] <= TRAIN_SPAN[1]]

    def centre(r: dict) -> float:
        return float(r.get("val_center_step", r["step"]))

    windows = [_mean([r["val_pass_rate"] for r in val if lo < centre(r) <= hi]) for lo, hi in WINDOWS]
    prov = json.loads((run / "provenance.json").read_text()) if (run / "provenance.json").is_file() else {}
    wall_s = sum(float(s.get("wall_s", 0.0)) for s in prov.get("segments", []))
    return {"run": f"{run.parent.name}/{run.name}", "steps": max((r["step"] for r in train), default=0),
            "token_lag": _mean([r["token_lag_mean"] for r in mid if "token_lag_mean" in r]),
            "kept": _mean([r["filter/prompts_kept"] for r in mid if "filter/prompts_kept" in r]),
            "grad_norm": _mean([r["train/grad_norm"] for r in mid if "train/grad_norm" in r]),
            "windows": windows, "min_after_800": min((r["val_pass_rate"] for r in val if centre(r) > 800),
                                                     default=float("nan")),
            "step_s": _mean([r["timing/step_wall_s"] for r in train if "timing/step_wall_s" in r]),
            "wall_min": wall_s / 60.0}


def main() -> int:
    head = ["setup", "run", "steps", "minutes", "step s", f"token lag {TRAIN_SPAN[0]}-{TRAIN_SPAN[1]}", "kept",
            "grad norm", *[f"val {lo}-{hi}" for lo, hi in WINDOWS], "min after 800"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for setup, root in SETUPS:
        for run in sorted(root.glob("seed*")) if root.is_dir() else []:
            if run_metrics_file(run) is None:
                continue
            r = run_row(run)
            cells = [setup, r["run"], str(r["steps"]), f"{r['wall_min']:.1f}", f"{r['step_s']:.3f}",
                     f"{r['token_lag']:.2f}", f"{r['kept']:.2f}", f"{r['grad_norm']:.2f}",
                     *[f"{w:.3f}" for w in r["windows"]], f"{r['min_after_800']:.3f}"]
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
