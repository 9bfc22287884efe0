"""Session-scoped pytest fixture: a private single-node Slurm on localhost (tests/slurm/setup_slurm.sh).

Import it into a test module with :func:`load` (the tests tree is not a package). Skips with the
script's reason when it cannot run here (not root, no apt, ports busy); fails with the daemon logs
when it should have worked but did not. Always tears the cluster down (and wipes its state dir)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@dataclass
class LocalSlurm:
    state_dir: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def job_state(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait_done(self, job_id: str, *, timeout: float = 180) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.job_state(job_id)
            if st.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return st
            time.sleep(0.5)
        self.run("scancel", job_id)
        raise AssertionError(f"job {job_id} not finished after {timeout}s: {self.job_state(job_id)}")


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    sl = tmp_path_factory.mktemp("slurm_state")
    env = dict(os.environ, SL=str(sl))
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    setup = subprocess.run(["bash", str(HERE / "setup_slurm.sh")], env=env, capture_output=True, text=True, timeout=300)
    if setup.returncode == 3:
        pytest.skip(f"local Slurm unavailable: {setup.stderr.strip()}")
    try:
        if setup.returncode != 0:
            logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((sl / "log").glob("*")) if p.is_file())
            pytest.fail(f"setup_slurm.sh failed ({setup.returncode}): {setup.stderr}\n{logs}")
        env["SLURM_CONF"] = str(sl / "etc" / "slurm.conf")
        yield LocalSlurm(state_dir=sl, env=env)
    finally:
        subprocess.run(["bash", str(HERE / "teardown_slurm.sh"), "--wipe"], env=env, capture_output=True, timeout=600)


