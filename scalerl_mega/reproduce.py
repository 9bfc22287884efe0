"""`make reproduce`: the paper's leave-one-out experiment (Sec. 6, Fig. 7) at toy scale on the CPU demo.

    python -m scalerl_mega.reproduce sweep   [--sweep-dir outputs/reproduce] [--seeds 0,1,2] [--recipes ...]
    python -m scalerl_mega.reproduce analyse [--sweep repro|repro3] [--sweep-dir D] [--out D] [--no-collect]

`sweep` runs one Hydra multirun over the `conf/experiment/repro_*.yaml` overlays x seeds (seed-major: an
interrupted sweep has whole seeds) with `hydra/sweeper=skip_done`, so re-running it continues where it
stopped (finished points are skipped, an unfinished one resumes from its checkpoint). Every invocation
appends a line to `<sweep-dir>/provenance.jsonl`: the exact command, the git commit and whether the tree
was dirty, start and end times, exit status.

`analyse` copies each finished run's `metrics.jsonl` (gzipped for repro3: `metrics.jsonl.gz`) and `summary.json`
into `<out>/runs/<recipe>/seed<N>/` (`--no-collect`: analyse what is already there, e.g. the committed data), fits them with the project's
scaling tools and writes `<out>/fits.json`, `<out>/results.json`, plots and the generated section of
`<out>/README.md` (reproduction/README.md describes the method and the verdict rules).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from scalerl_mega.reproduce2_report import REPRO3_RUN_NAMES
from scalerl_mega.reproduce_report import RECIPE_RUN_NAMES, analyse, run_finished

SWEEPS = {"repro": (RECIPE_RUN_NAMES, "outputs/reproduce", "reproduction"),
          "repro3": (REPRO3_RUN_NAMES, "outputs/reproduce3", "reproduction/repro3")}
"""`--sweep` name -> (its `experiment=` overlays, its default sweep directory, its analysis directory)."""


def sweep_command(*, sweep_dir: str, seeds: str, recipes: str, extra: list[str] | None = None) -> list[str]:
    """The Hydra multirun of the sweep: seed-major, skip-done, fixed point directories
    `<sweep_dir>/<run_name>/seed<N>` (so a second invocation finds the finished ones), one warm start
    shared by every point in `<sweep_dir>/sft` (`sft.checkpoint`, `sft.any_seed` in the overlays)."""
    return [sys.executable, "-m", "scalerl_mega.train", "-m", f"seed={seeds}", f"experiment={recipes}",
            "hydra/sweeper=skip_done", "hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${run_name}/seed${seed}", f"sft.checkpoint={sweep_dir}/sft",
            *(extra or [])]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def finished_runs(sweep_dir: Path) -> list[Path]:
    """The point directories `<sweep_dir>/<run_name>/seed<N>` whose run finished (`reproduce_report.run_finished`:
    a preempted run's summary.json does not count)."""
    return sorted(p.parent for p in sweep_dir.glob("*/seed*/summary.json") if run_finished(p.parent))


def stamp_runs(sweep_dir: Path, record: dict) -> list[Path]:
    """Write `provenance.json` (this invocation's commit, dirty flag, command, times) into every finished
    run directory that has none yet: the invocation that finished a run is the one recorded (a run resumed
    across invocations lists every invocation in `<sweep_dir>/provenance.jsonl`)."""
    stamped = []
    for run in finished_runs(sweep_dir):
        path = run / "provenance.json"
        if not path.exists():
            path.write_text(json.dumps(record, indent=1) + "\n")
            stamped.append(run)
    return stamped


def run_sweep(args: argparse.Namespace) -> int:
    recipes_default, dir_default, _ = SWEEPS[args.sweep]
    sweep_dir = Path(args.sweep_dir or dir_default)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    recipes = args.recipes or ",".join(recipes_default)
    cmd = sweep_command(sweep_dir=str(sweep_dir), seeds=args.seeds, recipes=recipes, extra=args.overrides)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    record = {"started": _stamp(), "commit": _git("rev-parse", "HEAD") or None,
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "command": " ".join(["OMP_NUM_THREADS=" + env["OMP_NUM_THREADS"], "python", *cmd[1:]])}
    t0 = time.monotonic()
    rc = subprocess.call(cmd, env=env)
    record.update(finished=_stamp(), wall_s=round(time.monotonic() - t0, 1), rc=rc)
    stamp_runs(sweep_dir, {k: record[k] for k in ("commit", "dirty", "command", "started", "finished")})
    with open(sweep_dir / "provenance.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scalerl_mega.reproduce", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="run (or continue) the leave-one-out sweep")
    s.add_argument("--sweep", choices=sorted(SWEEPS), default="repro",
                   help="repro: the leave-one-out sweep; repro3: issue 29's (reproduction/design/README.md)")
    s.add_argument("--sweep-dir", default=None, help="default: the --sweep's own (outputs/reproduce[3])")
    s.add_argument("--seeds", default="0,1,2")
    s.add_argument("--recipes", default=None, help="comma-separated experiment= overlays (default: the --sweep's)")
    s.add_argument("overrides", nargs="*", help="extra Hydra overrides for every point")
    a = sub.add_parser("analyse", help="collect the finished runs, fit, compare, write reproduction/")
    a.add_argument("--sweep", choices=sorted(SWEEPS), default="repro",
                   help="repro: the leave-one-out sweep; repro3: issue 29's")
    a.add_argument("--sweep-dir", default=None, help="default: the --sweep's own (outputs/reproduce[3])")
    a.add_argument("--out", default=None, help="default: the --sweep's own (reproduction, reproduction/repro3)")
    a.add_argument("--no-collect", action="store_true", help="analyse <out>/runs as it is (the committed runs)")
    args = p.parse_args(argv)
    if args.cmd == "sweep":
        return run_sweep(args)
    _, sweep_default, out_default = SWEEPS[args.sweep]
    sweep_dir = None if args.no_collect else Path(args.sweep_dir or sweep_default)
    try:
        if args.sweep == "repro3":
            from scalerl_mega.reproduce2_analyse import analyse2

            analyse2(sweep_dir=sweep_dir, out_dir=Path(args.out or out_default))
        else:
            analyse(sweep_dir=sweep_dir, out_dir=Path(args.out or out_default))
    except ValueError as e:
        print(f"reproduce analyse: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
