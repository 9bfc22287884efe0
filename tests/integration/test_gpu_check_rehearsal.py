"""`tools/gpu_check.sh --cpu OUT`: the GPU session's one script rehearsed on CPU at toy size, every stage (versions,
the GPU suite's invocation, the head benchmark as the trainer calls it with errors against float64, the RL loop
with save and resume in a fresh process), and its summary.json. On a GPU the same script runs the full sizes
(docs/cluster_and_gpu.md "GPU check"); ~1.5 minutes here on 2 loaded cores, dominated by process start-ups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = {"summary.json", "versions.txt", "gpu_suite.log", "head.log", "head.json", "rl_loop.log", "rl_loop.json"}


def test_gpu_check_rehearses_every_stage_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, GPU_PY=sys.executable, GPU_WHEELS=str(tmp_path / "no-wheels"),
               TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), "--cpu", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert names == FILES and len(names) <= 8, names
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("scalerl-gpu-check")] == []  # work dir removed
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "cpu" and s["ok"] is True
    assert set(s["stages"]) == {"versions", "gpu_suite", "head", "rl_loop"}
    assert all(st["rc"] == 0 for st in s["stages"].values()), s["stages"]
    assert s["versions"]["torch"] and s["versions"]["device"] is None
    # the suite is collected and skipped here (no CUDA): every test of tests/gpu, none failed
    assert s["gpu_suite"]["skipped"] >= 20 and s["gpu_suite"]["failed"] == s["gpu_suite"]["passed"] == 0
    head = s["head"]
    assert head["shape"] == [512, 64, 1024] and head["within_bounds"]
    # the trainer's call on CPU is the chunked FP32 torch head: FP32-level errors against float64
    assert head["error"]["err_loss_rel"] < 1e-5 and head["error"]["err_logp_abs"] < 1e-4
    assert head["error"]["err_grad_h_rel"] < 2e-5 and head["error"]["err_grad_w_rel"] < 2e-5
    assert head["time_over_naive"] > 0
    rl = s["rl_loop"]
    assert rl["steps"] == 4 and rl["resumed_steps"] == 2 and rl["resume_matched"] is True
    assert rl["resume"]["weights_bitwise"] and rl["resume"]["loss_rel_diff"] == 0.0  # CPU: bit for bit
    assert rl["tokens_per_s"] > 0 and rl["push_s"] > 0 and rl["mfu"] is None  # no peak for a CPU
    from scalerl_mega.model.config import ModelConfig

    toy = ModelConfig(vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_layers=2, num_attention_heads=4,
                      num_query_groups=2)
    assert rl["params"] == toy.num_params()["total"]
    per_step = json.loads((out / "rl_loop.json").read_text())["per_step"]
    assert [r["step"] for r in per_step] == [1, 2, 3, 4]
    assert all(r["generated_tokens"] > 0 and r["train_s"] > 0 and r["trainer_tflops"] > 0 for r in per_step)
