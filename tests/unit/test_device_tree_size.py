"""What a GPU session sends to the device machine stays under 60 MiB: the tracked tree (`git ls-files`) plus the
wheels of `make gpu-wheels` (tools/gpu_check.sh installs them there; the machine has no network). The
device takes at most 64 MiB; 60 leaves room for an untracked file or two.

The wheels need the package index: the default-suite test counts `GPU_WHEELS_BUDGET_MIB` for them (or the
wheels in .whl/ when those are bigger), and the `network` test downloads them (`make gpu-wheels` into a
temporary directory) and holds the real size to that budget, so the budget cannot drift from the list.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT_MIB = 60.0
GPU_WHEELS_BUDGET_MIB = 25.0
"""Size of `make gpu-wheels` for cp312, measured 2026-11-28 at 22.5 MiB (19 wheels: megatron-core, omegaconf,
antlr4 and tools/gpu_check.sh's RL stage's transformers, tokenizers, hydra-core, ...), rounded up."""
MIB = 2**20


def tracked_bytes() -> tuple[int, Counter]:
    """Bytes of the tracked files present in the work tree, and per top-level directory."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    total, per_dir = 0, Counter()
    for name in filter(None, names.decode().split("\0")):
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            size = path.stat().st_size
            total += size
            per_dir[name.split("/")[0] if "/" in name else "."] += size
    return total, per_dir


def _biggest(per_dir: Counter) -> str:
    return ", ".join(f"{d} {b / MIB:.1f} MiB" for d, b in per_dir.most_common(5))


def _wheel_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.whl"))


def test_tracked_tree_plus_gpu_wheels_fit_the_device():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no tracked tree to measure")
    tracked, per_dir = tracked_bytes()
    local = REPO / ".whl"
    wheels = max(GPU_WHEELS_BUDGET_MIB * MIB, _wheel_bytes(local) if local.is_dir() else 0)
    total = (tracked + wheels) / MIB
    assert total <= LIMIT_MIB, (f"device tree {total:.1f} MiB > {LIMIT_MIB}: tracked {tracked / MIB:.1f} MiB "
                                f"(biggest: {_biggest(per_dir)}) + gpu wheels {wheels / MIB:.1f} MiB")


@pytest.mark.network
def test_gpu_wheels_download_within_their_budget(tmp_path):
    """`make gpu-wheels` from the index: every wheel is there (one per listed package) and their size is within
    GPU_WHEELS_BUDGET_MIB; with the tracked tree, under the limit."""
    proc = subprocess.run(["make", "-s", "gpu-wheels", f"GPU_WHEELS={tmp_path}", f"PYTHON={sys.executable}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    names = sorted(p.name.split("-")[0].lower().replace("_", "-") for p in tmp_path.glob("*.whl"))
    for want in ("megatron-core", "omegaconf", "antlr4-python3-runtime", "hydra-core", "transformers", "tokenizers"):
        assert want in names, (want, names)
    wheels = _wheel_bytes(tmp_path)
    assert wheels <= GPU_WHEELS_BUDGET_MIB * MIB, f"gpu wheels {wheels / MIB:.1f} MiB exceed the budget: {names}"
    if (REPO / ".git").exists():
        tracked, per_dir = tracked_bytes()
        assert (tracked + wheels) / MIB <= LIMIT_MIB, _biggest(per_dir)
