"""The package stays readable in pieces (issue #25): no file over 600 lines, no function over 80 and only a handful
over 60, and few parameters typed `Any`.

    python tests/unit/test_code_sizes.py     # print the counts and the largest files and functions
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scalerl_mega"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 5
MAX_ANY_PARAMETERS = 30  # 198 before the one-house redesign, 64 before issue 48


def measure(root: Path = ROOT) -> dict[str, list]:
    """Files with their line counts, functions with theirs, and the parameters annotated plainly `Any`."""
    files, functions, any_params = [], [], []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(root.parent))
        files.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                any_params += [f"{rel}:{node.name}({a.arg})" for a in args
                               if a.annotation is not None and ast.unparse(a.annotation) == "Any"]
    return {"files": sorted(files, reverse=True), "functions": sorted(functions, reverse=True), "any": any_params}


def test_measure_counts_lines_functions_and_any(tmp_path):
    pkg = tmp_path / "scalerl_mega"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    (pkg / "m.py").write_text(f"from typing import Any\n\n\ndef f(a: Any, *, b: int, c: 'Any') -> None:\n{body}\n")
    m = measure(pkg)
    assert m["files"] == [(7, "scalerl_mega/m.py")]
    assert m["functions"] == [(4, "scalerl_mega/m.py:f")]
    assert m["any"] == ["scalerl_mega/m.py:f(a)"]  # a string annotation is not the plain name


def test_no_file_over_600_lines():
    assert [f for f in measure()["files"] if f[0] > MAX_FILE_LINES] == []


def test_no_function_over_80_lines_and_few_over_60():
    functions = measure()["functions"]
    assert [f for f in functions if f[0] > MAX_FUNCTION_LINES] == []
    assert len([f for f in functions if f[0] > LONG_FUNCTION_LINES]) <= MAX_LONG_FUNCTIONS


def test_any_parameters_stay_at_most_half_of_the_old_count():
    assert len(measure()["any"]) <= MAX_ANY_PARAMETERS


if __name__ == "__main__":  # pragma: no cover - a report for people
    m = measure()
    print(f"{len(m['files'])} files; largest: " + ", ".join(f"{p} {n}" for n, p in m["files"][:5]))
    long = [f for f in m["functions"] if f[0] > LONG_FUNCTION_LINES]
    print(f"{len(m['functions'])} functions; over {LONG_FUNCTION_LINES} lines: "
          + (", ".join(f"{p} {n}" for n, p in long) or "none"))
    print(f"parameters typed Any: {len(m['any'])}")
