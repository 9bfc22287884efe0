"""`scalerl-train rollout.quantization=fp8` end to end on the embedded demo model (Megatron trainer in FP32, the local
engine in its own process holding blockwise-FP8 weights, weights synced over gloo as float8 + scales): every step is
on-policy (PPO-off-policy-1), so the generator-vs-trainer gap the metrics show is the FP8 generator's own.

Checked from metrics.jsonl: the gap is real (an unquantized engine agrees with the trainer to ~1e-7 per token,
docs/running_scalerl.md; here it is > 1e-4) and logged as `rollout/mismatch_kl` (> 0) with the TIS clip fraction;
`sync/bytes` is the FP8 push's size computed by hand from the model's tensors (1 byte per projection weight plus one
FP32 scale per 128x128 block; the rest FP32), well under the FP32 push's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_loop_megatron import run_train  # noqa: E402


@pytest.mark.slow  # ~4 min on the shared 2-core machine (trainer build, engine process, 3 steps)
@pytest.mark.timeout(1200)
def test_rl_steps_with_an_fp8_generator(tmp_path):
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.quant.fp8 import is_fp8_weight, scale_shape
    from scalerl_mega.trainer.megatron.export import export_plan

    out = tmp_path / "fp8"
    run_train(out, "off_policy=ppo_off_policy", "off_policy.k=1", "train.steps=3", "train.val_every=0", "loss=dapo",
              "loss.is_correction=tis_token", "rollout.quantization=fp8", timeout=1100)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    plan = export_plan(load_model_preset("demo_moe"), dtype="float32")  # names and shapes of the demo model
    lin = [s for s in plan if is_fp8_weight(s.name, s.shape)]
    n_all, n_lin = (sum(math.prod(s.shape) for s in ss) for ss in (plan, lin))
    fp8_bytes = 4 * (n_all - n_lin) + n_lin + 4 * sum(math.prod(scale_shape(s.shape)) for s in lin)
    for r in train:
        assert r["sync/bytes"] == fp8_bytes and 4 * n_all - fp8_bytes > 2.99 * n_lin  # ~3 bytes saved per projection weight
        assert r["train/onpolicy_tokens"] > 0
        assert 1e-4 < r["train/onpolicy_abs_log_ratio_mean"] <= r["train/onpolicy_abs_log_ratio_max"]
        assert r["rollout/mismatch_kl"] == r["train/onpolicy_mismatch_kl"] > 0
        assert 0.0 <= r["train/is_correction_fraction"] <= 1.0


@pytest.mark.slow  # ~3-4 min on the shared 2-core machine (trainer build, SFT warm start, engine process, 3 steps)
@pytest.mark.timeout(1200)
def test_rl_steps_on_tiny_qwen3_moe_with_an_fp8_generator(tmp_path):
    """tiny_qwen3_moe (4 experts top-2, a dense layer, q/k norms; the task's 48-token vocabulary) with its experts
    synced and served in FP8: the steps train, every push moves exactly the bytes the planner counts for the model
    (cluster/weight_bytes.py: FP8 projections and their scales, the rest in the run's FP32) and about half the bytes
    of a bf16 push, and the FP8 generator's mismatch is measured (> 0, finite) with its TIS clip fraction."""
    import dataclasses

    from scalerl_mega.cluster.weight_bytes import model_bytes
    from scalerl_mega.dry_run import model_shape
    from scalerl_mega.model.config import load_model_preset

    out = tmp_path / "qwen3_moe_fp8"
    run_train(out, "model=tiny_qwen3_moe", "model.vocab_size=48", "model.max_position_embeddings=128",
              "sft.steps=40", "off_policy=ppo_off_policy", "off_policy.k=1", "train.steps=3", "train.val_every=0",
              "loss=dapo", "loss.is_correction=tis_token", "rollout.quantization=fp8", timeout=1100)
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    shape = model_shape(dataclasses.replace(load_model_preset("tiny_qwen3_moe"), vocab_size=48,
                                            max_position_embeddings=128))
    n = shape.total_params()
    for r in train:
        assert r["train/update_successful"] == 1.0 and r["train/onpolicy_tokens"] > 0
        assert r["sync/bytes"] == model_bytes(shape, dtype_bytes=4, quantization="fp8")  # 227,804 B
        assert 0.5 < r["sync/bytes"] / (2 * n) < 0.6 and r["sync/bytes"] / (4 * n) < 0.3  # vs bf16, FP32 pushes
        assert math.isfinite(r["rollout/mismatch_kl"]) and r["rollout/mismatch_kl"] > 0
        assert 0.0 < r["train/onpolicy_abs_log_ratio_mean"] <= r["train/onpolicy_abs_log_ratio_max"]
        assert 0.0 <= r["train/is_correction_fraction"] <= 1.0


@pytest.mark.slow  # ~3 min each: two trainer ranks under torchrun and an engine process
@pytest.mark.parametrize("senders", ["single", "per_stage"])
def test_pp2_fp8_push_lands_as_the_fp8_checkpoint(tmp_path, senders):
    """PP2 (`tiny` demo widths): the single sender (later stage relayed to rank 0) and the per-stage senders push FP8;
    after the last push the engine holds exactly the saved checkpoint written as a blockwise FP8 checkpoint and
    loaded by transformers (its own dequantization): SHA-256 of every parameter, FP32."""
    import shutil

    from multirank_util import COMMON, convert, hf_digest, records, run_job

    from scalerl_mega.convert.fp8_io import quantize_hf_dir

    out = tmp_path / "run"
    run_job(out, [*COMMON, "model=demo_dense", "sft.steps=0", "train.steps=1", "train.save_every=1",
                  "metrics.weights_digest=true", "parallel.pp=2", f"rollout.weight_sync_senders={senders}",
                  "rollout.weight_sync_bucket_mb=1", "rollout.quantization=fp8"], nproc=2, timeout=900)
    recs = records(out)
    assert [r["step"] for r in recs] == [1] and recs[-1]["gen/weights_version"] == 1.0
    convert(out / "checkpoints", tmp_path / "hf")
    shutil.copytree(tmp_path / "hf", tmp_path / "hf_fp8")
    assert quantize_hf_dir(str(tmp_path / "hf_fp8")) > 0
    assert hf_digest(tmp_path / "hf_fp8") == recs[-1]["gen/weights_sha256"]
    assert hf_digest(tmp_path / "hf") != recs[-1]["gen/weights_sha256"]  # not the unquantized weights
    assert recs[-1]["sync/senders"] == (2.0 if senders == "per_stage" else 1.0)
