"""Every shell command of README.md and docs/*.md works as written: the lines of their ```bash blocks
and the commands in inline backticks (`scalerl-...`, `python ...`, `make ...`, `bash ...`, `torchrun ...`, with
or without `.venv/bin/` and leading `VAR=value`s).

Each command is classified by the first rule of `INLINE_RULES` (inline commands only) or `RULES` it matches:
* target: `make <target>`: the Makefile has the target (running it is a test suite or a demo of minutes);
* mention: an inline command with placeholders (`...`, `<dir>`, `RUN`, `a|b`): the tool's `--help` must work;
* run: run as written (paths under /tmp/ moved into the test's directory, where FIXTURES are placed first: a
  finished tiny run's checkpoints at /tmp/tiny-run, the run docs/extending.md's Qwen3 example makes);
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
FIXTURES = {"tiny-run": REPO / "tests" / "fixtures" / "tiny_run"}
"""What the docs' /tmp/ paths hold before the commands run (docs path under /tmp/ -> committed fixture)."""
RUN_AS_WRITTEN_AT_LEAST = 14
"""Commands run exactly as the docs write them (only /tmp/ moved): a rule turned to `help` or `skip` shows here."""

RULES: list[tuple[str, str, str]] = [  # (regex on the command, mode, reason for help/skip)
    (r"^make (demo|demo-real)$", "skip", "trains for minutes (make demo / make demo-real; tests/integration/test_demo_seeds.py)"),
    (r"^make demo-multiturn-seeds$", "skip", "trains three seeds for about 40 minutes (tests/unit/test_demo_multiturn_doc.py checks its committed summary)"),
    (r"^make demo-lora-seeds$", "skip", "a warm start and three LoRA seeds, about 30 minutes (tests/unit/test_demo_lora_doc.py checks its committed summary)"),
    (r"^make test$", "skip", "the default suite itself"),
    (r"^make (verifiers-env|test-verifiers)$", "skip", "builds .venv-verifiers from the package index, about 4 minutes "
     "(make test-verifiers then runs tests/integration/test_verifiers_rollouts.py)"),
    (r"^make check-gpu-envs$", "skip", "needs the two GPU environments (docs/cluster_install.md)"),
    (r"\bsbatch\b|^srun\b", "skip", "needs a Slurm cluster (make test-slurm runs sbatch on a private one)"),
    (r"^(pip|/opt/scalerl|python3\.12 -m venv|export |python -c \"import torch)", "skip",
     "cluster installation steps (tests/integration/test_install_keeps_torch.py and test_wheel_install.py)"),
    (r"tools/import_gguf\.py|smollm2_(cpu|python_tool)|write_word_problems", "skip",
     "needs the GGUF download of tools/import_gguf.py (tests/integration/test_real_model.py, make test-slow)"),
    (r"tools/plan\.py", "run", ""),
    (r"^DRY_RUN=1 .*bash slurm/", "run", ""),
    (r"tools/make_tiny_checkpoint\.py", "run", ""),
    (r"tools/convert_(hf_to_megatron|megatron_to_hf)\.py", "run", ""),
    (r"scalerl-train -m .*cluster=slurm", "skip", "a Slurm sweep (tests/integration/test_slurm_local.py)"),
    (r"\bmy_pkg\.", "skip", "names the user's own package (an agent or environment they write)"),
    (r"scalerl-train --validate\b", "run", ""),
    (r"scalerl-train|torchrun .*-m scalerl_mega\.train", "validate", ""),
    (r"tools/cluster_sim\.py --calibration", "help", "needs the demo's metrics (make demo)"),
    (r"tools/cluster_sim\.py", "run", ""),
    (r"tools/sweep_report\.py", "help", "needs a finished sweep"),
    (r"tools/demo_fp8_runs\.py", "help", "needs finished FP8 demo runs (tests/unit/test_demo_fp8_doc.py checks its "
     "committed summary)"),
    (r"scalerl-fit", "help", "needs finished runs (make demo; tests/unit/test_scaling_cli.py runs it on built ones)"),
]


INLINE_RULES: list[tuple[str, str, str]] = [
    (r"^make \S+", "target", ""),
    (r"-m pytest\b", "skip", "a test run (the suites themselves)"),
    (r"tests\.sglang_support\.|sglang\.launch_server|scalerl_mega\.serve\b", "skip",
     "needs the SGLang venv (make test-sglang)"),
    (r"--device cuda|triton\.aot|cluster\.gpu_envs", "skip", "needs a GPU or the GPU environments"),
    (r"(^|\s)\S*bench/\w+\.py", "help", "a benchmark of minutes"),
    (r"\.\.\.|<[^>]*>|\[\.\.\.\]|\b(RUN|N|X|F)\b|\S\|\S|\{.*,.*\}", "mention", "placeholders"),
    (r"^\S*scalerl-(train|fit)$", "mention", "the tool named"),
    (r"init_from_hf=/ckpt/|my_pkg\.", "skip", "names the user's own checkpoint or package"),
    (r"scalerl-train --(help|cfg job)\b", "run", ""),
    (r"launch_config$", "skip", "the Slurm scripts' launch check of a run's overrides (tests/unit/test_slurm_scripts.py)"),
]

COMMAND_START = re.compile(r"^([A-Z_]+=\S+ )*(\.venv/bin/)?(scalerl-|python3? |make |bash |torchrun )")


def inline_commands() -> list[tuple[str, str]]:
    """(doc file, command) of every inline `...` span outside the fenced blocks that starts like a command."""
    out = []
    for doc in DOCS:
        text = re.sub(r"^\s*```.*?^\s*```", "", doc.read_text(), flags=re.S | re.M).replace("```", "")
        for span in re.findall(r"`([^`\n]+(?:\n[^`\n]+)*)`", text):
            cmd = " ".join(span.split())
            if COMMAND_START.match(cmd):
                out.append((doc.relative_to(REPO).as_posix(), cmd))
    return out


def shell_words(cmd: str) -> list[str]:
    """The words bash makes of `cmd`: shlex's, with bash's ANSI-C quoting `$'...'` decoded first (`\\n` a newline)."""
    import codecs

    def ansi_c(m: re.Match) -> str:
        return shlex.quote(codecs.decode(m.group(1), "unicode_escape"))

    return shlex.split(re.sub(r"\$'((?:[^'\\]|\\.)*)'", ansi_c, cmd))


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


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


def classify(cmd: str, *, inline: bool = False) -> tuple[str, str]:
    for pattern, mode, why in (INLINE_RULES if inline else []) + RULES:
        if re.search(pattern, cmd):
            return mode, why
    raise AssertionError(f"no rule for the docs command {cmd!r}: add one to RULES")


def as_argv(cmd: str, mode: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The command's argv and environment: console scripts and the venv's python as this interpreter's modules,
    /tmp/ under `tmp`, `--validate` for a validate command, `--help` for a help one."""
    cmd = cmd.replace("/tmp/", f"{tmp}/").replace("$PWD", str(REPO))  # run in the repository root
    words = shell_words(cmd)
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
    if mode == "mention":
        mode = "help"
        words = [w.split("|")[0] for w in words if not re.search(r"\.\.\.|<", w)]  # a|b: the first
    if mode == "help" and words[1:3] in (["-m", "scalerl_mega.train"], ["-m", "scalerl_mega.scaling.cli"]):
        words = [*words[:3], "--help"]
    elif mode == "help":
        tool = next(i for i, w in enumerate(words) if w.endswith(".py") or w.startswith("scalerl_mega"))
        sub = next((i for i in range(tool + 1, len(words)) if words[i].startswith("-")), len(words))
        words = [*words[:sub], "--help"]  # with its subcommand (`reproduce.py sweep --help`) or positionals
    return words, env


def test_every_docs_command_is_classified():
    cmds = doc_commands()
    assert len(cmds) > 30
    modes = {classify(c)[0] for _, c in cmds}
    assert modes == {"run", "validate", "help", "skip"}, modes


def test_every_inline_docs_command_is_classified():
    cmds = inline_commands()
    assert len(cmds) > 60 and any(c.startswith(".venv/bin/scalerl-train data=jsonl") for _, c in cmds)
    modes = {classify(c, inline=True)[0] for _, c in cmds}
    assert modes == {"target", "mention", "run", "validate", "help", "skip"}, modes


def checkout_view(tmp_path: Path) -> Path:
    """A directory that looks like the repository root (a link to each top-level entry but outputs/ and
    multirun/): commands run there as written, and what they write under outputs/ stays in the test's directory."""
    view = tmp_path / "repo"
    view.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("outputs", "multirun", ".git"):
            (view / entry.name).symlink_to(entry)
    return view


def test_the_docs_commands_work_as_written(tmp_path):
    import shutil

    seen = set()
    env0 = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    failures = []
    ran_as_written = 0
    view = checkout_view(tmp_path)
    for name, fixture in FIXTURES.items():
        shutil.copytree(fixture, tmp_path / name)
    targets = make_targets()
    commands = [(doc, cmd, False) for doc, cmd in doc_commands()] + [(d, c, True) for d, c in inline_commands()]
    for doc, cmd, inline in commands:
        mode, _ = classify(cmd, inline=inline)
        if mode == "target":
            target = cmd.split()[1]
            if target not in targets:
                failures.append(f"{doc}: {cmd}\n  the Makefile has no target {target!r}")
            continue
        argv, env = as_argv(cmd, mode, tmp_path)
        if mode == "skip" or (tuple(argv), tuple(env.items())) in seen:
            continue
        seen.add((tuple(argv), tuple(env.items())))
        run_env = {**env0, **env}
        if mode != "run" and "output_dir=" not in cmd and argv[1:3] == ["-m", "scalerl_mega.train"]:
            argv.append(f"output_dir={tmp_path}/run{len(seen)}")
        r = subprocess.run(argv, cwd=view, env=run_env, capture_output=True, text=True, timeout=600)
        ran_as_written += mode == "run" and r.returncode == 0
        if r.returncode != 0:
            failures.append(f"{doc}: {cmd}\n  ({mode}: {' '.join(argv)}) rc={r.returncode}\n{r.stderr[-1500:]}")
        elif argv[-1] == "--help" and "--help" not in cmd:  # the options the docs name are the tool's
            unknown = [o for o in re.findall(r"(?<!\S)--[a-z][\w-]*", cmd) if o not in r.stdout]
            if unknown:
                failures.append(f"{doc}: {cmd}\n  {' '.join(argv)} lists no {', '.join(unknown)}")
    assert not failures, "\n\n".join(failures)
    assert ran_as_written >= RUN_AS_WRITTEN_AT_LEAST, ran_as_written


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


def test_the_template_command_of_extending_md_gives_a_newline():
    """docs/extending.md's `data.template` word, as bash passes it to Hydra, composes to the intended template
    ("Q: {problem}", a newline, "A:"); plain single quotes would give a backslash and an n."""
    from scalerl_mega.compose import compose_node

    cmd = next(c for d, c in inline_commands() if d == "docs/extending.md" and "data.template=" in c)
    word = next(w for w in shell_words(cmd) if w.startswith("data.template="))
    raw = re.search(r"\$'data\.template=[^']*'", cmd).group(0)
    assert word == subprocess.run(["bash", "-c", f"printf %s {raw}"], capture_output=True, text=True).stdout  # bash's
    assert compose_node(["data=jsonl", word]).data.template == "Q: {problem}\nA:"
    plain = next(w for w in shell_words("'data.template=\"Q: {problem}\\nA:\"'") if w.startswith("data."))
    assert compose_node(["data=jsonl", plain]).data.template == "Q: {problem}\\nA:"  # what the docs had
