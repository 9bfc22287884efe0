"""No broad exception handler in the package swallows silently: an `except Exception`, `except
BaseException` or bare `except:` must re-raise, log, or use the caught exception (report it as a value: the
reward pool's per-item error result, the emulated server's 500 body, a child's ("error", message)). Found by
the AST, so a `try: ... except Exception: pass` cannot come back.

`REPORTED_OTHERWISE` lists the handlers that report by other means, each with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scalerl_mega"
BROAD = {"Exception", "BaseException"}
LOG_CALLS = {"debug", "info", "warning", "error", "exception", "critical", "warn"}

REPORTED_OTHERWISE = {
    "scalerl_mega/rewards/deadline.py:_child_main":
        "the forked child's last resort: exit status 1, which the parent reports as ('crash', 1)",
}


def _is_broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in BROAD or isinstance(t, ast.Attribute) and t.attr in BROAD
               for t in types)


def _handles(handler: ast.ExceptHandler) -> bool:
    """Re-raises, logs, or uses the bound exception."""
    for node in (n for stmt in handler.body for n in ast.walk(stmt)):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOG_CALLS:
            return True
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
            return True
    return False


def silent_broad_handlers(source: str, *, where: str) -> list[str]:
    """`<where>:<function>:<line>` of every broad handler in `source` that neither re-raises, logs nor uses
    the exception (module-level handlers are named `<module>`)."""
    tree = ast.parse(source)
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.ExceptHandler) and _is_broad(child) and not _handles(child):
                found.append(f"{where}:{function}:{child.lineno}")
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_the_finder_flags_swallowing_and_passes_handling():
    src = '''
import logging
log = logging.getLogger()
def quiet():
    try:
        f()
    except Exception:  # swallowed
        pass
    try:
        f()
    except:
        x = 1
    try:
        f()
    except (ValueError, BaseException):
        return None
def fine(items):
    try:
        f()
    except Exception:
        log.warning("f failed")
    try:
        f()
    except BaseException:
        cleanup()
        raise
    try:
        f()
    except Exception as e:
        items.append(str(e))
    try:
        f()
    except ValueError:  # a named error may be handled quietly
        pass
    try:
        f()
    except Exception as e:  # bound but unused: still silent
        pass
'''
    assert silent_broad_handlers(src, where="m.py") == ["m.py:quiet:7", "m.py:quiet:11", "m.py:quiet:15",
                                                        "m.py:fine:37"]


def test_no_broad_except_in_the_package_swallows_silently():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT.parent))
        found += silent_broad_handlers(path.read_text(), where=rel)
    listed = [f for f in found if f.rsplit(":", 1)[0] in REPORTED_OTHERWISE]
    assert [f for f in found if f not in listed] == []
    assert sorted({f.rsplit(":", 1)[0] for f in listed}) == sorted(REPORTED_OTHERWISE)  # no stale entries
