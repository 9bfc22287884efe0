"""The package's static call graph, read from the source (nothing imported): which `scalerl_mega` functions a
function calls, resolved through module-level and function-level imports, `module.f`, `Class(...)` (its
`__init__` / `__post_init__`), `self.method` and nested functions the function itself calls. Bodies of nested
functions it only hands on (closures, callbacks run later) are not followed: they do not run where it is called.
Used by test_validate_checks.py to find every check the run makes before its first step wherever it is made."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "scalerl_mega"
Key = tuple[str, str]
"""(module, qualified name), e.g. ("scalerl_mega.train", "main._entry")."""
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@lru_cache(maxsize=None)
def module(name: str) -> tuple[dict, dict] | None:
    """(top-level defs by name, module-level imports name -> (module, attr)) of package module `name`."""
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            tree = ast.parse(path.read_text())
            defs = {n.name: n for n in tree.body if isinstance(n, DEFS)}
            imports: dict = {}
            for n in tree.body:
                _imports(n, imports)
            return defs, imports
    return None


def _imports(node: ast.AST, out: dict) -> None:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for a in node.names:
            out[a.asname or a.name] = (node.module, a.name)
    elif isinstance(node, ast.Import):
        for a in node.names:
            out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)


def _lookup(mod: str, name: str, depth: int = 0) -> tuple | None:
    """('def' | 'class' | 'module', module, name) that `name` is in module `mod` (following re-exports)."""
    if depth > 8 or not mod.startswith(PKG) or module(mod) is None:
        return None
    defs, imports = module(mod)
    if name in defs:
        return ("class" if isinstance(defs[name], ast.ClassDef) else "def", mod, name)
    if name in imports:
        return _target(*imports[name], depth + 1)
    return ("module", f"{mod}.{name}", None) if module(f"{mod}.{name}") is not None else None


def _target(mod: str, attr: str | None, depth: int = 0) -> tuple | None:
    if attr is None:
        return ("module", mod, None) if module(mod) is not None else None
    return _lookup(mod, attr, depth)


def node_of(key: Key) -> ast.AST | None:
    mod, qual = key
    if module(mod) is None:
        return None
    parts = qual.split(".")
    node = module(mod)[0].get(parts[0])
    for p in parts[1:]:
        node = next((c for c in getattr(node, "body", []) if getattr(c, "name", None) == p), None)
    return node


def _direct(fn: ast.AST):
    """The nodes of `fn`'s body, not those of nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        if isinstance(n, (*DEFS, ast.Lambda)):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def callees(key: Key) -> list[Key]:
    mod, qual = key
    fn = node_of(key)
    if fn is None or isinstance(fn, ast.ClassDef):
        return []
    owner = qual.rsplit(".", 1)[0] if "." in qual else None
    nested = {n.name for n in fn.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    local: dict = {}
    body = list(_direct(fn))
    for n in body:
        _imports(n, local)

    def resolve(node: ast.AST) -> tuple | None:
        if isinstance(node, ast.Name):
            if node.id in nested:
                return ("def", mod, f"{qual}.{node.id}")
            return _target(*local[node.id]) if node.id in local else _lookup(mod, node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and owner:
                return ("def", mod, f"{owner}.{node.attr}")
            base = resolve(node.value)
            if base is not None and base[0] == "module":
                return _lookup(base[1], node.attr)
            if base is not None and base[0] == "class":
                return ("def", base[1], f"{base[2]}.{node.attr}")
        return None

    out = []
    for n in body:
        if not isinstance(n, ast.Call):
            continue
        t = resolve(n.func)
        if t is None:
            continue
        names = [t[2]] if t[0] == "def" else [f"{t[2]}.__init__", f"{t[2]}.__post_init__"] if t[0] == "class" else []
        out += [(t[1], q) for q in names if node_of((t[1], q)) is not None]
    return out


def reach(roots: list[Key], *, stop: tuple[str, ...] = ()) -> set[Key]:
    """Every function reachable from `roots`, not entering functions named in `stop`."""
    seen: set[Key] = set()
    todo = list(roots)
    while todo:
        k = todo.pop()
        if k in seen or k[1].rsplit(".", 1)[-1] in stop:
            continue
        seen.add(k)
        todo += callees(k)
    return seen


def raises(key: Key) -> list[str]:
    """The exceptions `key`'s own body raises (`raise X(...)`), as source text."""
    fn = node_of(key)
    return [ast.unparse(n.exc) for n in _direct(fn) if isinstance(n, ast.Raise) and n.exc is not None]
