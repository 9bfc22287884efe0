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
               GPUS_PER_NODE="0", TRAINER_NODES="1", EXPERIMENT="demo")  # a config that validates here

    r = subprocess.run(["sbatch", "--parsable", "-N1", "-n2", "--cpus-per-task=1", f"--output={out}",
                        f"--chdir={tmp_path}", str(script)], env=env, capture_output=True, text=True, timeout=600)
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


# ---- slurm/train_tiny.sh: the real RL loop, generator (HTTP server) and trainer as separate job steps
TINY = ("sft.steps=4 train.prompts_per_step=4 train.generations_per_prompt=4 train.val_every=0 "
        "data.val_prompts=8 metrics.tensorboard=false")


def _submit_tiny(slurm, tmp_path: Path, run_dir: Path, *, extra: str, name: str) -> str:
    env = dict(slurm.env, SCALERL_REPO=str(ROOT), SCALERL_PYTHON=sys.executable, RUN_DIR=str(run_dir),
               PORT_BASE=str(_free_port()), MASTER_PORT=str(_free_port()), HEALTH_TIMEOUT="240",
               EXTRA_OVERRIDES=f"{TINY} {extra}")
    r = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path / (name + '.out')}", f"--chdir={ROOT}",
                        str(ROOT / "slurm/train_tiny.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _train_steps(run_dir: Path) -> list[int]:
    import json

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in recs if r.get("kind") == "train"]


def test_tiny_rl_job_completes(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    job = _submit_tiny(local_slurm, tmp_path, run_dir, extra="train.steps=3 train.save_every=0", name="ok")
    st = local_slurm.wait_done(job, timeout=480)
    log = (tmp_path / "ok.out").read_text()
    assert st["JobState"] == "COMPLETED", log
    assert "trainer finished; stopping servers" in log
    # generator and trainer were separate job steps with their own logs
    gen_log = next((run_dir / "slurm").glob("*.gen0.log")).read_text()
    assert "scalerl rollout server: serving http://127.0.0.1:" in gen_log
    assert (run_dir / "slurm" / f"{job}.trainer.log").exists()
    train_log = (run_dir / "train.log").read_text()
    assert "attached to 1 SGLang server(s): http://" in train_log  # the HTTP client, not a local engine
    assert _train_steps(run_dir) == [1, 2, 3]


def test_tiny_failing_trainer_step_fails_job(local_slurm, tmp_path):
    # a trainer-only error (the generator does not read `resume`): the trainer step exits 1 at startup
    job = _submit_tiny(local_slurm, tmp_path, tmp_path / "run", extra="train.steps=3 resume=/nonexistent/ckpt",
                       name="bad")
    st = local_slurm.wait_done(job, timeout=480)
    log = (tmp_path / "bad.out").read_text()
    assert st["JobState"] == "FAILED", log
    assert st["ExitCode"].startswith("1:"), st
    assert "FAILED: step trainer" in log and "exited with code 1" in log
    assert "no such checkpoint directory" in log  # the trainer's error, copied from the step log


def test_tiny_scancel_then_resubmit_resumes(local_slurm, tmp_path):
    import time

    run_dir = tmp_path / "run"
    # filter=none: every step is an optimizer step (with the tiny SFT all groups can be zero-variance; a
    # checkpoint written before the first optimizer step has no Adam state and does not load -- see report)
    extra = "train.steps=12 train.save_every=2 filter=none"
    job = _submit_tiny(local_slurm, tmp_path, run_dir, extra=extra, name="first")
    deadline = time.monotonic() + 480
    while len(_train_steps(run_dir)) < 3:  # step 2 was checkpointed once step 3 is logged
        st = local_slurm.job_state(job)
        assert st.get("JobState") in ("PENDING", "RUNNING"), (st, (tmp_path / "first.out").read_text())
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.5)
    assert local_slurm.run("scancel", job).returncode == 0
    st = local_slurm.wait_done(job, timeout=120)
    assert st["JobState"] == "CANCELLED", st
    done_before = _train_steps(run_dir)
    assert 3 <= len(done_before) < 12, done_before

    job2 = _submit_tiny(local_slurm, tmp_path, run_dir, extra=extra, name="second")
    st = local_slurm.wait_done(job2, timeout=600)
    assert st["JobState"] == "COMPLETED", (tmp_path / "second.out").read_text()
    train_log = (run_dir / "train.log").read_text()
    assert "resumed from" in train_log
    resumed_at = int(train_log.split("resumed from", 1)[1].split("at step", 1)[1].split()[0])
    assert resumed_at >= 2 and resumed_at % 2 == 0  # a save_every=2 checkpoint
    assert _train_steps(run_dir) == list(range(1, 13))  # records past the checkpoint were replaced
    assert "sft step" not in (run_dir / "slurm" / f"{job2}.trainer.log").read_text()  # no warm start again


# ---- Hydra multirun on the local Slurm: hydra/launcher=scalerl_slurm (submitit), cluster=local_slurm
SWEEP_TINY = [  # the demo's model/task at a few short steps, on top of each swept recipe
    "model=tiny_moe", "data=synthetic", "rollout=local", "cluster=local_slurm",
    "model.vocab_size=48", "model.num_layers=2", "model.hidden_size=64", "model.ffn_hidden_size=128",
    "model.num_attention_heads=4", "model.num_query_groups=2", "model.moe_ffn_hidden_size=32",
    "model.shared_expert_ffn=32", "model.max_position_embeddings=256", "precision.params_dtype=float32",
    "off_policy.k=2", "length.max_new_tokens=48", "length.interruption_min=36", "length.interruption_max=40",
    "length.answer_budget=8", "data.val_prompts=8", "data.val_samples=2", "train.steps=4",
    "train.prompts_per_step=4", "train.generations_per_prompt=4", "train.val_every=1", "train.save_every=0",
    "sft.steps=4", "sft.batch_size=16", "rollout.max_batch_size=64", "metrics.tensorboard=false",
    "forecast.enabled=false",
]


def test_hydra_sweep_two_points_and_report(local_slurm, tmp_path):
    import json

    sweep = tmp_path / "sweep"
    cmd = [str(Path(sys.executable).parent / "scalerl-train"), "-m", "experiment=scalerl,loo_dapo", *SWEEP_TINY,
           "hydra/launcher=scalerl_slurm", f"hydra.sweep.dir={sweep}",
           "hydra.sweep.subdir=${run_name}"]
    r = subprocess.run(cmd, env=local_slurm.env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for point in ("scalerl", "loo_dapo"):
        summary = json.loads((sweep / point / "summary.json").read_text())
        assert summary["steps"] == 4
    cfg = (sweep / "loo_dapo" / ".hydra" / "config.yaml").read_text()
    assert "name: dapo" in cfg and "partition: debug" in cfg  # per-point config; cluster group present
    jobs = sorted(p.name for p in (sweep / ".submitit").iterdir())
    assert len([j for j in jobs if "_" in j and j.replace("_", "").isdigit()]) == 2  # one Slurm array task per point

    from scalerl_mega.cluster.sweep import point_done

    assert point_done(sweep / "scalerl", steps=4) and point_done(sweep / "loo_dapo", steps=4)

    rep = subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(sweep)], capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert "sweep_curves.png" in rep.stdout and (sweep / "sweep_curves.png").stat().st_size > 1000
    rows = [line for line in (sweep / "sweep_report.md").read_text().splitlines() if line.startswith("| experiment=")]
    assert len(rows) == 2 and all("| yes | 4 | 5 |" in row for row in rows), rows  # finished, 4 steps, 5 val points
    assert all(row.count(" - |") == 0 for row in rows), rows  # both fitted
