"""The session-level check of tests/conftest.py: a process a test starts and leaves running fails the
session, names the process, and is killed -- in a plain session and under `-n 2 --dist loadfile`
(where each xdist worker checks its own descendants and pytest's own workers are not flagged).

Each case runs an inner pytest session in a subprocess, in a directory holding a copy of this
repository's tests/conftest.py and two test files: one leaks `sleep 300`, one does nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.preemption import is_running

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

LEAKY = '''
import subprocess
from pathlib import Path


def test_leaks_a_sleep():
    proc = subprocess.Popen(["sleep", "300"])
    Path("leaked.pid").write_text(str(proc.pid))
'''
CLEAN = '''
def test_clean():
    assert 1 + 1 == 2
'''


@pytest.mark.parametrize("xdist", [["-p", "no:xdist"], ["-n", "2", "--dist", "loadfile"]], ids=["plain", "xdist"])
def test_leaked_process_fails_the_session_and_is_killed(tmp_path, xdist):
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    (tmp_path / "test_clean.py").write_text(CLEAN)
    env = dict(os.environ, SCALERL_LEAK_GRACE_S="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    pid = None
    try:
        inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        pid = int((tmp_path / "leaked.pid").read_text())
        out = inner.stdout + inner.stderr
        assert "2 passed" in out, out  # the tests themselves pass ...
        assert inner.returncode == 1, out  # ... the session fails
        leaks = [line for line in out.splitlines() if line.strip().endswith("sleep 300")]
        assert leaks == [next(x for x in leaks if f"pid {pid}: sleep 300" in x)], out  # only the sleep
        if xdist[0] == "-n":
            assert leaks[0].startswith("[gw"), out  # reported by the worker that ran the leaky file
        assert not is_running(pid), "the check did not kill the leaked process"
    finally:
        if pid is not None and is_running(pid):
            os.kill(pid, signal.SIGKILL)

