"""The README, docs/ and the code's docs cite only files of this repository (a fresh clone has no others)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"DESIGN\.md|reference/[A-Z_]+\.md|/work/shared|shared/reference")
# a path after `<commit>:` (`git show 7ab7997:bench/x.py`) names a file at that commit, not in the tree
REPO_PATH = re.compile(r"(?<![\w/.:])((?:scalerl_mega|tools|conf|tests|bench|slurm|hydra_plugins)/[\w/.-]*\w\.(?:py|yaml|sh|md|json))(?![\w])")
PENDING: set[str] = set()

ABSENT_ON_PURPOSE = {"hydra_plugins/__init__.py", "bench/out/fused_cispo_gpu.json"}  # bench/out: written by make bench-gpu  # "no `hydra_plugins/__init__.py`": a namespace package


def _docs() -> list[Path]:
    files = [REPO / "README.md", REPO / "Makefile", REPO / "setup.py", *sorted((REPO / "docs").glob("*.md"))]
    for top in ("scalerl_mega", "tools", "conf", "bench", "slurm", "hydra_plugins"):
        files += [p for p in (REPO / top).rglob("*") if p.suffix in (".py", ".yaml", ".sh", ".md")]
    return [p for p in files if p.is_file() and "__pycache__" not in p.parts]


def test_no_citation_of_files_outside_the_repo():
    bad = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _docs() if str(p.relative_to(REPO)) not in PENDING
           for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert bad == []


def test_cited_repo_paths_exist():
    missing = sorted({f"{p.relative_to(REPO)}: {m}" for p in _docs() for m in REPO_PATH.findall(p.read_text())
                      if not (REPO / m).exists() and m not in ABSENT_ON_PURPOSE})
    assert missing == []


def test_a_path_at_a_commit_is_not_a_citation_of_the_tree():
    text = "restore with `git show 7ab7997:bench/gone.py > x.py`; see bench/fit.py and (`tools/plan.py`)"
    assert REPO_PATH.findall(text) == ["bench/fit.py", "tools/plan.py"]
