"""Sampling temperature end to end: the local engine core samples at T=0.7 and returns the log-probs
of softmax(logits / T); the Megatron trainer built with `logit_temperature=0.7` (`rollout.temperature`
through `build.megatron_config`) computes the same log-probs of those tokens, while a T=1 trainer's
differ, so a ratio against the engine's log-probs would be biased without it. The worker runs in a
subprocess (Megatron's global state)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_launch import run_single_worker  # noqa: E402

T = 0.7


def worker(out: str) -> None:
    import random

    import torch

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from tests.support.routing_probe import abs_log_ratio, engine_core, sample_batch
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.trainer.policy_loss import make_policy_loss_fn

    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset("tiny_moe"), parallel=ParallelConfig(), optim=OptimConfig(lr=1e-2),
                         logit_temperature=T)
    loss_fn = make_policy_loss_fn(loss_type="cispo", eps_low=None, eps_high=5.0, aggregation="prompt")
    trainer = MegatronPolicyTrainer(cfg, loss_fn=loss_fn)  # the logits path (no fused head at T != 1)
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg.model.vocab_size) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    core = engine_core(trainer, dtype="float32", router_noise=0.0, max_seq_len=64)
    batch = sample_batch(core, prompts, samples=4, max_new_tokens=16, version=trainer.step, temperature=T)
    on = batch.loss_mask_BT > 0
    report = {"tokens": int(on.sum())}
    try:
        for name, temp in (("at_T", T), ("at_1", 1.0)):
            trainer.cfg = dataclasses.replace(trainer.cfg, logit_temperature=temp)
            logp = trainer.logprobs(batch)
            mean, worst = abs_log_ratio(logp, batch, on)
            report[name] = {"mean": mean, "max": worst}
        trainer.cfg = dataclasses.replace(trainer.cfg, logit_temperature=T)
        report["train_step"] = trainer.train_step(batch)
    finally:
        trainer.close()
    with open(out, "w") as f:
        json.dump(report, f)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trainer_logprobs_follow_the_sampling_temperature(tmp_path):
    report = run_single_worker(__file__, tmp_path / "report.json")
    assert report["tokens"] > 100
    assert report["at_T"]["max"] <= 1e-5, report  # the engine's softmax(logits / T), reproduced
    assert report["at_1"]["mean"] > 1e-2, report  # a T=1 trainer would bias every ratio
    # on-policy at T: every CISPO ratio is 1 to rounding, nothing is truncated
    assert report["train_step"]["rho_max"] == pytest.approx(1.0, abs=1e-4)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
