"""`make help` (the Makefile's default goal) shows a newcomer the two commands first, and names only real targets."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_help_lists_the_two_commands_first_and_only_real_targets():
    out = subprocess.run(["make", "-s", "-C", str(ROOT)], capture_output=True, text=True, timeout=600).stdout
    listed = re.findall(r"^  ([a-z][\w-]*)", out, re.M)
    listed += re.findall(r"^  [a-z][\w-]*\s.*?\s{3,}([a-z][\w-]+)\s{2,}", out, re.M)  # two targets on one line
    assert listed[:2] == ["demo", "test"], out
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert set(listed) <= targets, sorted(set(listed) - targets)
    assert {"demo", "test", "test-slow", "test-sglang", "test-slurm", "reproduce", "bench"} <= set(listed)
