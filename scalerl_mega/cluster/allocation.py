"""Slurm allocation helpers: hostlist expansion and the generator/trainer node split.

``slurm/common.sh`` uses ``scontrol show hostnames`` when a controller is reachable and falls back to
``python -m scalerl_mega.cluster.allocation hostnames <nodelist>`` (e.g. DRY_RUN on a laptop).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(nodelist: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in nodelist:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"nodelist {nodelist!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"nodelist {nodelist!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    prefix, suffix = item[: m.start()], item[m.end():]
    out = []
    for rng in m.group(1).split(","):
        r = _RANGE.match(rng.strip())
        if not r:
            raise ValueError(f"nodelist {whole!r}: bad range {rng!r}")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"nodelist {whole!r}: descending range {rng!r}")
        width = len(lo) if lo.startswith("0") else 0
        for i in range(int(lo), int(hi) + 1):
            for rest in _expand_one(prefix + str(i).zfill(width) + suffix, whole):
                out.append(rest)
    return out


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[01-03,07],cpu1`` -> ``['gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu1']`` (Slurm hostlist syntax)."""
    if not nodelist.strip():
        raise ValueError("nodelist is empty (SLURM_JOB_NODELIST unset?)")
    out: list[str] = []
    for item in _split_top(nodelist):
        out.extend(_expand_one(item, nodelist))
    return out


@dataclass(frozen=True, kw_only=True)
class NodeSplit:
    generator_nodes: tuple[str, ...]
    trainer_nodes: tuple[str, ...]
    shared: bool  # one node runs both roles (CPU runs, single-node tests)


def split_nodes(nodes: list[str], *, trainer_nodes: int) -> NodeSplit:
    """The last ``trainer_nodes`` nodes train, the others generate; a single node does both."""
    if trainer_nodes < 1:
        raise ValueError(f"trainer_nodes={trainer_nodes} must be >= 1")
    if len(nodes) == 1:
        return NodeSplit(generator_nodes=tuple(nodes), trainer_nodes=tuple(nodes), shared=True)
    if trainer_nodes >= len(nodes):
        raise ValueError(f"trainer_nodes={trainer_nodes} leaves no generator node among {len(nodes)} nodes")
    cut = len(nodes) - trainer_nodes
    return NodeSplit(generator_nodes=tuple(nodes[:cut]), trainer_nodes=tuple(nodes[cut:]), shared=False)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "hostnames":
        print("usage: python -m scalerl_mega.cluster.allocation hostnames <nodelist>", file=sys.stderr)
        return 1
    try:
        print("\n".join(expand_nodelist(args[1])))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
