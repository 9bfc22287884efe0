"""The episodes' own concurrent pool: environment `reset`/`step` calls and agent functions run on threads here,
never in the reward workers, so that every episode of a step is in flight at once and their tool time overlaps
generation.

Threads, not processes: agents and environments are I/O-bound (HTTP to the endpoint, sandboxes, remote
environment servers) and their code is ordinary blocking Python (a sync `openai` client, `requests`,
`subprocess`), which runs unchanged on a thread and releases the GIL while it waits. A CPU-bound environment
should do its heavy work in a subprocess of its own (the sandbox of `rewards/sandbox.py` does).

`EpisodePool(size=n)` starts at most `n` daemon threads, one more only when a submitted call finds none idle.
`submit(fn, *args)` returns a `Call` at once; the call records when a thread started it (`started`, on `clock`:
the episode's own time counts from there, not from the queue) and its value or exception. A thread cannot be
killed: a call past its deadline is abandoned by its caller (`Call.abandoned`) and holds its thread until it
returns; the threads are daemons, so a hung call never delays the trainer's exit.

`InlinePool` has the same face for calls that do no I/O (`env=single`'s, `episodes.single`): each runs on the
caller's thread inside `submit`, which returns it done.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Call:
    """One submitted call: `started` (monotonic seconds, None while queued), `done`, `value` or `error`."""

    __slots__ = ("fn", "args", "started", "done", "value", "error", "abandoned")

    def __init__(self, fn: Callable[..., object], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.started: float | None = None
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        """Set by the caller that gave up on it (a deadline): its result is ignored."""

    def running_for(self, now: float) -> float:
        """Seconds since a thread started the call (0 while queued, or once done)."""
        return 0.0 if self.started is None or self.done else now - self.started


class EpisodePool:
    """At most `size` daemon threads running submitted calls in submission order (module doc)."""

    def __init__(self, *, size: int, name: str = "episodes", clock: Callable[[], float] = time.monotonic) -> None:
        if int(size) < 1:
            raise ValueError(f"EpisodePool size={size} must be >= 1 (env.concurrency)")
        self.size, self.name, self.clock = int(size), name, clock
        self.wake = threading.Event()
        """Set whenever a call finishes (cleared by the waiter before it looks)."""
        self._jobs: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._queued = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started so far (at most `size`)."""
        return len(self._threads)

    def submit(self, fn: Callable[..., object], *args: object) -> Call:
        call = Call(fn, args)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"EpisodePool {self.name!r} is closed")
            self._queued += 1
            if self._queued > self._idle and len(self._threads) < self.size:
                t = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        self._jobs.put(call)
        return call

    def wait(self, timeout_s: float) -> None:
        """Block until a call finishes or `timeout_s` passes (the caller clears `wake` before it looks)."""
        if timeout_s > 0:
            self.wake.wait(timeout_s)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._jobs.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if call is None:
                return
            call.started = self.clock()
            try:
                call.value = call.fn(*call.args)
            except BaseException as e:  # noqa: BLE001 - user code: any failure is the call's result
                call.error = e
            call.done = True
            self.wake.set()

    def close(self) -> None:
        """Drop the queued calls (never started) and stop the idle threads; a thread inside a call ends when the
        call returns (a daemon: never waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    dropped = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if dropped is not None:
                    dropped.abandoned = True
                    self._queued -= 1
            n = len(self._threads)
            self._queued += n
        for _ in range(n):
            self._jobs.put(None)


class InlinePool:
    """`EpisodePool`'s face, running each call inside `submit` on the caller's thread (module doc): no thread, no
    queue, the call returned done."""

    size = 1
    threads = 0

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.wake = threading.Event()

    def submit(self, fn: Callable[..., object], *args: object) -> Call:
        call = Call(fn, args)
        call.started = self.clock()
        try:
            call.value = fn(*args)
        except Exception as e:  # noqa: BLE001 - the call's failure is its result, as on a pool thread
            call.error = e
        call.done = True
        return call

    def wait(self, timeout_s: float) -> None:
        """Nothing runs elsewhere: no call can finish while waiting."""

    def close(self) -> None:
        """Nothing to stop."""
