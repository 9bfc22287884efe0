"""The house's own limits, checked on the tree: at most 20 top-level modules in scalerl_mega/ (a new job goes in
a package), at most 8 pages in docs/, no test whose subprocess timeout is short enough to fire on a loaded
machine, and no citation of this project's tracker ("issue 58", "#19") in code, tests or docs: a reader of the
repository cannot look those up. Upstream references ("sglang#31894", "slime #1641", "verl #7167") are kept."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_TOP_LEVEL_MODULES = 20
MAX_DOCS_PAGES = 8
MIN_SUBPROCESS_TIMEOUT_S = 300
"""A subprocess timeout is a safety net against a hang, never the assertion: below this, a loaded 2-core
machine can reach it on honest work (a slurm dry run took over 120 s beside a second `make test`)."""

TRACKER = re.compile(r"(?i)\b(?:items? \d+ of )?issues? #?\d+|(?<![\w#&/])#\d{1,4}\b")
UPSTREAM = re.compile(r"(?i)\b(?:sglang|slime|verl|vllm|megatron(?:-lm|-core)?|pytorch|torch|transformers|trl|"
                      r"openrlhf|areal|nemo-rl|deepspeed|triton|flash-attention|verifiers|hydra|setuptools|pip|"
                      r"github)(?:'s)?\s*(?:issue|pr|pull request)?\s*$")
CITATIONS_LEFT: dict[str, list[str]] = {}
"""Files allowed to keep tracker citations (none: a new entry needs a reason)."""


def top_level_modules(pkg: Path = ROOT / "scalerl_mega") -> list[str]:
    """The package's top-level `.py` modules (not `__init__.py`; subpackages are one place each, not counted)."""
    return sorted(p.name for p in pkg.glob("*.py") if p.name != "__init__.py")


def test_the_package_has_at_most_twenty_top_level_modules():
    mods = top_level_modules()
    assert len(mods) <= MAX_TOP_LEVEL_MODULES, (len(mods), mods)


def test_docs_has_at_most_eight_pages():
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) <= MAX_DOCS_PAGES, (len(pages), pages)


def short_subprocess_timeouts(path: Path) -> list[str]:
    """`file:line: N` for each `subprocess.run/check_output/check_call/call(..., timeout=N)` with N below
    MIN_SUBPROCESS_TIMEOUT_S (a timeout that can fire on honest work under load)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"run", "check_output", "check_call", "call"}
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"):
            for kw in node.keywords:
                if kw.arg == "timeout" and isinstance(kw.value, ast.Constant) and \
                        isinstance(kw.value.value, (int, float)) and kw.value.value < MIN_SUBPROCESS_TIMEOUT_S:
                    out.append(f"{path.relative_to(ROOT)}:{kw.value.lineno}: {kw.value.value}")
    return out


def test_subprocess_timeouts_in_tests_are_safety_nets():
    bad = [hit for p in sorted((ROOT / "tests").rglob("*.py")) for hit in short_subprocess_timeouts(p)]
    assert bad == []


def test_the_timeout_check_sees_a_short_one(tmp_path, monkeypatch):
    f = tmp_path / "t.py"
    f.write_text("import subprocess\nsubprocess.run(['true'],\n               timeout=120)\n"
                 "subprocess.run(['true'], timeout=600)\nq.get(timeout=1)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert short_subprocess_timeouts(f) == ["t.py:3: 120"]


def tracker_citations(text: str) -> list[str]:
    """Citations of this project's tracker in `text` (upstream projects' issue numbers are not)."""
    return [m.group(0) for m in TRACKER.finditer(text) if not UPSTREAM.search(text[max(0, m.start() - 40):m.start()])]


def test_tracker_citations_by_hand():
    assert tracker_citations('"""Checkpoint faults (issue 16): a torn save."""') == ["issue 16"]
    assert tracker_citations("routing replay (issue #19), item 3 of issue 58; Issue 49: x; see #58.") == \
        ["issue #19", "item 3 of issue 58", "Issue 49", "#58"]
    assert tracker_citations("sglang#31894, slime #1641, verl #7167, vLLM issue #16798, color '#000000'") == []
    assert tracker_citations("the 2 issues 3 times") == ["issues 3"]  # a false alarm is cheap to reword


def _cited_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("scalerl_mega", "tests"):
        files += sorted(p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".sh"))
    return [p for p in files if p != Path(__file__).resolve()]  # this file spells citations out as examples


def test_no_tracker_citations():
    found = {}
    for p in _cited_files():
        hits = tracker_citations(p.read_text())
        if hits:
            found[str(p.relative_to(ROOT))] = hits
    left = {k: v for k, v in found.items() if CITATIONS_LEFT.get(k) != v}
    assert left == {}, left
    assert not [k for k in CITATIONS_LEFT if k not in found], "a file of CITATIONS_LEFT is clean now: drop it"
