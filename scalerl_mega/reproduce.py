"""`make reproduce`: the paper's leave-one-out experiment (Sec. 6, Fig. 7) at toy scale on the CPU demo.

    python -m scalerl_mega.reproduce sweep   [--sweep-dir outputs/reproduce] [--seeds 0,1,2] [--recipes ...]
    python -m scalerl_mega.reproduce analyse [--sweep repro|repro3|repro4] [--sweep-dir D] [--out D] [--no-collect]
    python -m scalerl_mega.reproduce register [--sweep repro4]   (scalerl_mega/reproduce4.py)

`sweep` runs one Hydra multirun over the `conf/experiment/repro_*.yaml` overlays x seeds (seed-major: an
interrupted sweep has whole seeds) with `hydra/sweeper=skip_done`, so re-running it continues where it
stopped (finished points are skipped, an unfinished one resumes from its checkpoint). Every invocation
appends a line to `<sweep-dir>/provenance.jsonl`: the exact command, the git commit and whether the tree
was dirty, start and end times, exit status, and the training steps it added to each point (`progress`), also
when it is stopped by SIGTERM or SIGHUP (forwarded to the training process, which checkpoints and exits; the line
is written after it has). A finished point's `provenance.json` lists every invocation that trained it
(`segments`), so a run resumed across commits says which commit produced which steps.

`analyse` copies each finished run's `metrics.jsonl` (xz-compressed for the repro3-6 sweeps: `metrics.jsonl.xz`) and
`summary.json` into `<out>/runs/<recipe>/seed<N>/` (`--no-collect`: analyse what is already there, e.g. the committed data), fits them with the project's
scaling tools and writes `<out>/fits.json`, `<out>/results.json`, plots and the generated section of
`<out>/README.md` (reproduction/README.md describes the method and the verdict rules).
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

from scalerl_mega.reproduce2_report import REPRO3_RUN_NAMES
from scalerl_mega.reproduce_report import RECIPE_RUN_NAMES, analyse, run_finished

SWEEPS = {"repro": (RECIPE_RUN_NAMES, "outputs/reproduce", "reproduction"),
          "repro3": (REPRO3_RUN_NAMES, "outputs/reproduce3", "reproduction/repro3"),
          "repro4": (("repro4_scalerl",), "outputs/reproduce4", "reproduction/repro4"),
          "repro5": (("repro5_scalerl",), "outputs/reproduce5", "reproduction/repro5"),
          "repro6": (("repro6_scalerl",), "outputs/reproduce6", "reproduction/repro6"),
          "repro6_fast": (("repro6_fast",), "outputs/reproduce6", "reproduction/repro6_fast"),
          "repro6_twin": (("repro6_twin",), "outputs/reproduce6", "reproduction/repro6_twin")}
"""`--sweep` name -> (its `experiment=` overlays, its default sweep directory, its analysis directory). repro6_fast
and repro6_twin share repro6's directory, so their runs start from the same warm start (`outputs/reproduce6/sft`)."""
SWEEP_SEEDS = {"repro6_fast": "3,4", "repro6_twin": "5,6"}
"""`--sweep` name -> its default `--seeds` where not "0,1,2": repro6_fast's and repro6_twin's runs are further seeds
of repro6's recipe (reproduction/repro6_fast/README.md, reproduction/repro6_twin/README.md), not repeats of
repro6's three."""
FORECAST_SWEEPS = ("repro4", "repro5", "repro6", "repro6_fast", "repro6_twin")
"""The sweeps of one reference run per seed whose first-half forecasts are registered (`scalerl_mega.reproduce4`)."""
COMMITTED_WITHOUT = {name: ("prompt_ids",) for name in ("repro6", "repro6_fast", "repro6_twin")}
"""`--sweep` name -> metrics keys left out of its committed runs (`reproduce_report.collect(drop_fields=...)`): the
per-step prompt ids are 16-hex-digit hashes xz cannot shrink, half of a 6,400-step run's 3.8 MB, and the tracked
tree must fit the GPU session's copy (tests/unit/test_reproduction_tracked.py). The analysis does not read them;
the full metrics.jsonl stays in the sweep directory (repro6's committed files held them until the fourteenth
session: git history has them)."""


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


def run_steps(sweep_dir: Path) -> dict[str, int]:
    """`<run_name>/seed<N>` -> the last training step logged in its metrics.jsonl (0: none yet), for every
    point directory of the sweep. A line cut short by a kill is skipped."""
    steps = {}
    for metrics in sorted(sweep_dir.glob("*/seed*/metrics.jsonl")):
        last = 0
        with open(metrics) as f:
            for line in f:
                if '"train"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("kind") == "train":
                    last = max(last, int(rec.get("step", 0)))
        steps[f"{metrics.parent.parent.name}/{metrics.parent.name}"] = last
    return steps


def progress(before: dict[str, int], after: dict[str, int]) -> dict[str, list[int]]:
    """The points an invocation trained: `{point: [last step before, last step after]}` (a point first
    created by it starts at 0)."""
    return {k: [before.get(k, 0), v] for k, v in sorted(after.items()) if v != before.get(k, 0)}


def points_of_command(command: str) -> set[str] | None:
    """The points (`<run_name>/seed<N>`; each sweep's run_name is its experiment's name) an invocation's recorded
    multirun command selected (`seed=0,1 experiment=a,b`); None where the command names no seeds or experiments.
    Two invocations may run at once (two pieces on the 2 cores): each must claim only its own points' steps."""
    args = dict(tok.split("=", 1) for tok in command.split() if tok.startswith(("seed=", "experiment=")))
    if "seed" not in args or "experiment" not in args:
        return None
    return {f"{exp}/seed{seed}" for exp in args["experiment"].split(",") for seed in args["seed"].split(",")}


def own_progress(prog: dict[str, list[int]], command: str) -> dict[str, list[int]]:
    """An invocation's progress restricted to the points its `command` selected (lines written before
    2026-11-27 evening also counted the steps a concurrent invocation added to other points)."""
    points = points_of_command(command)
    return prog if points is None else {k: v for k, v in prog.items() if k in points}


def stamp_runs(sweep_dir: Path, record: dict, *, history: list[dict] | None = None) -> list[Path]:
    """Write `provenance.json` into every finished run directory that has none yet: the invocation that
    finished the run (`record`: commit, dirty flag, command, times) and, as `segments`, every invocation
    in `history` + `record` whose `progress` names the run (commit, dirty, started, steps [from, to], and
    wall_s where that invocation trained this run alone), so a run resumed across commits records which
    commit produced which steps."""
    stamped = []
    fields = ("commit", "dirty", "command", "started", "finished")
    claims = [(r, own_progress(r.get("progress") or {}, r.get("command") or ""))
              for r in [*(history or []), record]]
    for run in finished_runs(sweep_dir):
        path = run / "provenance.json"
        if path.exists():
            continue
        key = f"{run.parent.name}/{run.name}"
        segments = [{"commit": r.get("commit"), "dirty": r.get("dirty"), "started": r.get("started"),
                     "steps": own[key],
                     # the invocation's wall time is this run's only where it trained nothing else
                     "wall_s": r.get("wall_s") if len(own) == 1 else None,
                     **({"note": r["note"]} if "note" in r else {})}
                    for r, own in claims if key in own]
        path.write_text(json.dumps({**{k: record.get(k) for k in fields}, "segments": segments}, indent=1) + "\n")
        stamped.append(run)
    return stamped


def read_history(sweep_dir: Path) -> list[dict]:
    """The sweep's earlier invocations (`provenance.jsonl`); a line cut short by a kill is skipped."""
    path = sweep_dir / "provenance.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _launch(cmd: list[str], env: dict[str, str]) -> int:
    """Run the multirun and return its exit status. SIGTERM and SIGHUP to this process (a `kill` of this
    process alone, a closed terminal, Slurm) are forwarded to it as SIGTERM: the trainer checkpoints at its
    next safe point and exits (a second SIGTERM, e.g. from a process-group kill, is idempotent), and this
    process waits for it instead of dying first, so the invocation is still recorded."""
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_sweep(args: argparse.Namespace) -> int:
    recipes_default, dir_default, _ = SWEEPS[args.sweep]
    sweep_dir = Path(args.sweep_dir or dir_default)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    recipes = args.recipes or ",".join(recipes_default)
    seeds = args.seeds or SWEEP_SEEDS.get(args.sweep, "0,1,2")
    cmd = sweep_command(sweep_dir=str(sweep_dir), seeds=seeds, recipes=recipes, extra=args.overrides)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    record = {"started": _stamp(), "commit": _git("rev-parse", "HEAD") or None,
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "command": " ".join(["OMP_NUM_THREADS=" + env["OMP_NUM_THREADS"], "python", *cmd[1:]])}
    t0 = time.monotonic()
    before = run_steps(sweep_dir)
    rc = _launch(cmd, env)
    record.update(finished=_stamp(), wall_s=round(time.monotonic() - t0, 1), rc=rc,
                  progress=own_progress(progress(before, run_steps(sweep_dir)), record["command"]))
    stamp_runs(sweep_dir, record, history=read_history(sweep_dir))
    with open(sweep_dir / "provenance.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scalerl_mega.reproduce", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="run (or continue) the leave-one-out sweep")
    s.add_argument("--sweep", choices=sorted(SWEEPS), default="repro",
                   help="repro: the leave-one-out sweep; repro3: issue 29's (reproduction/design/README.md); "
                        "repro4: its reference recipe at twice the length (reproduction/repro4/README.md); "
                        "repro5: at four times (reproduction/repro5/README.md); repro6: repro5 from repro4's warm "
                        "start (reproduction/repro6/README.md); repro6_fast: repro6's recipe on two engine "
                        "processes, seeds 3 and 4 (reproduction/repro6_fast/README.md); repro6_twin: the two "
                        "engines holding one engine's 256 rows, seeds 5 and 6 (reproduction/repro6_twin/README.md)")
    s.add_argument("--sweep-dir", default=None, help="default: the --sweep's own (outputs/reproduce[3])")
    s.add_argument("--seeds", default=None,
                   help="comma-separated seeds (default: 0,1,2; repro6_fast: 3,4; repro6_twin: 5,6)")
    s.add_argument("--recipes", default=None, help="comma-separated experiment= overlays (default: the --sweep's)")
    s.add_argument("overrides", nargs="*", help="extra Hydra overrides for every point")
    a = sub.add_parser("analyse", help="collect the finished runs, fit, compare, write reproduction/")
    a.add_argument("--sweep", choices=sorted(SWEEPS), default="repro",
                   help="repro: the leave-one-out sweep; repro3: issue 29's")
    a.add_argument("--sweep-dir", default=None, help="default: the --sweep's own (outputs/reproduce[3])")
    a.add_argument("--out", default=None, help="default: the --sweep's own (reproduction, reproduction/repro3)")
    a.add_argument("--no-collect", action="store_true", help="analyse <out>/runs as it is (the committed runs)")
    g = sub.add_parser("register", help="register the first-half forecasts of the runs past half their compute "
                                        "(repro4: reproduction/repro4/forecasts.json; commit it before they go on)")
    g.add_argument("--sweep", choices=FORECAST_SWEEPS, default="repro4")
    g.add_argument("--sweep-dir", default=None, help="default: the --sweep's own (outputs/reproduce4)")
    g.add_argument("--out", default=None, help="default: the --sweep's own (reproduction/repro4)")
    args = p.parse_args(argv)
    if args.cmd == "sweep":
        return run_sweep(args)
    run_names, sweep_default, out_default = SWEEPS[args.sweep]
    sweep_dir = None if getattr(args, "no_collect", False) else Path(args.sweep_dir or sweep_default)
    try:
        if args.cmd == "register":
            from scalerl_mega.reproduce4 import register

            register(sweep_dir=Path(args.sweep_dir or sweep_default), out_dir=Path(args.out or out_default),
                     commit=_git("rev-parse", "HEAD") or None, run_name=run_names[0])
        elif args.sweep in FORECAST_SWEEPS:
            from scalerl_mega.reproduce4 import analyse4

            analyse4(sweep_dir=sweep_dir, out_dir=Path(args.out or out_default), run_name=run_names[0],
                     label=args.sweep, drop_fields=COMMITTED_WITHOUT.get(args.sweep, ()))
        elif args.sweep == "repro3":
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
