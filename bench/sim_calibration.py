"""Benchmark: the cluster simulator calibrated on a measured CPU run against that run's idle fractions.

A short real `scalerl-train` run (the demo recipe, 10 RL steps of 16 prompts x 8, PipelineRL-2, Megatron trainer
and HF engine in their own processes) writes per-step timings and engine counters to metrics.jsonl; the simulator
is calibrated on that file alone (`cluster.schedule_calibration.load_calibration`) and simulates 40 steps. Printed per fraction
(trainer idle, generator idle): simulated, measured, their difference, and 3 standard errors of the measured
fraction over the run's steps (how much the measurement itself moves from step to step).

These are wall-clock figures: on a quiet machine the run is trainer-bound (trainer idle ~0.01, generator idle
~0.74, docs/cluster_and_gpu.md); beside other work both fractions move with the load (a generator idle of 0.16
was measured beside a sweep), which is why this is a benchmark and not a test.

    PYTHONPATH=$PWD .venv/bin/python bench/sim_calibration.py [--steps 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def three_se(fractions: list[float]) -> float:
    """3 x the standard error of the mean of per-step fractions."""
    n = len(fractions)
    mean = sum(fractions) / n
    return 3.0 * (sum((f - mean) ** 2 for f in fractions) / (n - 1) / n) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="RL steps of the measured run (>= 3)")
    ap.add_argument("--keep", type=Path, default=None, help="write the run here instead of a temporary directory")
    args = ap.parse_args()
    if args.steps < 3:
        raise SystemExit(f"--steps {args.steps}: need >= 3 (the calibration skips the first step)")
    from scalerl_mega.cluster.schedule_calibration import config_from_calibration, load_calibration, trainer_busy_s
    from scalerl_mega.cluster.schedule_sim import simulate

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp) / "run"
        cmd = [sys.executable, "-m", "scalerl_mega.train", "experiment=demo", "sft.steps=0", "filter=none",
               f"train.steps={args.steps}", "train.prompts_per_step=16", "train.generations_per_prompt=8",
               "train.val_every=0", "train.save_every=0", "data.val_prompts=8", "data.synthetic_num_prompts=400",
               "metrics.tensorboard=false", f"output_dir={out}"]
        print("run:", " ".join(cmd[1:]), flush=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"scalerl-train failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["kind"] == "train"][1:]  # the calibration skips the first step
        cal = load_calibration(str(out / "metrics.jsonl"))
    result = simulate(config_from_calibration(cal, steps=40, warmup_steps=8, seed=0))
    rows = {"trainer idle": (result.trainer_idle_fraction, cal["measured"]["trainer_idle_fraction"],
                             three_se([1 - trainer_busy_s(r) / r["timing/step_wall_s"] for r in steps])),
            "generator idle": (result.generator_idle_fraction, cal["measured"]["generator_idle_fraction"],
                               three_se([1 - r["gen/busy_s"] / r["timing/step_wall_s"] for r in steps]))}
    print(f"calibration: { {k: v for k, v in cal.items() if k not in ('gen_lengths', 'measured')} }")
    print(f"{'fraction':<16}{'simulated':>10}{'measured':>10}{'difference':>12}{'3 SE':>8}")
    for name, (sim, meas, noise) in rows.items():
        print(f"{name:<16}{sim:>10.4f}{meas:>10.4f}{sim - meas:>+12.4f}{noise:>8.4f}")


if __name__ == "__main__":
    main()
