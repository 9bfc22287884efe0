"""Every `scalerl-fit` command in README.md and docs/*.md runs as written against the committed fixtures (paths
relative to the repository root), exits 0, and prints the figures the docs show next to it.

A command is a line of a fenced code block that calls `scalerl-fit` (`.venv/bin/scalerl-fit ...`); a ```text block
that follows its code block (blank lines between at most) is what the block's last command prints: each of its
non-empty lines must appear in that command's output, spaces collapsed. Commands run in-process (`scaling.cli.main`)
in a scratch directory that links the repository's top-level folders they name, so plots they write land there."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalerl_mega.scaling.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    argv: tuple[str, ...]
    prints: tuple[str, ...]
    """Lines the docs show it printing (may be empty: then exit 0 is the claim)."""

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: scalerl-fit {' '.join(self.argv)}"


def _blocks(text: str) -> list[tuple[str, int, list[str], int]]:
    """(info string, first line number, lines, line number after the block) of every fenced block."""
    out, lines, k = [], text.splitlines(), 0
    while k < len(lines):
        m = FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        start, body, k = k + 2, [], k + 1
        while k < len(lines) and not lines[k].startswith("```"):
            body.append(lines[k])
            k += 1
        out.append((m.group(1), start, body, k + 1))
        k += 1
    return out


def _commands_of(page: Path) -> list[Command]:
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    blocks = _blocks(text)
    found = []
    for i, (info, start, body, after) in enumerate(blocks):
        if info == "text":
            continue
        cmds = []
        for j, raw in enumerate(body):
            head = raw.split(maxsplit=1)
            if not head or not head[0].endswith("scalerl-fit"):
                continue
            words = shlex.split(raw, comments=True)
            if words:
                cmds.append((start + j, tuple(words[1:])))
        if not cmds:
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        follows = nxt is not None and nxt[0] == "text" and all(not s.strip() for s in lines[after:nxt[1] - 2])
        shown = tuple(s for s in nxt[2] if s.strip()) if follows else ()
        for k, (line, argv) in enumerate(cmds):
            found.append(Command(page=str(page.relative_to(ROOT)), line=line, argv=argv,
                                 prints=shown if k == len(cmds) - 1 else ()))
    return found


COMMANDS = [c for p in PAGES for c in _commands_of(p)]


def _squash(s: str) -> str:
    return " ".join(s.split())


def test_the_docs_have_fit_commands_and_each_names_a_committed_input():
    assert len(COMMANDS) >= 5, [str(c) for c in COMMANDS]
    for c in COMMANDS:
        inputs = [a for a in c.argv if not a.startswith("-") and "/" in a and not a.endswith("/")]
        assert inputs and all((ROOT / a).exists() for a in inputs[:1]), str(c)


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_each_fit_command_runs_as_written_and_prints_what_the_docs_show(cmd, tmp_path, monkeypatch, capsys):
    for top in {a.split("/")[0] for a in cmd.argv if (ROOT / a.split("/")[0]).exists() and a.split("/")[0]}:
        (tmp_path / top).symlink_to(ROOT / top)
    monkeypatch.chdir(tmp_path)
    rc = main(list(cmd.argv))
    out, err = capsys.readouterr()
    assert rc == 0, f"{cmd}\n{err}"
    got = _squash(out)
    missing = [line for line in cmd.prints if _squash(line) not in got]
    assert not missing, f"{cmd}: the docs show lines it does not print:\n" + "\n".join(missing) + f"\n--- it printed:\n{out}"
