"""Run `experiment=demo_multiturn` for seeds 0, 1, 2 one after another and summarise them into the JSON and plot the
docs' multi-turn demo figures are checked against (docs/demo_multiturn_runs.json, docs/demo_multiturn_runs.png;
tests/unit/test_demo_multiturn_doc.py).

    .venv/bin/python tools/demo_multiturn_runs.py --out outputs/demo_multiturn_runs        # runs, then summarises
    .venv/bin/python tools/demo_multiturn_runs.py --out DIR --summarise-only               # existing run dirs

Each run is `nice -n 5 scalerl-train experiment=demo_multiturn seed=S output_dir=DIR/seedS hydra.run.dir=DIR/seedS`
(the machine is shared: the 1-minute load average from /proc/loadavg is recorded before and after each run). Per
run: every validation's step, its wall time since the launch (train.log's timestamps), its pass rate and its pass
rate by the turn that passed (`episode/pass_at_turn_<t>`, metrics.jsonl); the gain over the first validation, the
time the gain first reached +0.15, the share of the last validation's passes that passed at turn 2 or later,
and the run's wall / SFT / RL seconds (summary.json). The revision is `git describe --always --dirty`. No figure
is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
TARGET_GAIN = 0.15
VAL_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]\[[^]]*\]\[INFO\] - validation step (\d+): ")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def revision() -> str:
    return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def command(seed: int, run_dir: Path) -> list[str]:
    return ["nice", "-n", "5", str(ROOT / ".venv/bin/scalerl-train"), "experiment=demo_multiturn", f"seed={seed}",
            f"output_dir={run_dir}", f"hydra.run.dir={run_dir}"]


def launch(seed: int, run_dir: Path) -> dict:
    """Run one seed to the end; its launch record (time, load before and after, exit status)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = {"seed": seed, "launched_unix": time.time(), "load_before": load_average()}
    with open(run_dir / "console.txt", "w") as out:
        rc = subprocess.run(command(seed, run_dir), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    rec.update(load_after=load_average(), exit_status=rc, finished_unix=time.time())
    (run_dir / "launch.json").write_text(json.dumps(rec) + "\n")
    return rec


def validation_times(log: str, *, start: float) -> dict[int, float]:
    """Step -> seconds since `start` (unix time) of each `validation step N` line of a train.log."""
    out = {}
    for line in log.splitlines():
        m = VAL_LINE.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            out[int(m.group(3))] = round(t - start, 1)
    return out


def summarise(run_dir: Path) -> dict:
    launch_rec = json.loads((run_dir / "launch.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r for r in rows if r["kind"] == "validation"]
    times = validation_times((run_dir / "train.log").read_text(), start=launch_rec["launched_unix"])
    turns = sorted(int(k.rsplit("_", 1)[1]) for k in val[0] if k.startswith("episode/pass_at_turn_"))
    points = [{"step": r["step"], "wall_s": times.get(r["step"]), "pass_rate": r["val_pass_rate"],
               **{f"pass_at_turn_{t}": r[f"episode/pass_at_turn_{t}"] for t in turns}} for r in val]
    first, last = points[0]["pass_rate"], points[-1]["pass_rate"]
    reached = next((p for p in points if p["pass_rate"] - first >= TARGET_GAIN), None)
    later = sum(points[-1][f"pass_at_turn_{t}"] for t in turns if t >= 2)
    return {
        "seed": launch_rec["seed"], "exit_status": launch_rec["exit_status"],
        "load_before": launch_rec["load_before"], "load_after": launch_rec["load_after"],
        "first": first, "last": last, "gain": round(last - first, 4),
        "max_gain": round(max(p["pass_rate"] for p in points) - first, 4),
        "gain_reached_step": reached["step"] if reached else None,
        "gain_reached_wall_s": reached["wall_s"] if reached else None,
        "last_share_of_passes_at_turn_2_or_later": round(later / last, 4) if last else None,
        "wall_s": round(summary["wall_s"], 1), "sft_s": round(summary["sft_s"], 1), "rl_s": round(summary["rl_s"], 1),
        "launch_to_exit_s": round(launch_rec["finished_unix"] - launch_rec["launched_unix"], 1),
        "rl_steps": summary["steps"], "validations": points,
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in runs:
        x = [p["wall_s"] / 60 for p in r["validations"]]
        line, = axes[0].plot(x, [p["pass_rate"] for p in r["validations"]], marker="o", label=f"seed {r['seed']}")
        axes[1].plot([p["step"] for p in r["validations"]], [p["pass_at_turn_2"] for p in r["validations"]],
                     marker="o", color=line.get_color(), label=f"seed {r['seed']}: turn 2")
        axes[1].plot([p["step"] for p in r["validations"]], [p["pass_at_turn_1"] for p in r["validations"]],
                     ls="--", color=line.get_color(), label=f"seed {r['seed']}: turn 1")
    axes[0].set(xlabel="wall time since launch (min)", ylabel="validation pass rate",
                title="experiment=demo_multiturn, 3 seeds")
    axes[1].set(xlabel="RL step", ylabel="share of validation episodes", title="passed at turn 1 / turn 2")
    save_figure(fig, axes, path)


def save_figure(fig, axes, path: Path, *, legend_title: str | None = None) -> None:
    """Grid and legend on every axis, then the PNG the docs show."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title=legend_title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the run directories' parent (DIR/seed0, ...)")
    p.add_argument("--summarise-only", action="store_true", help="summarise existing run directories")
    p.add_argument("--json", type=Path, default=ROOT / "docs/demo_multiturn_runs.json")
    p.add_argument("--png", type=Path, default=ROOT / "docs/demo_multiturn_runs.png")
    args = p.parse_args(argv)
    rev = revision()
    if not args.summarise_only:
        for seed in SEEDS:
            launch(seed, args.out / f"seed{seed}")
        (args.out / "revision.txt").write_text(rev + "\n")
    rev_file = args.out / "revision.txt"
    runs = [summarise(args.out / f"seed{s}") for s in SEEDS]
    doc = {"revision": rev_file.read_text().strip() if rev_file.is_file() else rev,
           "command": " ".join(command(0, Path("<out>/seed<S>"))).replace(str(ROOT) + "/", "").replace("seed=0",
                                                                                                        "seed=<S>"),
           "machine": "2 CPU cores shared with other developers' jobs (load average recorded per run)",
           "target_gain": TARGET_GAIN, "runs": runs}
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    plot(runs, args.png)
    print(json.dumps({r["seed"]: {k: r[k] for k in ("first", "last", "gain", "gain_reached_wall_s",
                                                     "last_share_of_passes_at_turn_2_or_later", "wall_s")}
                      for r in runs}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
