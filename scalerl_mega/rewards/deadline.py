"""Hard timeouts for calls that may hang inside C code (sympy big integers, regex backtracking).

math-verify's own timeout uses `signal.alarm`: it has whole-second resolution, raises ValueError
outside the main thread, and cannot interrupt a long C-level computation (e.g. evaluating
`9^{9^{9^9}}`), because Python signal handlers only run between bytecodes. `call_in_child` instead
forks, runs the function in the child and SIGKILLs it at the deadline: this works from any thread
and stops anything. The child also gets an address-space cap so a runaway big integer fails fast
with MemoryError instead of eating the shared machine's RAM.

A fork costs ~5-25 ms, ~20-100x a typical verification (~0.25 ms). Where a supervisor already enforces
a hard deadline by killing the whole process (a `RewardPool` worker), `call_capped` runs the function
in-process under the same address-space cap instead.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import time
from collections.abc import Callable
from typing import Any, NoReturn

from scalerl_mega.preemption import _prctl, set_pdeathsig

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * _PAGE


def call_in_child(
    fn: Callable[..., Any], *args: Any, timeout_s: float, extra_memory_mb: int = 1024
) -> tuple[str, Any]:
    """Run `fn(*args)` in a forked child with a hard wall-clock deadline.

    Returns ("ok", value), ("error", message) if `fn` raised, or ("timeout", None) if the child
    was killed at `timeout_s` (or died without answering: ("crash", signal/exit code)).
    The child's address space may grow by at most `extra_memory_mb` beyond the parent's.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    limit = _vm_bytes() + extra_memory_mb * 2**20
    r, w = os.pipe()
    parent = os.getpid()
    _prctl()  # resolved before the fork (see set_pdeathsig)
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        _child_main(fn, args, r=r, w=w, parent=parent, limit=limit)
    os.close(w)
    chunks: list[bytes] = []
    timed_out = False
    try:
        timed_out = _read_until(r, chunks, deadline=time.monotonic() + timeout_s)
    finally:
        os.close(r)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return ("timeout", None)
    try:
        return pickle.loads(b"".join(chunks))
    except (pickle.UnpicklingError, EOFError, ValueError, MemoryError):  # truncated: the child died mid-write
        return ("crash", os.waitstatus_to_exitcode(status))


def call_capped(fn: Callable[..., Any], *args: Any, extra_memory_mb: int = 1024) -> tuple[str, Any]:
    """Run `fn(*args)` in this process with its address space capped at `extra_memory_mb` beyond the
    current one (soft `RLIMIT_AS`, restored afterwards). Returns ("ok", value) or ("error", message).
    No deadline: only for callers whose process a supervisor kills at a hard deadline."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + extra_memory_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - MemoryError included: reported, never raised
        return ("error", f"{type(e).__name__}: {str(e)[:200]}")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _child_main(fn: Callable[..., Any], args: tuple[Any, ...], *, r: int, w: int, parent: int, limit: int) -> NoReturn:
    """The forked child of `call_in_child`: run `fn(*args)` under the address-space `limit`, write the pickled
    ("ok", value) or ("error", message) to `w`, and `os._exit` (0, or 1 if even that failed)."""
    code = 0
    try:
        set_pdeathsig(parent)  # nobody would enforce the deadline after the caller died
        os.close(r)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            out: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - report everything to the parent
            out = ("error", f"{type(e).__name__}: {str(e)[:200]}")
        data = pickle.dumps(out)
        view = memoryview(data)
        while view:
            n = os.write(w, view)
            view = view[n:]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


def _read_until(r: int, chunks: list[bytes], *, deadline: float) -> bool:
    """Append what the child writes to `r` onto `chunks` until EOF (False) or the monotonic `deadline` (True)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        ready, _, _ = select.select([r], [], [], left)
        if not ready:
            continue
        chunk = os.read(r, 1 << 16)
        if not chunk:
            return False
        chunks.append(chunk)
