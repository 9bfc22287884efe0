"""SIGTERM (Slurm preemption, time limit, `scancel`) and Ctrl-C (SIGINT): checkpoint at the next safe point,
then exit 0 (SIGTERM) or 130 (Ctrl-C; a second Ctrl-C exits at once, without a checkpoint).

`Preemption.install(grace_s=...)` replaces the SIGTERM and SIGINT handlers of this process. The handler only
records the request (Ctrl-C before the RL loop, when there is nothing to checkpoint, stops at once); the RL
loop polls `requested` at its safe points (while it waits for generations, and at the end of every step),
saves a checkpoint there, stops the engines and reward workers it started and returns, and `scalerl-train`
exits 0 after SIGTERM, so a requeued job resumes (`resume=auto`), or 130 after Ctrl-C. If no safe point comes within `grace_s` seconds (a step stuck in a collective), a
watchdog kills every process this one started and exits with 143 (128 + SIGTERM): the previous
checkpoint stays the newest complete one. Follower ranks of a multi-rank job install it too: they keep
serving the controller's commands (its checkpoint save is collective) until it releases them.

Slurm signals every process of the step (`scancel`, the time limit; a terminal's Ctrl-C or
`kill -TERM -<pgid>` signals the whole process group), not only the trainer. The processes the
trainer starts -- local engine, reward workers, Megatron's checkpoint writers and its results-queue
manager -- therefore ignore SIGTERM and SIGINT and leave the decision to the trainer, which stops them
after its checkpoint. They are created under `shielded()` (SIGTERM/SIGINT blocked in the creating
thread, so the child starts with them blocked: no window before its entry runs; `start_child`) and their entry
calls `child_setup` first (SIG_IGN for both, then unblock: a signal that arrived meanwhile is
dropped) -- the same scheme as CPython's multiprocessing resource tracker. `child_setup` also
starts `watch_parent`: the child exits (ORPHAN_EXIT_CODE) within `every_s` of its parent's death,
even when the parent was `kill -9`ed and no cleanup code ran there. It polls `os.getppid()` rather
than using PR_SET_PDEATHSIG, which fires when the parent *thread* that created the child exits;
`set_pdeathsig` is for a child forked by a thread that lives as long as its process (the reward
workers' math-verify children, `rewards/deadline.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("scalerl_mega.preemption")

ORPHAN_EXIT_CODE = 3
"""Exit code of a process that noticed its parent (the trainer, or a rank's launcher) is gone."""
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What a child of the trainer leaves to the trainer (module doc)."""


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Create child processes inside this block: SIGTERM and SIGINT are blocked in the calling thread,
    so children start with them blocked (the mask survives fork and exec) until their entry runs
    `child_setup`. A signal for this process meanwhile is not lost: another thread takes it, or it
    is delivered when the block ends. Children that Python forks here without exec (multiprocessing's
    "fork" context, e.g. Megatron's checkpoint writers) also get PR_SET_PDEATHSIG: they die with
    this thread (`set_pdeathsig`); they keep SIGTERM blocked, so their creator must join or SIGKILL
    them (Megatron joins its writers within the save)."""
    global _FORK_PARENT
    _prctl()  # resolved here: the forked child must not take the dynamic loader's lock
    old = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    outer, _FORK_PARENT = _FORK_PARENT, os.getpid()
    try:
        yield
    finally:
        _FORK_PARENT = outer
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_FORK_PARENT: int | None = None


def _after_fork_in_child() -> None:
    if _FORK_PARENT is not None:
        set_pdeathsig(_FORK_PARENT)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_STARTED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def start_child(proc: Any) -> None:
    """`proc.start()` for a multiprocessing Process whose target calls `child_setup` first: under
    `shielded()`, and SIGKILLed at interpreter exit if still running -- multiprocessing's own exit
    handler would `terminate()` (SIGTERM, which such a child ignores) and then wait for it forever.
    (atexit runs handlers last-registered first: ours is registered after multiprocessing's.)"""
    with shielded():
        proc.start()
    if not _STARTED:
        atexit.unregister(_kill_started)
        atexit.register(_kill_started)
    _STARTED.add(proc)


def _kill_started() -> None:
    for proc in list(_STARTED):
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def child_setup(parent_pid: int, *, name: str, every_s: float = 0.5) -> None:
    """First call in the entry of a process the trainer started: ignore SIGTERM/SIGINT (the trainer
    coordinates shutdown) and exit when `parent_pid` is no longer the parent (`watch_parent`)."""
    for sig in GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)
    watch_parent(parent_pid, name=name, every_s=every_s)


def watch_parent(parent_pid: int, *, name: str, every_s: float = 0.5) -> threading.Thread:
    """A daemon thread that exits this process (`os._exit(ORPHAN_EXIT_CODE)`, no cleanup: nobody reads
    its pipes any more) once `os.getppid()` differs from `parent_pid`: the parent died and this one
    was re-parented (the old pid is never our parent again, even if reused)."""
    if every_s <= 0:
        raise ValueError(f"watch_parent every_s={every_s} must be > 0")

    def run() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        print(f"scalerl {name} {os.getpid()}: parent {parent_pid} is gone, exiting", file=sys.stderr, flush=True)
        os._exit(ORPHAN_EXIT_CODE)

    thread = threading.Thread(target=run, name=f"scalerl-parent-watch-{parent_pid}", daemon=True)
    thread.start()
    return thread


def set_pdeathsig(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the thread that forked it exits (PR_SET_PDEATHSIG), and exit
    now if `parent_pid` already died before the call. Call right after fork; a no-op elsewhere."""
    prctl = _prctl()
    if prctl is None:
        return
    PR_SET_PDEATHSIG = 1
    if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:  # pragma: no cover
        return
    if os.getppid() != parent_pid:
        os._exit(ORPHAN_EXIT_CODE)


@functools.cache
def _prctl() -> Any:
    """libc's prctl (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def is_running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie, exited but not yet reaped, has)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe_process(pid: int) -> str:
    """`pid <n>: <command line>` (for messages naming a process)."""
    import psutil

    try:
        return f"pid {pid}: {' '.join(psutil.Process(pid).cmdline())[:300]}"
    except psutil.Error:
        return f"pid {pid}: (gone)"


def kill_process_tree(pid: int | None = None) -> int:
    """SIGKILL every descendant of `pid` (default: this process); returns how many were signalled."""
    import psutil

    try:
        children = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return 0
    n = 0
    for child in children:
        try:
            child.kill()
            n += 1
        except psutil.Error:
            pass
    return n


class Preemption:
    """The stop request of this process: SIGTERM and SIGINT (Ctrl-C) alike (see module doc).

    Once `armed` (the RL loop polls `requested` at its safe points; a follower rank serves the controller), a
    signal only records the request: the loop checkpoints and returns, and `scalerl-train` exits with
    `exit_status` (0 after SIGTERM, so a requeued job resumes; 130 after Ctrl-C). Before that (set-up, the SFT
    warm start: nothing to checkpoint yet) Ctrl-C raises KeyboardInterrupt at once, which `scalerl-train` turns
    into one line and exit status 130. A second Ctrl-C after a request exits at once (130), without a checkpoint,
    after killing every process this one started."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        self.grace_s = 0.0
        self.signal: str | None = None
        """The first stop signal's name ("SIGTERM", "SIGINT"), or None."""
        self.armed = False
        """Set by the caller when its safe points poll `requested` (module doc)."""

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def exit_status(self) -> int:
        """The exit status of a launch that stopped on this request: 130 after SIGINT, else 0."""
        return 128 + int(signal.SIGINT) if self.signal == "SIGINT" else 0

    def request(self, signum: int = signal.SIGTERM) -> None:
        """What the handler does (callable directly, e.g. from a test hook)."""
        name = signal.Signals(signum).name
        if self._event.is_set():
            if signum == signal.SIGINT:
                self._exit_now()
            return
        if signum == signal.SIGINT and not self.armed:
            raise KeyboardInterrupt
        self.signal = name
        self._event.set()
        again = " (Ctrl-C again: exit at once, without a checkpoint)" if signum == signal.SIGINT else ""
        log.warning("%s: checkpointing at the next safe point (grace %.0fs, train.sigterm_grace_s)%s", name,
                    self.grace_s, again)
        timer = threading.Timer(self.grace_s, self._expire)
        timer.daemon = True
        timer.start()

    def _exit_now(self) -> None:
        print(f"interrupted: second Ctrl-C after {self.signal}, exiting now without a checkpoint (the newest "
              "complete one stays; rerun the same command to resume from it)", file=sys.stderr, flush=True)
        kill_process_tree()
        os._exit(128 + int(signal.SIGINT))

    def _expire(self) -> None:
        log.error("no safe point within train.sigterm_grace_s=%.0fs after %s: killing the processes this "
                  "run started and exiting 143; the newest complete checkpoint stays", self.grace_s, self.signal)
        kill_process_tree()
        os._exit(143)

    def install(self, *, grace_s: float) -> "Preemption":
        if grace_s <= 0:
            raise ValueError(f"train.sigterm_grace_s={grace_s} must be > 0")
        self.grace_s = float(grace_s)
        if threading.current_thread() is threading.main_thread():
            for sig in GROUP_SIGNALS:
                self._previous[sig] = signal.signal(sig, lambda signum, _frame: self.request(signum))
        return self

    def uninstall(self) -> None:
        if self._previous and threading.current_thread() is threading.main_thread():
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous = {}
