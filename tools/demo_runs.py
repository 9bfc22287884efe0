"""Run the demo N times on one committed revision and write the JSON the README's demo figures are checked
against (docs/demo_runs.json; tests/unit/test_demo_runs_doc.py):

    nice -n 5 .venv/bin/python tools/demo_runs.py --rev bf1aa4b --runs 3 --seed 0 --out docs/demo_runs.json

The revision is checked out in a temporary `git worktree` (so uncommitted edits of this tree cannot leak into the
figures) with its own copy of this tree's virtual environment (hard links, re-pointed at the checkout by an editable
install), and `scalerl-train experiment=demo seed=S hydra.run.dir=<run dir>` runs there N times, one after another.
The JSON records the full commit hash, the command and, per run, what tools/demo_summary.py reads from the run's
own summary.json and metrics.jsonl (first/last/peak validation pass rate, wall time, SFT and RL parts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "scalerl-train experiment=demo seed={seed} hydra.run.dir=<run dir>"


def demo_command(*, venv: Path, seed: int, run_dir: Path) -> list[str]:
    """The command one demo run executes (COMMAND with its placeholders filled)."""
    return [str(venv / "bin" / "scalerl-train"), "experiment=demo", f"seed={seed}", f"hydra.run.dir={run_dir}"]


def checkout(*, rev: str, work: Path) -> tuple[str, Path, Path]:
    """A detached worktree of `rev` under `work` and a venv copy pointed at it: (full hash, tree, venv)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tree, venv = work / "src", work / "src" / ".venv"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    subprocess.run(["cp", "-al", str(ROOT / ".venv"), str(venv)], check=True)
    for script in (venv / "bin").iterdir():  # console scripts name the source venv's python: drop, pip rewrites
        if script.is_file() and not script.name.startswith(("python", "activate", "pip")):
            script.unlink()
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "-e", str(tree)], check=True, cwd=tree)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import scalerl_mega; print(scalerl_mega.__file__)"],
                           check=True, capture_output=True, text=True, cwd=work).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the venv copy imports scalerl_mega from {where}, not from the checkout {tree}")
    return commit, tree, venv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="the committed revision to run (any git rev, recorded as its hash)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "demo_runs.json")
    p.add_argument("--keep", type=Path, default=None, help="keep the run directories here (default: removed)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tools"))
    from demo_summary import summarise

    work = Path(tempfile.mkdtemp(prefix="demo_runs_"))
    try:
        commit, tree, venv = checkout(rev=args.rev, work=work)
        runs_root = args.keep or work / "runs"
        runs = []
        for i in range(1, args.runs + 1):
            run_dir = runs_root / f"run{i}"
            subprocess.run(demo_command(venv=venv, seed=args.seed, run_dir=run_dir), check=True, cwd=tree)
            runs.append(summarise(run_dir))
            print(f"run{i}: {json.dumps(runs[-1])}", flush=True)
        record = {"commit": commit, "command": COMMAND.format(seed=args.seed),
                  "machine": "2 shared CPU cores, other jobs running", "runs": runs}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "src")], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
