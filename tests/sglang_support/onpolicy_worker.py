"""On-policy agreement against a running SGLang server (a child process of tests/sglang/test_real_qwen3.py:
Megatron's global state stays out of pytest).

    python -m tests.sglang_support.onpolicy_worker URL MODEL_DIR OUT.json

The Megatron trainer (one CPU rank, FP32, the model of MODEL_DIR/config.json, its own random init) pushes
its weights to the server (`export_hf_weights` -> `SGLangRolloutEngine.update_weights`: the manifest check,
then gloo buckets), the server samples, and the trainer computes the FP32 log-probs of those samples; after
one SFT step the same again (version 2). OUT.json: the max |trainer - SGLang| log-prob per version, the
spread of the log-probs (the comparison bites) and the buckets per push.
"""

from __future__ import annotations

import json
import sys


def main(url: str, model_dir: str, out: str) -> None:
    import random

    import torch

    from scalerl_mega.convert.model_config import model_config_from_hf
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.hf_import import read_hf_config
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.trainer.megatron.export import export_hf_weights
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import Prompt, SamplingParams
    from scalerl_mega.weight_sync import WeightSyncConfig
    from tests.support.onpolicy import completion_batch, max_logprob_diff, trainer_logprobs

    torch.set_num_threads(1)
    model = model_config_from_hf(read_hf_config(model_dir), name="served")
    cfg = MegatronConfig(model=model, parallel=ParallelConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0))
    trainer = MegatronPolicyTrainer(cfg)
    arch, kwargs = hf_config_from_model(model)
    engine = SGLangRolloutEngine([SGLangServer.attach(url)], config=SGLangEngineConfig(
        pause_mode="in_place", control_timeout_s=60.0, request_timeout_s=300.0, model=LocalModelSpec(arch=arch, config=kwargs),
        sync=WeightSyncConfig(backend="gloo", timeout_s=60.0, bucket_bytes=64 << 10, group_name="onpolicy")))
    report = {"diffs": [], "buckets": [], "spread": []}
    rng = random.Random(0)
    try:
        for version in (1, 2):
            engine.update_weights(export_hf_weights(trainer.chunks, model), version=version)
            report["buckets"].append(engine.last_sync_stats.buckets)
            for i in range(3):
                ids = [1] + [rng.randrange(3, model.vocab_size) for _ in range(rng.randrange(3, 8))]
                engine.submit(Prompt(prompt_id=f"v{version}-{i}", text="", task="synthetic", gold="", token_ids=ids),
                              SamplingParams(max_new_tokens=10, temperature=1.0, seed=10 * i + version), n=2,
                              version=version)
            done = []
            while len(done) < 6:
                done += engine.poll(1.0)
            assert all(set(c.weight_versions) == {version} for c in done), [c.weight_versions for c in done]
            batch = completion_batch(done)
            logp = trainer_logprobs(trainer.chunks, batch)
            report["diffs"].append(max_logprob_diff(logp, done))
            report["spread"].append(float(logp[batch.loss_mask_BT > 0].std()))
            trainer.sft_step(batch)  # other weights for the second push
    finally:
        engine.close()
        trainer.close()
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
