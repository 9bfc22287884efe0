"""The processes a trainer starts leave SIGTERM/SIGINT to it and die with it (scalerl_mega/preemption.py).
Each case runs a small parent script in its own process group and talks to it over its
stdout; real processes, real signals, no sleeps: every wait polls with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerl_mega.preemption import describe_process, is_running

REPO = Path(__file__).resolve().parents[2]

PARENT = textwrap.dedent('''
    import multiprocessing as mp
    import os
    import signal
    import sys
    import time

    from scalerl_mega.preemption import child_setup, shielded, start_child


    def child(parent_pid, conn):
        child_setup(parent_pid, name="test child", every_s=0.2)
        while True:
            conn.send(("pong", conn.recv()))


    def forked():
        time.sleep(300)


    if __name__ == "__main__":
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda num, _: print(f"parent got {signal.Signals(num).name}", flush=True))
        ours, theirs = mp.Pipe()
        proc = mp.get_context("spawn").Process(target=child, args=(os.getpid(), theirs), daemon=True)
        start_child(proc)
        with shielded():  # a child Python forks here (Megatron's checkpoint writers) gets PR_SET_PDEATHSIG
            fork = mp.get_context("fork").Process(target=forked, daemon=True)
            fork.start()
        ours.send(0)
        assert ours.recv() == ("pong", 0)
        print(proc.pid, fork.pid, flush=True)
        for line in sys.stdin:  # the test's commands
            if line.startswith("ping"):
                ours.send(1)
                print(ours.recv(), flush=True)
            elif line.startswith("exit"):
                fork.kill()  # SIGTERM stays blocked in it: its creator ends it (as Megatron joins its writers)
                fork.join()
                sys.exit(0)  # without closing the spawned child: the interpreter's exit must neither hang nor leak
''')


def _line(proc: subprocess.Popen, timeout_s: float = 120.0) -> str:
    """The parent's next stdout line, or AssertionError after `timeout_s` (the forked child shares the
    pipe, so a dead parent does not mean EOF)."""
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line from the parent within {timeout_s} s"
    return proc.stdout.readline()


def _wait_gone(pids: list[int], *, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (alive := [p for p in pids if is_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture
def parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, bufsize=1)
    kids: list[int] = []
    try:
        line = _line(proc)
        assert line.split() and all(x.isdigit() for x in line.split()), f"parent did not start: {line!r}"
        kids = [int(x) for x in line.split()]
        yield proc, kids
    finally:
        for pid in [proc.pid, *kids]:
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_group_sigterm_and_sigint_leave_the_child_running(parent):
    proc, (child, _) = parent
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: parent, spawned child, forked child
    assert _line(proc) == "parent got SIGTERM\n"
    os.killpg(proc.pid, signal.SIGINT)
    assert _line(proc) == "parent got SIGINT\n"
    proc.stdin.write("ping\n")
    assert _line(proc) == "('pong', 1)\n"  # answered after both signals had been sent
    assert is_running(child)


def test_kill_9_of_the_parent_takes_spawned_and_forked_children_within_5_s(parent):
    proc, kids = parent
    os.killpg(proc.pid, signal.SIGTERM)  # ignored by both (the forked one inherits the blocked mask)
    assert _line(proc) == "parent got SIGTERM\n"
    proc.kill()
    proc.wait()
    assert not _wait_gone(kids, within_s=5.0), [describe_process(p) for p in kids if is_running(p)]


def test_parent_exit_without_close_does_not_hang_and_kills_the_child(parent):
    """multiprocessing's exit handler would SIGTERM the daemonic child (ignored) and join it forever;
    `start_child`'s exit handler SIGKILLs it first."""
    proc, kids = parent
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    assert proc.wait(timeout=600) == 0
    assert not _wait_gone(kids[:1], within_s=5.0)
