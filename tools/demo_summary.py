"""Summarise finished `make demo` runs (same seed, run one after another) into the JSON the README's demo line
is checked against (docs/demo_runs.json; tests/unit/test_demo_runs_doc.py).

    .venv/bin/python tools/demo_summary.py RUN_DIR [RUN_DIR ...] --commit HASH > docs/demo_runs.json

Per run: the validation pass rate at the first RL validation (step 0), the last (step 80) and the peak, the
run's wall time and its SFT / RL parts (summary.json), and the on-policy engine-vs-trainer |log-ratio| (mean over
every on-policy token of the run, max over its steps; metrics.jsonl). No figure is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def summarise(run_dir: Path) -> dict:
    import yaml

    summary = json.loads((run_dir / "summary.json").read_text())
    seed = yaml.safe_load((run_dir / "run_config.yaml").read_text())["seed"]
    points = summary["val_points"]  # [step, compute, pass rate]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["kind"] == "train" and r.get("train/onpolicy_tokens")]
    tokens = sum(r["train/onpolicy_tokens"] for r in train)
    peak = max(points, key=lambda p: p[2])
    return {
        "run": run_dir.name, "seed": seed, "first": points[0][2], "last": points[-1][2],
        "peak": peak[2], "peak_step": peak[0], "val_steps": [p[0] for p in points],
        "wall_s": round(summary["wall_s"], 1), "sft_s": round(summary["sft_s"], 1), "rl_s": round(summary["rl_s"], 1),
        "rl_steps": summary["steps"],
        "onpolicy_abs_log_ratio_mean": sum(r["train/onpolicy_abs_log_ratio_sum"] for r in train) / tokens,
        "onpolicy_abs_log_ratio_max": max(r["train/onpolicy_abs_log_ratio_max"] for r in train),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--commit", required=True, help="the commit the runs were made at")
    p.add_argument("--command", default="scalerl-train experiment=demo hydra.run.dir=<run dir>")
    args = p.parse_args(argv)
    runs = [summarise(r) for r in args.runs]
    json.dump({"commit": args.commit, "command": args.command, "machine": "2 shared CPU cores, other jobs running",
               "runs": runs}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
