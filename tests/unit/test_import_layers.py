"""The package's layers point only down (docs/architecture.md): every own-package import, at module level or
inside a function, goes to the importer's layer or a lower one; the component packages of layer 1 do not
import each other; and the import graph has no circles.

    python tests/unit/test_import_layers.py        # print the graph's counts and any offending edge

Layers, lowest first (a module takes the layer of the longest matching prefix):
  0 base       shared records and pure code: types, the typed config (config/), objective/, scaling/,
               the pure conversion tables, process utilities
  1 components data/, rewards/, rollout/, trainer/, metrics/, cluster/; they do not know each other.
  1.5 tools    built over one component: convert/'s I/O reads the trainer's checkpoints; sglang_emulation/
               serves the local engine (rollout/) behind SGLang's HTTP API.
  2 assembly   build (config groups -> components), loop with its in-flight tracker (inflight) and held-out
               validation (heldout), sft, run_dir, report, compose, episodes/ (multi-turn episodes over the
               engines, their environments in the reward pool)
  3 entry      train, serve, the launch check, the meta-device dry run, scaling.cli, gguf_import
The reproduction (reproduction/, a tool beside the package) is not part of the package: nothing here imports it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = "scalerl_mega"
ROOT = Path(__file__).resolve().parents[2] / PKG

BASE, COMPONENT, TOOL, ASSEMBLY, ENTRY = 0.0, 1.0, 1.5, 2.0, 3.0
LAYERS: dict[str, float] = {
    "": BASE,  # the package root (__init__) and anything unlisted below is base: listed modules say otherwise
    "types": BASE, "interfaces": BASE, "batch": BASE, "preemption": BASE, "conf_path": BASE, "jsonvalue": BASE,
    "config": BASE, "objective": BASE, "scaling": BASE, "weight_sync": BASE, "model": BASE,
    "convert.dims": BASE, "convert.layout": BASE, "convert.tables": BASE, "convert.hf_layout": BASE,
    "convert.sharding": BASE, "convert.model_config": BASE, "convert.tiny": BASE, "convert.deepseek_dims": BASE,
    "convert.hybrid_dims": BASE, "convert.gdn_layout": BASE,
    "data": COMPONENT, "rewards": COMPONENT, "rollout": COMPONENT, "sglang_emulation": TOOL,
    "trainer": COMPONENT, "metrics": COMPONENT, "cluster": COMPONENT,
    "convert": TOOL,
    "build": ASSEMBLY, "loop": ASSEMBLY, "inflight": ASSEMBLY, "heldout": ASSEMBLY, "sft": ASSEMBLY,
    "run_dir": ASSEMBLY, "preflight": ASSEMBLY, "report": ASSEMBLY, "compose": ASSEMBLY, "episodes": ASSEMBLY,
    "train": ENTRY, "serve": ENTRY, "cluster.launch_config": ENTRY, "dry_run": ENTRY, "scaling.cli": ENTRY,
    "gguf_import": ENTRY,
}
COMPONENTS = ("data", "rewards", "rollout", "trainer", "metrics", "cluster")
NAMES = {BASE: "base", COMPONENT: "component", TOOL: "tool", ASSEMBLY: "assembly", ENTRY: "entry"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name (without the package prefix; '' for the root) -> file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, *, mod: str, is_pkg: bool, known: dict[str, Path]) -> list[str]:
    """Own-package modules an import statement loads (relative imports resolved; `from pkg import name`
    counts the submodule `pkg.name` when it exists, else `pkg`)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name == PKG or a.name.startswith(PKG + ".")]
        names = [n[len(PKG) + 1:] if n != PKG else "" for n in names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = mod.split(".") if mod else []
            if not is_pkg:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        elif node.module and (node.module == PKG or node.module.startswith(PKG + ".")):
            target = node.module[len(PKG) + 1:] if node.module != PKG else ""
        else:
            return []
        for a in node.names:
            sub = f"{target}.{a.name}" if target else a.name
            names.append(sub if sub in known else target)
    out = []
    for n in names:
        while n not in known and n:
            n = n.rpartition(".")[0]
        out.append(n)
    return out


def import_graph(root: Path = ROOT, *, annotations: bool = False) -> dict[str, set[str]]:
    """Module -> own-package modules it imports anywhere in its body (module level and inside functions;
    `if TYPE_CHECKING:` blocks are annotations only: skipped unless `annotations`, which counts them too, as a
    reader of the code does)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if not annotations and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                edges.update(_targets(node, mod=mod, is_pkg=path.name == "__init__.py", known=known))
        edges.discard(mod)
        graph[mod] = edges
    return graph


def layer_of(mod: str) -> float:
    best = ""
    for prefix in LAYERS:
        if (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return LAYERS[best]


def component_of(mod: str) -> str | None:
    top = mod.split(".")[0]
    return top if top in COMPONENTS and layer_of(mod) == COMPONENT else None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b (layer x -> y)` for every import of a higher layer, or of a sibling component."""
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a), layer_of(b)
            if lb > la:
                out.append(f"{a} -> {b} ({NAMES[la]} -> {NAMES[lb]})")
            elif component_of(a) and component_of(b) and component_of(a) != component_of(b):
                out.append(f"{a} -> {b} (component -> another component)")
    return out


def test_the_graph_is_read_from_the_code():
    """The parser sees module-level, function-local and relative imports (a check that cannot pass on an
    empty graph)."""
    graph = import_graph()
    assert len(graph) > 50
    assert "types" in graph["data.split"]  # module level
    assert "build" in graph["train"]  # inside a function
    assert sum(len(e) for e in graph.values()) > 150


def unknown_layers(known: dict[str, Path] | None = None) -> list[str]:
    """LAYERS keys that name no module or package: a renamed module must not leave a stale entry behind (its code
    would fall back to the base layer unnoticed)."""
    known = modules() if known is None else known
    return sorted(k for k in LAYERS if k and not any(m == k or m.startswith(k + ".") for m in known))


def test_every_layer_name_matches_a_module():
    assert unknown_layers() == []
    assert unknown_layers({"types": Path("types.py")}) == sorted(k for k in LAYERS if k and k != "types")


ANNOTATION_CIRCLES_LEFT = [["rollout.sglang.engine", "rollout.sglang.multi_groups"]]
"""Circles closed only by a `TYPE_CHECKING` import in files being reworked elsewhere now; empty it when they
go."""


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_no_import_circles_even_through_annotations():
    """A circle closed by a `TYPE_CHECKING` import still ties two modules together for a reader: counted too."""
    assert [c for c in circles(import_graph(annotations=True)) if c not in ANNOTATION_CIRCLES_LEFT] == []


def test_imports_only_point_down():
    assert upward(import_graph()) == []


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / PKG
    for rel, text in {
        "__init__.py": "",
        "types.py": "def f():\n    from scalerl_mega import train\n",  # base -> entry, inside a function
        "train.py": "from scalerl_mega.types import f\n",
        "data/__init__.py": "",
        "data/a.py": "from ..rewards import b\n",  # relative, component -> component
        "rewards/__init__.py": "",
        "rewards/b.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (pkg / "types.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalerl_mega import train\n")
    assert circles(import_graph(pkg)) == [] and circles(import_graph(pkg, annotations=True)) == [["train", "types"]]
    (pkg / "types.py").write_text("def f():\n    from scalerl_mega import train\n")
    graph = import_graph(pkg)
    assert circles(graph) == [["train", "types"]]
    assert upward(graph) == ["data.a -> rewards.b (component -> another component)",
                             "types -> train (base -> entry)"]


if __name__ == "__main__":  # pragma: no cover - a report for people
    g = import_graph()
    local = sum(len(e) for e in g.values())
    print(f"{len(g)} modules, {local} import edges")
    for c in circles(g):
        print("circle:", " -> ".join(c))
    for c in circles(import_graph(annotations=True)):
        print("circle through an annotation-only import:", " -> ".join(c))
    for u in upward(g):
        print("upward:", u)
    sys.exit(1 if circles(g) or upward(g) else 0)
