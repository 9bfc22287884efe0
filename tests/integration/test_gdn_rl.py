"""`scalerl-train` RL steps (PPO-off-policy-1, FP32) on the tiny Qwen3.5-MoE checkpoint of `tools/make_tiny_checkpoint.py`
(Gated DeltaNet / gated attention / GDN, 4 experts top-2 with a gated shared expert; `init_from_hf`, so its recorded
CPU overrides apply under the command line's): the Megatron trainer (torch GDN path) pushes its weights after every
step, the local engine (transformers' Qwen3_5MoeForCausalLM: chunked prefill, recurrent decode over per-slot GDN
state) generates the next step's samples with them, and the trainer's log-probs of those samples equal the engine's
(on-policy |log-ratio| <= 1e-4 on every step, the guard in assert mode). No warm start: rewards are all equal, so
`filter=none` keeps the samples and a large learning rate makes the MoE load-balancing loss move every weight; the
engine's weight digest then differs after every push, so the agreement is checked on three different models."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multirank_util import COMMON, REPO, records, run_job

ON_POLICY = 1e-4
GDN = ["sft.steps=0", "train.steps=3", "train.save_every=0",
       "filter=none", "optim.lr=1e-2", "metrics.weights_digest=true", f"metrics.max_logprob_mismatch={ON_POLICY}",
       "metrics.mismatch_mode=assert"]


@pytest.mark.compat  # ~1 min on 2 loaded cores: the compatibility leg of .ci/run runs it (make test-compat), not make test
def test_qwen3_5_moe_engine_agrees_with_the_trainer_over_three_pushes(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    made = subprocess.run([sys.executable, "tools/make_tiny_checkpoint.py", "qwen3_5_moe", str(ckpt)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    run_job(out, [*COMMON, *GDN, f"init_from_hf={ckpt}"])
    assert "\n  arch: qwen3_5_moe\n" in (out / "run_config.yaml").read_text()  # the checkpoint's model, not the demo's
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["train/onpolicy_tokens"] > 0 and r["train/onpolicy_abs_log_ratio_max"] <= ON_POLICY
        assert r["train/grad_norm"] > 0 and r["staleness_max"] == 0
    assert len({r["gen/weights_sha256"] for r in recs}) == 3
