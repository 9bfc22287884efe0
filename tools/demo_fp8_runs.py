"""Summarise finished `experiment=demo rollout.quantization=fp8` runs into the JSON and plot the docs' FP8-demo figures
are checked against (docs/demo_fp8_runs.json, docs/demo_fp8_runs.png; tests/unit/test_demo_fp8_doc.py):

    .venv/bin/python tools/demo_fp8_runs.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a finished `nice -n 5 scalerl-train experiment=demo rollout.quantization=fp8 seed=S output_dir=RUN_DIR
[loss.is_correction=...]` run, made on a committed tree, with a `launch.json` its launcher wrote ({"commit",
"launched_unix", "finished_unix", "load_before", "load_after", "exit_status"}; the machine is shared, so the 1-minute
load average is recorded). Per run: the first / last / peak validation pass rate and the wall times
(tools/demo_summary.py), every validation's step, pass rate and seconds since the launch, the run's
`loss.is_correction`, and its mismatch figures (scalerl_mega/metrics/mismatch.py: KL and |log-ratio| on on-policy
tokens and over all trained tokens, the loss's truncation share, the correction's share, bytes per push). No figure
is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "nice -n 5 scalerl-train experiment=demo rollout.quantization=fp8 seed=<S> output_dir=<run dir>"


def summarise(run_dir: Path) -> dict:
    import yaml

    from demo_multiturn_runs import validation_times
    from demo_summary import summarise as demo_summary

    from scalerl_mega.metrics.mismatch import mismatch_summary

    launch = json.loads((run_dir / "launch.json").read_text())
    cfg = yaml.safe_load((run_dir / "run_config.yaml").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = validation_times((run_dir / "train.log").read_text(), start=launch["launched_unix"])
    base = demo_summary(run_dir)
    return {
        **{k: base[k] for k in ("seed", "first", "last", "peak", "peak_step", "wall_s", "sft_s", "rl_s", "rl_steps")},
        "run": run_dir.name, "commit": launch["commit"], "exit_status": launch["exit_status"],
        "quantization": cfg["rollout"]["quantization"], "is_correction": cfg["loss"]["is_correction"],
        "gain": round(base["last"] - base["first"], 4), "load_before": launch["load_before"],
        "load_after": launch["load_after"], "launch_to_exit_s": round(launch["finished_unix"] - launch["launched_unix"], 1),
        "mismatch": mismatch_summary([r for r in rows if r["kind"] == "train"]),
        "validations": [{"step": r["step"], "wall_s": times.get(r["step"]), "pass_rate": r["val_pass_rate"]}
                        for r in rows if r["kind"] == "validation"],
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from demo_multiturn_runs import save_figure

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for r in runs:
        label = f"seed {r['seed']}" + ("" if r["is_correction"] == "none" else f", {r['is_correction']}")
        ax.plot([p["step"] for p in r["validations"]], [p["pass_rate"] for p in r["validations"]], marker="o",
                ls="-" if r["is_correction"] == "none" else "--", label=label)
    ax.set(xlabel="RL step", ylabel="validation pass rate", title="experiment=demo rollout.quantization=fp8")
    save_figure(fig, [ax], path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=ROOT / "docs/demo_fp8_runs.json")
    p.add_argument("--png", type=Path, default=ROOT / "docs/demo_fp8_runs.png")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tools"))
    runs = [summarise(r) for r in args.runs]
    doc = {"command": COMMAND, "machine": "2 CPU cores shared with other developers' jobs (load average recorded per run)",
           "runs": runs}
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    plot(runs, args.png)
    print(json.dumps([{k: r[k] for k in ("seed", "is_correction", "first", "last", "gain", "wall_s")} for r in runs]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
