"""On-policy check: right after a weight sync, the Megatron trainer's FP32 log-probs of the local
engine's sampled tokens equal the engine's own to 1e-5 (dense and MoE: Llama-3, Llama-4, Qwen3 tied, Qwen3-MoE).

This exercises the whole chain: Megatron model -> `export_hf_weights` (converter) -> bucketed gloo
sync into the engine process -> HF `transformers` forward with a KV cache and FP32 LM head ->
sampling; then the trainer's own forward on the sampled sequences. It is repeated after one
optimizer step and a second sync (version 2), so the synced weights are not the initial ones.

Marked slow (~50 s per preset). The worker runs in a subprocess (this file with --worker): Megatron's global parallel state must
not leak into the pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _batch(completions):
    from tests.support.onpolicy import completion_batch

    return completion_batch(completions)


def _max_diff(logp_BT, completions) -> float:
    from tests.support.onpolicy import max_logprob_diff

    return max_logprob_diff(logp_BT, completions)


def _megatron_logprobs(chunks, batch):
    from tests.support.onpolicy import trainer_logprobs

    return trainer_logprobs(chunks, batch)


def worker(preset: str, out: str) -> None:
    import random

    import torch

    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine
    from scalerl_mega.weight_sync import WeightSyncConfig
    from scalerl_mega.trainer.megatron.export import export_hf_weights
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import Prompt, SamplingParams

    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset(preset), parallel=ParallelConfig(), optim=OptimConfig(lr=1e-2))
    trainer = MegatronPolicyTrainer(cfg)
    arch, hf_kwargs = hf_config_from_model(cfg.model)
    engine = LocalRolloutEngine(
        LocalEngineConfig(
            model=LocalModelSpec(arch=arch, config=hf_kwargs, init_seed=999),  # differs from the trainer
            core=CoreConfig(max_batch=8, max_seq_len=64, fp32_lm_head=True),
            sync=WeightSyncConfig(backend="gloo", timeout_s=120, bucket_bytes=64 << 10, group_name="onpolicy"),
        )
    )
    report = {"preset": preset, "diffs": [], "buckets": []}
    rng = random.Random(0)
    try:
        for version in (1, 2):
            # the converter's export (landed) on the trainer's model chunks
            engine.update_weights(export_hf_weights(trainer.chunks, cfg.model), version=version)
            report["buckets"].append(engine.last_sync_stats.buckets)
            for i in range(4):
                ids = [rng.randrange(cfg.model.vocab_size) for _ in range(rng.randrange(3, 9))]
                prompt = Prompt(prompt_id=f"p{version}-{i}", text="", task="synthetic", gold="", token_ids=ids)
                engine.submit(prompt, SamplingParams(max_new_tokens=12, temperature=1.0, seed=10 * i), n=2, version=version)
            done = []
            while len(done) < 8:
                done += engine.poll(1.0)
            assert all(set(c.weight_versions) == {version} for c in done)
            batch = _batch(done)
            logp = _megatron_logprobs(trainer.chunks, batch)
            report["diffs"].append(_max_diff(logp, done))
            report.setdefault("logp_spread", float(logp[batch.loss_mask_BT > 0].std()))
            trainer.sft_step(batch)  # change the weights before the next sync
    finally:
        engine.close()
        trainer.close()
    with open(out, "w") as f:
        json.dump(report, f)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("preset", ["tiny_dense", "tiny_moe", "tiny_qwen3", "tiny_qwen3_moe"])
def test_trainer_logprobs_equal_engine_logprobs_after_sync(tmp_path, preset):
    pytest.importorskip("scalerl_mega.trainer.megatron.trainer", reason="the Megatron trainer has not landed")
    out = str(tmp_path / "report.json")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", preset, out],
        env=env, capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out) as f:
        report = json.load(f)
    assert report["logp_spread"] > 0.05  # log-probs vary, so the comparison bites
    assert all(b > 1 for b in report["buckets"])
    assert max(report["diffs"]) <= 1e-5, report


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    worker(sys.argv[2], sys.argv[3])
