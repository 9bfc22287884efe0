"""Launch a worker script as N ranks with an env:// rendezvous (gloo, CPU); shared by the
multi-process integration tests. Not a test module."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(worker: Path, nproc: int, args: list[str], *, logdir: Path, log_name: str) -> list:
    """Start `nproc` ranks of `worker` on a random free port; rank r logs to `{log_name}_rank{r}.log`."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
                   RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        log = open(logdir / f"{log_name}_rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(worker), *args], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), log))
    return procs


def wait(procs: list, *, logdir: Path, log_name: str, what: str, timeout: float = 600) -> None:
    """Wait for all ranks; on failure or timeout kill the stragglers and whatever they started (each rank
    leads its own process group: Megatron's checkpoint helpers included); raise with rank 0's log tail."""
    failed = []
    try:
        for rank, (proc, _) in enumerate(procs):
            if proc.wait(timeout=timeout) != 0:
                failed.append(rank)
    except subprocess.TimeoutExpired:
        failed.append("timeout")
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    if failed:
        tail = (logdir / f"{log_name}_rank0.log").read_text()[-4000:]
        raise AssertionError(f"worker {what} failed on {failed}:\n{tail}")


def run_single_worker(script: str, out: Path, *, timeout: float = 550, args: tuple[str, ...] = ()) -> dict:
    """Run `script --worker OUT [ARGS]` as one process outside any rendezvous (Megatron's global state stays out
    of pytest; one thread), assert it exits 0 (its stderr tail in the message) and return the JSON it wrote."""
    import json

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--worker", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(Path(out).read_text())
