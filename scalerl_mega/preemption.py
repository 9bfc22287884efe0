"""SIGTERM (Slurm preemption, time limit, `scancel`): checkpoint at the next safe point, then exit 0.

`Preemption.install(grace_s=...)` replaces the SIGTERM handler of this process. The handler only
records the request; the RL loop polls `requested` at its safe points (while it waits for
generations, and at the end of every step), saves a checkpoint there, stops the engines and reward
workers it started and returns, and `scalerl-train` exits 0, so a requeued job resumes
(`resume=auto`). If no safe point comes within `grace_s` seconds (a step stuck in a collective), a
watchdog kills every process this one started and exits with 143 (128 + SIGTERM): the previous
checkpoint stays the newest complete one. Follower ranks of a multi-rank job install it too: they keep
serving the controller's commands (its checkpoint save is collective) until it releases them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

log = logging.getLogger("scalerl_mega.preemption")


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
    """The SIGTERM request flag of this process (see module doc)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: Any = None
        self.grace_s = 0.0

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        """What the handler does (callable directly, e.g. from a test hook)."""
        if self._event.is_set():
            return
        self._event.set()
        log.warning("SIGTERM: checkpointing at the next safe point (grace %.0fs, train.sigterm_grace_s)", self.grace_s)
        timer = threading.Timer(self.grace_s, self._expire)
        timer.daemon = True
        timer.start()

    def _expire(self) -> None:
        log.error("no safe point within train.sigterm_grace_s=%.0fs after SIGTERM: killing the processes this "
                  "run started and exiting 143; the newest complete checkpoint stays", self.grace_s)
        kill_process_tree()
        os._exit(143)

    def install(self, *, grace_s: float) -> "Preemption":
        if grace_s <= 0:
            raise ValueError(f"train.sigterm_grace_s={grace_s} must be > 0")
        self.grace_s = float(grace_s)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda *_: self.request())
        return self

    def uninstall(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
