"""Run an untrusted Python program in a sandboxed subprocess (the code reward's executor).

Three isolation levels, chosen by `detect_isolation()` (memoized per process) or forced:

* `root` (the process is root): `unshare --net --pid --mount --mount-proc --fork --kill-child`,
  then `setpriv` to a fresh unprivileged uid (random in [200000, 300000)) with no capabilities and
  `no_new_privs`. RLIMIT_NPROC is enforced for that uid (it is not for root), so a fork bomb stops
  at `max_processes`.
* `userns` (not root, user namespaces enabled): `unshare --user --map-root-user --net --pid
  --mount --mount-proc --fork --kill-child`; RLIMIT_NPROC is set inside the namespace (`prlimit`),
  where it counts only the sandbox's own processes. The program keeps the invoking user's file
  permissions on paths that are not hidden (below).
* `none` (no usable `unshare`): a plain subprocess with the same rlimits, clean environment and
  scratch directory, but NO network or filesystem isolation and, as root, no process-count limit.
  A warning says so when this level is selected; nothing degrades silently.

In `root` and `userns` the mount namespace is private and, before the program starts:
the scratch directory is bind-mounted at /mnt/work (the only writable place), the interpreter's
prefix read-only at /mnt/py, and tmpfs is mounted over /tmp, /var/tmp, /dev/shm, /root, /home,
$HOME, the top-level directories holding the project checkout, the venv and the caller's cwd
(e.g. /work for /work/main; system directories such as /usr are never hidden) and any `hide_paths`; /etc/passwd and
/etc/shadow are masked with /dev/null. The pid namespace dies with its init, so killing the
launcher kills every descendant. Always: empty environment (PATH, HOME, LANG only), `python -I`,
RLIMIT_AS / CPU / FSIZE / CORE=0, a wall-clock deadline, and an output cap (the process group is
killed when stdout exceeds it). The scratch directory is deleted afterwards.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import os
import resource
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_NS_FLAGS = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
_UID_BASE, _UID_SPAN = 200_000, 100_000
_ALWAYS_HIDDEN = ("/tmp", "/var/tmp", "/dev/shm", "/root", "/home")


class Isolation(str, enum.Enum):
    ROOT = "root"
    USERNS = "userns"
    NONE = "none"


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    time_limit_s: float = 5.0
    """Wall-clock limit; the CPU-time limit (RLIMIT_CPU) is its ceiling in whole seconds."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) of every process in the sandbox."""
    max_output_bytes: int = 1 << 20
    """stdout beyond this kills the program (stderr is truncated at 64 KiB)."""
    max_processes: int = 16
    """RLIMIT_NPROC inside the sandbox (processes + threads)."""
    max_file_mb: int = 16
    """RLIMIT_FSIZE: largest file the program may write."""

    def __post_init__(self) -> None:
        for name in ("time_limit_s", "memory_mb", "max_output_bytes", "max_processes", "max_file_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_overflow: bool
    wall_s: float
    uid: int | None = None
    """The unprivileged uid the program ran as (`root` isolation only)."""


def _probe(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def detect_isolation() -> Isolation:
    """The strongest isolation that works on this machine (probed once per process)."""
    unshare, prlimit = shutil.which("unshare"), shutil.which("prlimit")
    if unshare and prlimit:
        if os.geteuid() == 0 and shutil.which("setpriv"):
            if _probe([unshare, *_NS_FLAGS, "true"]):
                return Isolation.ROOT
        elif _probe([unshare, "--user", "--map-root-user", *_NS_FLAGS, "true"]):
            return Isolation.USERNS
    msg = (
        "code sandbox: no usable `unshare` (util-linux) with user/net/pid/mount namespaces; "
        "untrusted code runs with rlimits, a clean environment and a scratch cwd only: NO network "
        "isolation, NO filesystem hiding" + (", NO process-count limit (root)" if os.geteuid() == 0 else "")
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    logger.warning(msg)
    return Isolation.NONE


def _project_root() -> Path:
    return Path(__file__).resolve().parents[2]


_SYSTEM_TOP = {"usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "dev", "proc", "sys", "run", "mnt"}


def _top_level(path: str) -> str:
    """The top-level directory holding `path` (e.g. /work for /work/main), unless it is a system one."""
    parts = Path(os.path.realpath(path)).parts
    if len(parts) > 1 and parts[1] not in _SYSTEM_TOP:
        return "/" + parts[1]
    return os.path.realpath(path)


def _hidden_paths(extra: Sequence[str]) -> list[str]:
    cands = [*_ALWAYS_HIDDEN, os.environ.get("HOME", ""), _top_level(str(_project_root())), _top_level(sys.prefix),
             _top_level(os.getcwd()), *extra]
    out: list[str] = []
    for p in sorted({os.path.realpath(c) for c in cands if c}):
        if p == "/" or "/mnt".startswith(p.rstrip("/") + "/") or p.startswith("/mnt/") or p == "/mnt":
            continue  # never hide / or the sandbox's own mount point
        if any(p.startswith(h.rstrip("/") + "/") for h in out):
            continue  # already under a hidden path
        out.append(p)
    return out


def _interpreter() -> tuple[str, str]:
    """(prefix, executable relative to prefix) of the base interpreter (not the venv wrapper)."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    rel = os.path.relpath(exe, prefix)
    if rel.startswith(".."):
        raise ValueError(f"sandbox: interpreter {exe} is not under its prefix {prefix}")
    return prefix, rel


def _setup_script(*, scratch: str, argv: Sequence[str], isolation: Isolation, uid: int, limits: SandboxLimits,
                  hide: Sequence[str]) -> str:
    prefix, rel = _interpreter()
    q = shlex.quote
    lines = [
        "set -e",
        "mount --make-rprivate /",
        "mount -t tmpfs -o size=1m,mode=0755 tmpfs /mnt",
        "mkdir /mnt/work /mnt/py",
        f"mount --bind {q(scratch)} /mnt/work",
        f"mount --bind {q(prefix)} /mnt/py",
        "mount -o remount,bind,ro /mnt/py",
    ]
    lines += [f"if [ -d {q(h)} ]; then mount -t tmpfs -o size=1m,mode=0755 tmpfs {q(h)}; fi" for h in hide]
    lines += [f"if [ -f {f} ]; then mount --bind /dev/null {f}; fi" for f in ("/etc/passwd", "/etc/shadow")]
    lines.append("cd /mnt/work")
    env = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/mnt/work", "LANG=C.UTF-8", "LD_LIBRARY_PATH=/mnt/py/lib"]
    prog = [*env, f"/mnt/py/{rel}", "-I", "-B", *argv]
    if isolation is Isolation.ROOT:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
        prog = [*drop, *prog]
    else:
        n = limits.max_processes
        prog = ["prlimit", f"--nproc={n}:{n}", "--", *prog]
    lines.append("exec " + " ".join(q(a) for a in prog))
    return "\n".join(lines)


def _user_process_count() -> int:
    uid = os.getuid()
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


def _preexec(limits: SandboxLimits, nproc: int | None):
    cpu = max(1, math.ceil(limits.time_limit_s))
    mem = limits.memory_mb * 2**20
    fsize = limits.max_file_mb * 2**20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def run_python(
    files: dict[str, str],
    argv: Sequence[str],
    *,
    stdin: bytes = b"",
    limits: SandboxLimits = SandboxLimits(),
    isolation: Isolation | None = None,
    hide_paths: Sequence[str] = (),
) -> RunResult:
    """Write `files` into a fresh scratch dir and run `python -I -B *argv` there, sandboxed."""
    iso = detect_isolation() if isolation is None else Isolation(isolation)
    scratch = tempfile.mkdtemp(prefix="scalerl_sbx_")
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
    try:
        for name, text in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"sandbox file name must be a plain name, got {name!r}")
            Path(scratch, name).write_text(text)
        stdin_path = Path(scratch, ".stdin")
        stdin_path.write_bytes(stdin)
        if iso is Isolation.ROOT:
            for p in [scratch, *(os.path.join(scratch, n) for n in files)]:
                os.chown(p, uid, uid)
        if iso is Isolation.NONE:
            prefix, rel = _interpreter()
            cmd = [os.path.join(prefix, rel), "-I", "-B", *argv]
            env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8"}
            nproc = None if os.geteuid() == 0 else _user_process_count() + limits.max_processes
            cwd = scratch
        else:
            script = _setup_script(scratch=scratch, argv=argv, isolation=iso, uid=uid, limits=limits,
                                   hide=_hidden_paths(hide_paths))
            userns = ["--user", "--map-root-user"] if iso is Isolation.USERNS else []
            cmd = ["unshare", *userns, *_NS_FLAGS, "--", "/bin/sh", "-c", script]
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
            nproc = limits.max_processes if iso is Isolation.ROOT else None
            cwd = "/"
        with open(stdin_path, "rb") as fin:
            res = _communicate(cmd, env=env, cwd=cwd, stdin=fin, limits=limits, preexec=_preexec(limits, nproc))
        if iso is Isolation.ROOT:
            _reap_uid(uid)
            res = dataclasses.replace(res, uid=uid)
        return res
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _communicate(cmd, *, env, cwd, stdin, limits: SandboxLimits, preexec) -> RunResult:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            preexec_fn=preexec, start_new_session=True, close_fds=True)
    out, err = bytearray(), bytearray()
    caps = {proc.stdout.fileno(): (out, limits.max_output_bytes), proc.stderr.fileno(): (err, 1 << 16)}
    open_fds = set(caps)
    timed_out = overflow = False
    deadline = t0 + limits.time_limit_s
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                    continue
                buf, cap = caps[fd]
                if len(buf) + len(chunk) > cap:
                    buf += chunk[: cap - len(buf)]
                    if fd == proc.stdout.fileno():
                        overflow = True
                else:
                    buf += chunk
            if overflow:
                break
        if timed_out or overflow:
            _kill_group(proc)
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.wait()
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return RunResult(returncode=rc, stdout=bytes(out), stderr=bytes(err), timed_out=timed_out,
                     output_overflow=overflow, wall_s=time.monotonic() - t0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _uid_pids(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid is `uid`, read from /proc."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").strip().startswith("Z"):
            continue
        uids = fields.get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            pids.append(int(d))
    return pids


def _reap_uid(uid: int, *, timeout_s: float = 5.0) -> None:
    """Kill whatever still runs as the sandbox's private uid (`root` isolation) and wait until none does.

    The pid namespace dies with its init, but the kernel tears the namespace down asynchronously; under
    load a forked child can still be scheduled for a moment after the launcher has exited. The uid is
    private to this run, so every process carrying it belongs to the sandbox.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        pids = _uid_pids(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > deadline:
            logger.warning("sandbox: %d process(es) of uid %d still alive after %.1fs", len(pids), uid, timeout_s)
            return
        time.sleep(0.02)
