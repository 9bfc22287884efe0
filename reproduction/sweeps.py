"""Running a design's sweep: one resumable Hydra multirun, and a record of every invocation.

`sweep` runs `scalerl-train -m` over the design's `experiment=` overlays x seeds (seed-major: an interrupted sweep has
whole seeds) with `hydra/sweeper=skip_done`, so running it again continues where it stopped (finished points are
skipped, an unfinished one resumes from its checkpoint). Every invocation appends a line to
`<sweep-dir>/provenance.jsonl`: the exact command, the git commit and whether the tree was dirty, start and end
times, exit status, and the training steps it added to each point (`progress`), also when it is stopped by SIGTERM
or SIGHUP (forwarded to the training process, which checkpoints and exits; the line is written after it has). A
finished point's `provenance.json` lists every invocation that trained it (`segments`). Each run also records its
own launches in its `provenance.jsonl` (`scalerl_mega.metrics.provenance`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scalerl_mega.metrics.provenance import git_state, stamp

from reproduction.common import run_finished

OVERLAY_DIR = "reproduction/"
"""The designs' overlays live in conf/experiment/reproduction/; each overlay's run_name is its file's stem."""


def sweep_command(*, sweep_dir: str, seeds: str, overlays: str, extra: list[str] | None = None) -> list[str]:
    """The Hydra multirun of the sweep: seed-major, skip-done, fixed point directories `<sweep_dir>/<run_name>/seed<N>`
    (so a second invocation finds the finished ones), one warm start shared by every point in `<sweep_dir>/sft`."""
    return [sys.executable, "-m", "scalerl_mega.train", "-m", f"seed={seeds}", f"experiment={overlays}",
            "hydra/sweeper=skip_done", "hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${run_name}/seed${seed}", f"sft.checkpoint={sweep_dir}/sft", *(extra or [])]


def finished_runs(sweep_dir: Path) -> list[Path]:
    """The point directories `<sweep_dir>/<run_name>/seed<N>` whose run finished (a preempted run's summary.json
    does not count)."""
    return sorted(p.parent for p in sweep_dir.glob("*/seed*/summary.json") if run_finished(p.parent))


def run_steps(sweep_dir: Path) -> dict[str, int]:
    """`<run_name>/seed<N>` -> the last training step logged in its metrics.jsonl (0: none yet), for every point
    directory of the sweep. A line cut short by a kill is skipped."""
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
    """The points an invocation trained: `{point: [last step before, last step after]}` (a point first created by
    it starts at 0)."""
    return {k: [before.get(k, 0), v] for k, v in sorted(after.items()) if v != before.get(k, 0)}


def points_of_command(command: str) -> set[str] | None:
    """The points (`<run_name>/seed<N>`; a run_name is its overlay's file stem) an invocation's recorded multirun
    command selected (`seed=0,1 experiment=reproduction/a,reproduction/b`); None where the command names no seeds or
    experiments. Two invocations may run at once: each must claim only its own points' steps."""
    args = dict(tok.split("=", 1) for tok in command.split() if tok.startswith(("seed=", "experiment=")))
    if "seed" not in args or "experiment" not in args:
        return None
    return {f"{exp.rsplit('/', 1)[-1]}/seed{seed}" for exp in args["experiment"].split(",")
            for seed in args["seed"].split(",")}


def own_progress(prog: dict[str, list[int]], command: str) -> dict[str, list[int]]:
    """An invocation's progress restricted to the points its `command` selected."""
    points = points_of_command(command)
    return prog if points is None else {k: v for k, v in prog.items() if k in points}


def stamp_runs(sweep_dir: Path, record: dict, *, history: list[dict] | None = None) -> list[Path]:
    """Write `provenance.json` into every finished run directory that has none yet: the invocation that finished the
    run (`record`: commit, dirty flag, command, times) and, as `segments`, every invocation in `history` + `record`
    whose `progress` names the run (commit, dirty, started, steps [from, to], and wall_s where that invocation
    trained this run alone)."""
    stamped = []
    fields = ("commit", "dirty", "command", "started", "finished")
    claims = [(r, own_progress(r.get("progress") or {}, r.get("command") or "")) for r in [*(history or []), record]]
    for run in finished_runs(sweep_dir):
        path = run / "provenance.json"
        if path.exists():
            continue
        key = f"{run.parent.name}/{run.name}"
        segments = [{"commit": r.get("commit"), "dirty": r.get("dirty"), "started": r.get("started"),
                     "steps": own[key], "wall_s": r.get("wall_s") if len(own) == 1 else None,
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


def launch(cmd: list[str], env: dict[str, str]) -> int:
    """Run the multirun and return its exit status. SIGTERM and SIGHUP to this process are forwarded to it as
    SIGTERM: the trainer checkpoints at its next safe point and exits, and this process waits for it instead of
    dying first, so the invocation is still recorded."""
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


def run_sweep(*, sweep_dir: Path, overlays: list[str], seeds: str, overrides: list[str]) -> int:
    """One invocation of a design's sweep (module docstring); returns the multirun's exit status."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    cmd = sweep_command(sweep_dir=str(sweep_dir), seeds=seeds, overlays=",".join(OVERLAY_DIR + o for o in overlays),
                        extra=overrides)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    record = {"started": stamp(), **git_state(Path.cwd()),
              "command": " ".join(["OMP_NUM_THREADS=" + env["OMP_NUM_THREADS"], "python", *cmd[1:]])}
    t0 = time.monotonic()
    before = run_steps(sweep_dir)
    rc = launch(cmd, env)
    record.update(finished=stamp(), wall_s=round(time.monotonic() - t0, 1), rc=rc,
                  progress=own_progress(progress(before, run_steps(sweep_dir)), record["command"]))
    stamp_runs(sweep_dir, record, history=read_history(sweep_dir))
    with open(sweep_dir / "provenance.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return rc
