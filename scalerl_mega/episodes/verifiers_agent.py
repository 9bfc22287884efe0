"""`env=agent` for `verifiers` 0.4 environments: one verifiers episode per trainer episode, run by verifiers' own
interpreter against the episode's base url.

verifiers 0.4 drives its episodes itself (an async `Env.run_episode` runs a harness program whose model calls go
through its interception server), so it cannot be stepped as a `reset`/`step` environment; it can talk to an
OpenAI-compatible url, which is what an `env=agent` episode hands its agent. verifiers pins `openai<3` while the
trainer's environment has openai 3, so it runs in its own venv (`make verifiers-env`: `.venv-verifiers`) through
`tools/verifiers_rollout.py`, one subprocess per episode (it ends itself when the trainer is gone). The ids trained are
the endpoint's (exact: the engine's generated ids, the template's ids for the messages); the reward is the
verifiers taskset's (its `@vf.reward` functions' weighted sum). docs/extending.md ("verifiers 0.4") has the
recipe:

    def my_agent(base_url, task):               # env.agent._target_=my_pkg.my_agent
        return run_verifiers_episode(base_url, task, taskset="my_taskset").reward
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalerl_mega.jsonvalue import JSON

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "verifiers_rollout.py"
PYTHON_VAR = "SCALERL_VERIFIERS_PYTHON"
"""Environment variable naming verifiers' interpreter (default: the repository's `.venv-verifiers/bin/python`)."""


@dataclass(kw_only=True)
class VerifiersEpisode:
    """What verifiers reported for one episode: the trace's reward (the weighted sum of its rewards), each reward
    (weighted), the final branch's messages (wire form, as verifiers recorded them) and the last reply."""

    reward: float
    rewards: dict[str, float | None] = field(default_factory=dict)
    messages: list[dict[str, JSON]] = field(default_factory=list)
    last_reply: str = ""


def verifiers_python() -> str:
    """verifiers' interpreter: `$SCALERL_VERIFIERS_PYTHON`, else `.venv-verifiers/bin/python` of this repository."""
    return os.environ.get(PYTHON_VAR) or str(REPO / ".venv-verifiers" / "bin" / "python")


def run_verifiers_episode(base_url: str, task: dict, *, taskset: str, harness: str = "local", python: str = "",
                          plugin_path: Sequence[str] = (), model: str = "scalerl-policy") -> VerifiersEpisode:
    """One episode of verifiers taskset `taskset` (an importable module id) against `base_url`. `task` is the
    trainer's row: its keys that are fields of the taskset's `TaskData` build the verifiers task. `harness`:
    `local` (verifiers' chat program run by verifiers' interpreter: offline), a harness id, or "" (the taskset's
    own, which verifiers prepares with `uv` from the package index). `plugin_path`: folders put on verifiers'
    `PYTHONPATH` (where the taskset module is). Raises RuntimeError naming verifiers' error when the episode
    failed (the trainer then drops it, `episode/dropped`)."""
    exe = python or verifiers_python()
    if not Path(exe).exists():
        raise RuntimeError(f"no verifiers interpreter at {exe}: run `make verifiers-env` (or set {PYTHON_VAR})")
    env = dict(os.environ)
    paths = [str(Path(p).resolve()) for p in plugin_path]  # the run's working directory is its own
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH", "")])])
    with tempfile.TemporaryDirectory(prefix="scalerl-vf-") as tmp:
        out, row, err = Path(tmp) / "result.json", Path(tmp) / "task.json", Path(tmp) / "stderr.txt"
        row.write_text(json.dumps(task, default=str))
        cmd = [exe, str(SCRIPT), "--base-url", base_url, "--taskset", taskset, "--harness", harness,
               "--model", model, "--task", str(row), "--out", str(out), "--lifeline"]
        # stdin stays open while we wait: the run (its own process group) ends itself when this process is gone
        with open(err, "w") as stderr:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                    cwd=tmp, start_new_session=True)
            try:
                rc = proc.wait()
            finally:
                proc.stdin.close()
        result = json.loads(out.read_text()) if out.exists() else None
        why = "; ".join(result["errors"]) if result else err.read_text().strip()[-2000:]
    if result is None or rc != 0:
        raise RuntimeError(f"verifiers episode of taskset {taskset!r} failed (exit {rc}): {why}")
    return VerifiersEpisode(reward=float(result["reward"]), rewards=result["rewards"], messages=result["messages"],
                            last_reply=result["last_reply"])
