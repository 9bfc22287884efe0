"""Run an untrusted Python program in a sandboxed subprocess (the code reward's executor).

Three isolation levels, chosen by `detect_isolation()` (memoized per process) or forced:

* `root` (the process is root): `unshare --net --pid --ipc --uts --mount --mount-proc --fork --kill-child`,
  then `setpriv` to a fresh unprivileged uid (random in [200000, 300000)) with no capabilities and
  `no_new_privs`. RLIMIT_NPROC is enforced for that uid (it is not for root), so a fork bomb stops
  at `max_processes`.
* `userns` (not root, user namespaces enabled): `unshare --user --map-root-user --net --pid --ipc
  --uts --mount --mount-proc --fork --kill-child`; RLIMIT_NPROC is set inside the namespace (`prlimit`),
  where it counts only the sandbox's own processes.
* `none` (no usable `unshare`, or the sandbox root cannot be assembled): a plain subprocess with the same
  rlimits, clean environment and scratch directory, but NO network, filesystem or IPC isolation, no
  scratch quota and, as root, no process-count limit.
  A warning says so when this level is selected; nothing degrades silently.

In `root` and `userns` the program also gets private IPC and UTS namespaces (System V shared memory,
semaphores and message queues die with the run), and a deny-by-default filesystem (`_setup_script`): a
fresh root on a tmpfs holding only the system directories (/usr, /bin, /lib*, /sbin) read-only, the
loader's /etc files, /dev with null/zero/full/random/urandom, a private /proc, the interpreter prefix
read-only at /mnt/py, and one private tmpfs of `scratch_mb` behind the cwd /mnt/work, /tmp and /dev/shm.
Nothing else of the host exists inside -- not /run, /var, /home, /root, the checkout, the venv or any
dataset directory -- so no host filesystem socket is reachable either (abstract sockets are per network
namespace). `hide_paths` masks further paths under the visible directories. The old root is detached
(`pivot_root`), the root is read-only, and every writable place is a tmpfs that disappears with the
namespace, so a run leaves nothing behind on the host. The pid namespace dies with its init, so killing
the launcher kills every descendant. Always: empty environment (PATH, HOME, LANG only), `python -I`,
RLIMIT_AS / CPU / FSIZE / CORE=0, a wall-clock deadline, and an output cap (the process group is
killed when stdout exceeds it). The host-side staging directory is deleted afterwards.
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

_NS_FLAGS = ["--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount", "--mount-proc"]
_UID_BASE, _UID_SPAN = 200_000, 100_000


class Isolation(str, enum.Enum):
    ROOT = "root"
    USERNS = "userns"
    NONE = "none"


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    time_limit_s: float = 5.0
    """The program's time limit: CPU time (RLIMIT_CPU, its ceiling in whole seconds) and, with
    `startup_s` added, wall-clock time."""
    startup_s: float = 5.0
    """Wall-clock allowance on top of `time_limit_s` for building the namespaces and starting the
    interpreter, which on a loaded machine can take seconds before the program runs a line."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) of every process in the sandbox."""
    max_output_bytes: int = 1 << 20
    """stdout beyond this kills the program (stderr is truncated at 64 KiB)."""
    max_processes: int = 16
    """RLIMIT_NPROC inside the sandbox (processes + threads)."""
    max_file_mb: int = 16
    """RLIMIT_FSIZE: largest file the program may write."""
    scratch_mb: int = 64
    """Size of the private tmpfs behind the cwd, /tmp and /dev/shm together (`root`/`userns` isolation)."""

    def __post_init__(self) -> None:
        if self.startup_s < 0:
            raise ValueError(f"SandboxLimits.startup_s must be >= 0, got {self.startup_s}")
        for name in ("time_limit_s", "memory_mb", "max_output_bytes", "max_processes", "max_file_mb", "scratch_mb"):
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


def _probe_sandbox(iso: Isolation) -> str | None:
    """Assemble the full sandbox once and run `python -c pass` in it; None if it works, else why not."""
    base = tempfile.mkdtemp(prefix="scalerl_sbx_probe_")
    try:
        cmd = _namespace_command(base=base, argv=["-c", "pass"], isolation=iso, uid=_UID_BASE, limits=SandboxLimits(),
                                 hide=[])
        p = subprocess.run(cmd, capture_output=True, timeout=20, cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        return None if p.returncode == 0 else p.stderr.decode(errors="replace").strip()[-300:] or f"rc {p.returncode}"
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return repr(e)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@functools.cache
def detect_isolation() -> Isolation:
    """The strongest isolation that works on this machine (probed once per process)."""
    unshare, prlimit = shutil.which("unshare"), shutil.which("prlimit")
    why = "no usable `unshare` (util-linux) with user/net/pid/ipc/mount namespaces"
    if unshare and prlimit:
        iso = None
        if os.geteuid() == 0 and shutil.which("setpriv"):
            if _probe([unshare, *_NS_FLAGS, "true"]):
                iso = Isolation.ROOT
        elif _probe([unshare, "--user", "--map-root-user", *_NS_FLAGS, "true"]):
            iso = Isolation.USERNS
        if iso is not None:
            err = _probe_sandbox(iso)
            if err is None:
                return iso
            why = f"namespaces work but the sandbox root cannot be assembled ({err})"
    msg = (
        f"code sandbox: {why}; untrusted code runs with rlimits, a clean environment and a scratch cwd only: "
        "NO network isolation, NO filesystem hiding, NO IPC isolation, NO scratch quota"
        + (", NO process-count limit (root)" if os.geteuid() == 0 else "")
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    logger.warning(msg)
    return Isolation.NONE


def _project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _hidden_paths(extra: Sequence[str]) -> list[str]:
    """Paths to mask inside the sandbox, as absolute paths of the sandbox's own root.

    Only paths the deny-by-default view would otherwise show need masking: those under a visible system
    directory (`_SYSTEM_RO`) or under the interpreter prefix (visible at /mnt/py). The project checkout and
    the venv are always added, in case they live under such a directory (e.g. /usr/local/src).
    """
    prefix = os.path.realpath(sys.base_prefix)
    cands = [str(_project_root()), sys.prefix, *extra]
    out: list[str] = []
    for c in sorted({os.path.realpath(c) for c in cands if c}):
        parts = Path(c).parts
        if c == prefix or c.startswith(prefix + "/"):
            inner = "/mnt/py" + c[len(prefix):]
        elif len(parts) > 2 and parts[1] in _SYSTEM_RO and not os.path.islink("/" + parts[1]):
            inner = c
        else:
            continue  # not visible in the sandbox at all
        if inner == "/mnt/py" or any(inner.startswith(h + "/") for h in out):
            continue  # never mask the interpreter itself; already under a masked path
        out.append(inner)
    return out


def _interpreter() -> tuple[str, str]:
    """(prefix, executable relative to prefix) of the base interpreter (not the venv wrapper)."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    rel = os.path.relpath(exe, prefix)
    if rel.startswith(".."):
        raise ValueError(f"sandbox: interpreter {exe} is not under its prefix {prefix}")
    return prefix, rel


_SYSTEM_RO = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Host top-level entries visible (read-only) in the sandbox; everything else of the host is absent."""
_ETC_RO = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
"""/etc entries the dynamic loader and coreutils need; /etc/passwd and /etc/group exist but are empty."""
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _setup_script(*, staging: str, new_root: str, argv: Sequence[str], isolation: Isolation, uid: int, limits: SandboxLimits,
                  hide: Sequence[str]) -> str:
    """Shell run as (namespace) root in fresh mount/pid/net/ipc/uts namespaces: assemble a deny-by-default
    root on a tmpfs, pivot into it, drop privileges and exec the program.

    Layout: /usr /bin /sbin /lib* bound read-only from the host (or recreated as the host's symlinks), a few
    /etc files (`_ETC_RO`), /dev with only `_DEV_NODES`, a fresh /proc of the private pid namespace, the
    interpreter prefix read-only at /mnt/py, and one size-limited tmpfs (`limits.scratch_mb`) that provides
    the cwd /mnt/work, /tmp and /dev/shm. The root itself is remounted read-only; /run, /var, /home, /root,
    /work, /data ... do not exist. `hide` paths that fall under a visible directory are masked (tmpfs over a
    directory, /dev/null over a file). The old root is detached (`pivot_root` + lazy umount), so no host
    path -- and no filesystem socket -- is reachable afterwards.
    """
    prefix, rel = _interpreter()
    q = shlex.quote
    r = q(new_root)
    owner = f"uid={uid},gid={uid}," if isolation is Isolation.ROOT else ""
    lines = [
        "set -e",
        "mount --make-rprivate /",
        f"mount -t tmpfs -o size=4m,mode=0755 tmpfs {r}",
        f"cd {r}",
        "mkdir -p etc dev proc tmp mnt/py mnt/work .scratch",
        *_host_bind_lines(),
    ]
    lines += [
        "ln -s /proc/self/fd dev/fd; ln -s /proc/self/fd/0 dev/stdin; ln -s /proc/self/fd/1 dev/stdout; "
        "ln -s /proc/self/fd/2 dev/stderr",
        "mount -t proc -o nosuid,nodev,noexec proc proc",
        f"mount --bind {q(prefix)} mnt/py",
        "mount -o remount,bind,ro,nosuid,nodev mnt/py",
        # one quota for cwd, /tmp and /dev/shm: three binds of a single size-limited tmpfs
        f"mount -t tmpfs -o size={limits.scratch_mb}m,nr_inodes=65536,nosuid,nodev,{owner}mode=0700 tmpfs .scratch",
        "mkdir .scratch/work .scratch/tmp .scratch/shm dev/shm",
        f"cp -R {q(staging)}/. .scratch/work/",
        "chmod 1777 .scratch/tmp .scratch/shm",
    ]
    if isolation is Isolation.ROOT:
        lines.append(f"chown -R {uid}:{uid} .scratch/work")
    lines += [
        "mount --bind .scratch/work mnt/work",
        "mount --bind .scratch/tmp tmp",
        "mount --bind .scratch/shm dev/shm",
        "umount .scratch && rmdir .scratch",
    ]
    for h in hide:
        inner = "." + h  # relative to the new root (the cwd until the pivot)
        lines.append(f"if [ -d {q(inner)} ]; then mount -t tmpfs -o size=4k,mode=0755 tmpfs {q(inner)}; "
                     f"elif [ -e {q(inner)} ]; then mount --bind /dev/null {q(inner)}; fi")
    lines += [
        # pivot_root(".", "."): the old root ends up stacked on the new one and is detached right away
        "pivot_root . .",
        "umount -l .",
        "mount -o remount,ro,bind /",
        "cd /mnt/work",
    ]
    lines.append(_exec_line(rel=rel, argv=argv, isolation=isolation, uid=uid, limits=limits))
    return "\n".join(lines)


def _host_bind_lines() -> list[str]:
    """`_setup_script` lines (run in the new root, the cwd) that show the read-only host system directories
    `_SYSTEM_RO`, the /etc files `_ETC_RO`, empty passwd/group files and the `_DEV_NODES`."""
    lines = []
    for d in _SYSTEM_RO:
        lines.append(f"if [ -L /{d} ]; then ln -s \"$(readlink /{d})\" {d}; "
                     f"elif [ -d /{d} ]; then mkdir {d} && mount --bind /{d} {d} && "
                     f"mount -o remount,bind,ro,nosuid,nodev {d}; fi")
    for e in _ETC_RO:
        lines.append(f"if [ -d /etc/{e} ]; then mkdir etc/{e} && mount --bind /etc/{e} etc/{e} && "
                     f"mount -o remount,bind,ro etc/{e}; elif [ -f /etc/{e} ]; then : > etc/{e} && "
                     f"mount --bind /etc/{e} etc/{e} && mount -o remount,bind,ro etc/{e}; fi")
    lines.append(": > etc/passwd; : > etc/group")
    for n in _DEV_NODES:
        lines.append(f": > dev/{n}; mount --bind /dev/{n} dev/{n}")
    return lines


def _exec_line(*, rel: str, argv: Sequence[str], isolation: Isolation, uid: int, limits: SandboxLimits) -> str:
    """The last `_setup_script` line: exec the interpreter (`/mnt/py/<rel>`) with a clean environment, after
    dropping to `uid` without capabilities (Isolation.ROOT) or under the process limit (user namespace)."""
    env = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/mnt/work", "LANG=C.UTF-8", "LD_LIBRARY_PATH=/mnt/py/lib"]
    prog = [*env, f"/mnt/py/{rel}", "-I", "-B", *argv]
    if isolation is Isolation.ROOT:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
        prog = [*drop, *prog]
    else:
        n = limits.max_processes
        prog = ["prlimit", f"--nproc={n}:{n}", "--", *prog]
    return "exec " + " ".join(shlex.quote(a) for a in prog)


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
    """Write `files` into a fresh scratch dir and run `python -I -B *argv` there, sandboxed.

    `hide_paths` are masked in addition to the deny-by-default view (only needed for paths under the
    visible system directories or the interpreter prefix; everything else of the host is absent anyway).
    """
    iso = detect_isolation() if isolation is None else Isolation(isolation)
    base = tempfile.mkdtemp(prefix="scalerl_sbx_")
    staging = os.path.join(base, "files")
    os.mkdir(staging)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
    try:
        for name, text in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"sandbox file name must be a plain name, got {name!r}")
            Path(staging, name).write_text(text)
        stdin_path = Path(base, "stdin")
        stdin_path.write_bytes(stdin)
        if iso is Isolation.NONE:
            prefix, rel = _interpreter()
            cmd = [os.path.join(prefix, rel), "-I", "-B", *argv]
            env = {"PATH": "/usr/bin:/bin", "HOME": staging, "LANG": "C.UTF-8"}
            nproc = None if os.geteuid() == 0 else _user_process_count() + limits.max_processes
            cwd = staging
        else:
            cmd = _namespace_command(base=base, argv=argv, isolation=iso, uid=uid, limits=limits,
                                     hide=_hidden_paths(hide_paths))
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
        shutil.rmtree(base, ignore_errors=True)


def _namespace_command(*, base: str, argv: Sequence[str], isolation: Isolation, uid: int, limits: SandboxLimits,
                       hide: Sequence[str]) -> list[str]:
    """The unshare command line for a run whose host-side directory is `base`: the program's files
    are in `base/files`; the sandbox root is assembled on a tmpfs mounted over `base/root` inside the
    private mount namespace (the host only ever sees the empty directory)."""
    staging, new_root = os.path.join(base, "files"), os.path.join(base, "root")
    os.makedirs(staging, exist_ok=True)
    os.makedirs(new_root, exist_ok=True)
    script = _setup_script(staging=staging, new_root=new_root, argv=argv, isolation=isolation, uid=uid, limits=limits,
                           hide=hide)
    userns = ["--user", "--map-root-user"] if isolation is Isolation.USERNS else []
    return ["unshare", *userns, *_NS_FLAGS, "--", "/bin/sh", "-c", script]


def _communicate(cmd, *, env, cwd, stdin, limits: SandboxLimits, preexec) -> RunResult:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            preexec_fn=preexec, start_new_session=True, close_fds=True)
    out, err = bytearray(), bytearray()
    caps = {proc.stdout.fileno(): (out, limits.max_output_bytes), proc.stderr.fileno(): (err, 1 << 16)}
    open_fds = set(caps)
    timed_out = overflow = False
    deadline = t0 + limits.time_limit_s + limits.startup_s
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
    wall = time.monotonic() - t0
    # killed by its CPU limit (RLIMIT_CPU = ceil(time_limit_s); the shell wrapper reports a plain
    # failure): a failure after the whole time limit has passed is a timeout
    timed_out = timed_out or (rc != 0 and wall >= limits.time_limit_s)
    return RunResult(returncode=rc, stdout=bytes(out), stderr=bytes(err), timed_out=timed_out,
                     output_overflow=overflow, wall_s=wall)


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
