"""`tools/gpu_check.sh --cpu OUT`: the GPU session's one script rehearsed on CPU at toy size, every stage (versions,
the GPU suite's invocation, the head benchmark as the trainer calls it with errors against float64, the bf16 RL
loop with save and resume in a fresh process), its stage log and summary.json. On a GPU the same script runs the
full sizes (docs/cluster_and_gpu.md "GPU check"); 156-276 s here over two runs on the shared 2-core machine
(2026-11-29), dominated by process start-ups (the RL stage's two trainer cold starts). `make test-compat` runs it again in a bare Python 3.12 venv with the GPU wheel set
(tools/gpu_rehearsal.sh); tests/integration/test_gpu_check_kill.py kills it part-way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = {"summary.json", "stages.jsonl", "versions.txt", "gpu_suite.log", "head.log", "head.jsonl", "rl_loop.log",
         "rl_loop.json"}
GPU_TESTS = 15
"""tests/gpu: 8 head cases x 1 shape + 2 determinism + backends + default mode (test_fused_logprob_gpu.py), and 3
Megatron-Core tests (test_megatron_gpu.py)."""
DEADLINE_S = 900
"""--cpu's default deadline (480 on a GPU)."""


def test_gpu_check_rehearses_every_stage_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, GPU_PY=sys.executable, GPU_WHEELS=str(tmp_path / "no-wheels"),
               TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), "--cpu", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=DEADLINE_S + 100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert names == FILES and len(names) <= 8, names
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("scalerl-gpu-check")] == []  # work dir removed
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "cpu" and s["ok"] is True
    assert {k: v["status"] for k, v in s["stages"].items()} == {
        "versions": "done", "install": "skipped", "gpu_suite": "done", "head": "done", "rl_loop": "done"}
    assert s["versions"]["torch"] and s["versions"]["device"] is None and s["version_mismatches"] == []
    # each stage's limit is what was left of the deadline minus the later stages' minimums, capped; all ended in time
    events = [json.loads(ln) for ln in (out / "stages.jsonl").read_text().splitlines()]
    starts = {e["stage"]: e for e in events if e["status"] == "running"}
    assert starts["versions"]["limit_s"] == 60

    def left(stage: str, reserve: int) -> int:  # at_s is taken just after the limit: within the same second or one
        return DEADLINE_S - starts[stage]["at_s"] - reserve

    for stage, cap, reserve in (("gpu_suite", 120, 90), ("head", 90, 60), ("rl_loop", 600, 0)):
        assert min(cap, left(stage, reserve)) <= starts[stage]["limit_s"] <= min(cap, left(stage, reserve) + 1)
    assert all(e["at_s"] <= DEADLINE_S for e in events)
    # the suite is collected and skipped here (no CUDA): every test of tests/gpu, none failed
    assert s["gpu_suite"] == {"summary_line": True, "passed": 0, "failed": 0, "skipped": GPU_TESTS, "errors": 0}
    head = s["head"]
    assert head["shape"] == [512, 64, 1024] and head["within_bounds"]
    # the trainer's call on CPU is the chunked FP32 torch head: FP32-level errors against float64
    assert head["error"]["err_loss_rel"] < 1e-5 and head["error"]["err_logp_abs"] < 1e-4
    assert head["error"]["err_grad_h_rel"] < 2e-5 and head["error"]["err_grad_w_rel"] < 2e-5
    assert head["time_over_naive"] > 0
    rl = s["rl_loop"]
    assert rl["steps"] == 4 and rl["resumed_steps"] == 2 and rl["resume_matched"] is True
    assert rl["params_dtype"] == "bfloat16" and rl["run_b"] == "done"  # the bf16 optimizer's save and resume
    assert rl["resume"]["weights_bitwise"] and rl["resume"]["loss_rel_diff"] == 0.0  # CPU: bit for bit
    assert rl["tokens_per_s"] > 0 and rl["push_s"] > 0 and rl["mfu"] is None  # no peak for a CPU
    from scalerl_mega.model.config import ModelConfig

    toy = ModelConfig(vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_layers=2, num_attention_heads=4,
                      num_query_groups=2)
    assert rl["params"] == toy.num_params()["total"]
    per_step = json.loads((out / "rl_loop.json").read_text())["per_step"]
    assert [r["step"] for r in per_step] == [1, 2, 3, 4]
    assert all(r["generated_tokens"] > 0 and r["train_s"] > 0 and r["trainer_tflops"] > 0 for r in per_step)
