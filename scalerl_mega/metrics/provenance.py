"""Which code trained which steps of a run: `<run>/provenance.jsonl`, one line per launch (segment).

A run resumed across launches (preemption, `train.steps` extended, a crash) may be trained by several commits of
this package. Every launch of `scalerl-train` appends a segment when its RL phase starts and completes it when the
launch ends:

    {"commit": "7ab7997...", "dirty": false, "version": "0.1.0", "started": "2026-11-28T21:22:56Z",
     "command": "scalerl-train experiment=demo", "steps": [0, 80], "finished": "...", "wall_s": 412.0,
     "preempted": false}

`steps` is [last step before the launch, last step after it]; a launch killed before its end keeps
`steps: [from, null]` and the next launch's `from` (its checkpoint) says where it resumed. `commit` is the package
checkout's git HEAD (None outside a git checkout, e.g. an installed wheel: `version` still says what ran) and
`dirty` whether tracked files differed from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

PROVENANCE = "provenance.jsonl"


def stamp() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _git(*args: str, cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """`{"commit", "dirty"}` of the git checkout holding `cwd` (default: this package's source); both None
    outside a git checkout."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    commit = _git("rev-parse", "HEAD", cwd=where)
    if not commit:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=where)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def read_segments(run_dir: Path) -> list[dict[str, Any]]:
    """The run's segments in launch order (a line cut short by a kill is skipped)."""
    path = Path(run_dir) / PROVENANCE
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _write(run_dir: Path, segments: list[dict[str, Any]]) -> None:
    path = Path(run_dir) / PROVENANCE
    tmp = path.with_name(f".{PROVENANCE}.{os.getpid()}")
    tmp.write_text("".join(json.dumps(s) + "\n" for s in segments))
    tmp.replace(path)


def start_segment(run_dir: Path, *, from_step: int, command: str, version: str | None = None) -> dict[str, Any]:
    """Append this launch's segment (`steps: [from_step, None]`); returns it."""
    seg = {**git_state(), "version": version, "started": stamp(), "command": command, "steps": [int(from_step), None]}
    _write(run_dir, [*read_segments(run_dir), seg])
    return seg


def finish_segment(run_dir: Path, *, to_step: int, wall_s: float, preempted: bool) -> dict[str, Any] | None:
    """Complete the last open segment (`steps[1]` None) with the launch's last step; None when there is none."""
    segments = read_segments(run_dir)
    for seg in reversed(segments):
        if isinstance(seg.get("steps"), list) and len(seg["steps"]) == 2 and seg["steps"][1] is None:
            seg["steps"][1] = int(to_step)
            seg.update(finished=stamp(), wall_s=round(float(wall_s), 1), preempted=bool(preempted))
            _write(run_dir, segments)
            return seg
    return None


def trained_by(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[{"commit", "dirty", "steps": [from, to]}]`: the steps each launch trained, an unfinished launch's end
    taken from the next launch's start (None for the last one); launches that trained nothing are left out."""
    out = []
    for k, seg in enumerate(segments):
        lo, hi = (seg.get("steps") or [None, None])[:2]
        if hi is None and k + 1 < len(segments):
            hi = (segments[k + 1].get("steps") or [None])[0]
        if lo is not None and hi is not None and hi <= lo:
            continue
        out.append({"commit": seg.get("commit"), "dirty": seg.get("dirty"), "steps": [lo, hi]})
    return out
