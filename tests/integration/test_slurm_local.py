"""Real Slurm (started by tests/slurm/setup_slurm.sh): two-step jobs built with slurm/common.sh."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scalerl_slurm_fixture", ROOT / "tests/slurm/slurm_fixture.py")
_fixture = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _fixture
_spec.loader.exec_module(_fixture)
local_slurm = _fixture.local_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

# A generator that answers 200 on localhost, and a trainer that calls it (or fails with code 3).
JOB = textwrap.dedent("""\
    #!/usr/bin/env bash
    set -euo pipefail
    source "$SCALERL_REPO/slurm/common.sh"
    scalerl_generator_cmd() {
      CMD=("$SCALERL_PYTHON" -c 'import http.server as h, sys
    class H(h.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    print("generator serving", flush=True)
    h.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$2")
    }
    scalerl_health_url() { echo "$1/health"; }
    scalerl_trainer_cmd() {
      if [[ ${FAIL_TRAINER:-0} == 1 ]]; then
        CMD=(bash -c 'echo "trainer: loss exploded"; exit 3')
      else
        CMD=("$SCALERL_PYTHON" -c 'import sys, urllib.request
    url = sys.argv[1].strip("[]").split(",")[0]
    print("trainer got", urllib.request.urlopen(url + "/generate").read().decode(), "from", url)' "$(scalerl_engine_list)")
      fi
    }
    scalerl_main
    """)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _submit(slurm, tmp_path: Path, *, fail: bool) -> tuple[dict, Path, Path]:
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    run_dir = tmp_path / "run"
    out = tmp_path / "job.out"
    env = dict(slurm.env, SCALERL_REPO=str(ROOT), SCALERL_PYTHON=sys.executable, RUN_DIR=str(run_dir),
               PORT_BASE=str(_free_port()), HEALTH_TIMEOUT="60", FAIL_TRAINER="1" if fail else "0",
               GPUS_PER_NODE="0", TRAINER_NODES="1")

    r = subprocess.run(["sbatch", "--parsable", "-N1", "-n2", "--cpus-per-task=1", f"--output={out}",
                        f"--chdir={tmp_path}", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    return slurm.wait_done(job_id), out, run_dir


def test_two_step_job_completes(local_slurm, tmp_path):
    st, out, run_dir = _submit(local_slurm, tmp_path, fail=False)
    log = out.read_text()
    assert st["JobState"] == "COMPLETED", log
    assert "trainer finished; stopping servers" in log
    trainer_logs = list((run_dir / "slurm").glob("*.trainer.log"))
    assert trainer_logs and "trainer got ok from http://" in trainer_logs[0].read_text()
    assert "generator serving" in next((run_dir / "slurm").glob("*.gen0.log")).read_text()


def test_failing_trainer_fails_job_with_reason(local_slurm, tmp_path):
    st, out, _ = _submit(local_slurm, tmp_path, fail=True)
    log = out.read_text()
    assert st["JobState"] == "FAILED", log
    assert st["ExitCode"].startswith("3:"), st
    assert "FAILED: step trainer" in log and "exited with code 3" in log
    assert "trainer: loss exploded" in log  # the step log's tail is copied into the job log
