"""Every shell command of README.md and docs/*.md (their ```bash blocks) works as written (issue 59).

Each command is classified by the first rule of `RULES` it matches:
* run: run as written (paths under /tmp/ moved into the test's directory);
* validate: a training command run with `--validate` instead (every check before the first step, seconds);
* help: a tool whose inputs only a finished run or a cluster has: `--help` must work (the tool exists and imports);
* skip: not runnable on a CPU machine, with the reason.
A command no rule matches fails the test: a new command in the docs gets a rule here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

RULES: list[tuple[str, str, str]] = [  # (regex on the command, mode, reason for help/skip)
    (r"^make (demo|demo-real)$", "skip", "trains for minutes (make demo / make demo-real; tests/integration/test_demo_seeds.py)"),
    (r"^make test$", "skip", "the default suite itself"),
    (r"^make check-gpu-envs$", "skip", "needs the two GPU environments (docs/cluster_install.md)"),
    (r"\bsbatch\b|^srun\b", "skip", "needs a Slurm cluster (make test-slurm runs sbatch on a private one)"),
    (r"^(pip|/opt/scalerl|python3\.12 -m venv|export |python -c \"import torch)", "skip",
     "cluster installation steps (tests/integration/test_install_keeps_torch.py and test_wheel_install.py)"),
    (r"tools/import_gguf\.py|smollm2_(cpu|python_tool)|write_word_problems", "skip",
     "needs the GGUF download of tools/import_gguf.py (tests/integration/test_real_model.py, make test-slow)"),
    (r"tools/plan\.py", "run", ""),
    (r"^DRY_RUN=1 .*bash slurm/", "run", ""),
    (r"tools/make_tiny_checkpoint\.py", "run", ""),
    (r"tools/convert_hf_to_megatron\.py --hf-dir /tmp/", "run", ""),
    (r"tools/convert_(hf_to_megatron|megatron_to_hf)\.py", "help", "placeholders HF / CKPT"),
    (r"scalerl-train -m .*cluster=slurm", "skip", "a Slurm sweep (tests/integration/test_slurm_local.py)"),
    (r"scalerl-train|torchrun .*-m scalerl_mega\.train", "validate", ""),
    (r"tools/cluster_sim\.py --calibration", "help", "needs the demo's metrics (make demo)"),
    (r"tools/cluster_sim\.py", "run", ""),
    (r"tools/sweep_report\.py", "help", "needs a finished sweep"),
    (r"scalerl-fit", "help", "needs finished runs (make demo; tests/unit/test_scaling_cli.py runs it on built ones)"),
]


def doc_commands() -> list[tuple[str, str]]:
    """(doc file, command) of every line of every ```bash block; `\\` continuations joined, comments dropped."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", doc.read_text(), re.S):
            cmd = ""
            for line in block.splitlines():
                cmd = f"{cmd} {line.strip()}" if cmd else line.strip()
                if cmd.endswith("\\"):
                    cmd = cmd[:-1].rstrip()
                    continue
                cmd = "" if cmd.startswith("#") else re.sub(r"\s+#\s.*$", "", cmd).strip()
                if cmd:
                    out.append((doc.relative_to(REPO).as_posix(), cmd))
                cmd = ""
    return out


def classify(cmd: str) -> tuple[str, str]:
    for pattern, mode, why in RULES:
        if re.search(pattern, cmd):
            return mode, why
    raise AssertionError(f"no rule for the docs command {cmd!r}: add one to RULES")


def as_argv(cmd: str, mode: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The command's argv and environment: console scripts and the venv's python as this interpreter's modules,
    /tmp/ under `tmp`, `--validate` for a validate command, `--help` for a help one."""
    cmd = cmd.replace("/tmp/", f"{tmp}/")
    words = shlex.split(cmd)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    py = sys.executable
    if words[0] == "torchrun":
        words = ["scalerl-train", *words[words.index("scalerl_mega.train") + 1:]]
    head = {"scalerl-train": [py, "-m", "scalerl_mega.train"], "scalerl-fit": [py, "-m", "scalerl_mega.scaling.cli"]}
    name = words[0].rsplit("/", 1)[-1]
    if name in head:
        words = [*head[name], *words[1:]]
    elif name in ("python", "python3"):
        words = [py, *words[1:]]
    if mode == "validate":
        words = [w for w in words if w != "--validate"]
        words.insert(3, "--validate")
    if mode == "help":
        tool = next(i for i, w in enumerate(words) if w.endswith(".py") or w.startswith("scalerl_mega"))
        words = [*words[:tool + 1], "--help"]
    return words, env


def test_every_docs_command_is_classified():
    cmds = doc_commands()
    assert len(cmds) > 30
    modes = {classify(c)[0] for _, c in cmds}
    assert modes == {"run", "validate", "help", "skip"}, modes


def test_the_docs_commands_work_as_written(tmp_path):
    seen = set()
    env0 = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    failures = []
    for doc, cmd in doc_commands():
        mode, _ = classify(cmd)
        if mode == "skip" or cmd in seen:
            continue
        seen.add(cmd)
        argv, env = as_argv(cmd, mode, tmp_path)
        run_env = {**env0, **env}
        if "output_dir=" not in cmd and argv[1:3] == ["-m", "scalerl_mega.train"]:
            argv.append(f"output_dir={tmp_path}/run{len(seen)}")
        r = subprocess.run(argv, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            failures.append(f"{doc}: {cmd}\n  ({mode}: {' '.join(argv)}) rc={r.returncode}\n{r.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("cmd,mode", [
    ("DRY_RUN=1 TRAIN_FILES=/data/p.jsonl bash slurm/train_scout.sh", "run"),
    ("MODEL_PATH=/ckpt/x sbatch slurm/train_dense.sh", "skip"),
    (".venv/bin/scalerl-train experiment=demo train.steps=2", "validate"),
    (".venv/bin/scalerl-fit outputs/run1 --json", "help"),
])
def test_classification_and_rewriting(tmp_path, cmd, mode):
    assert classify(cmd)[0] == mode
    if mode == "validate":
        argv, env = as_argv(cmd, mode, tmp_path)
        assert argv == [sys.executable, "-m", "scalerl_mega.train", "--validate", "experiment=demo", "train.steps=2"]
    if mode == "run":
        argv, env = as_argv(cmd, mode, tmp_path)
        assert argv == ["bash", "slurm/train_scout.sh"] and env == {"DRY_RUN": "1", "TRAIN_FILES": "/data/p.jsonl"}
