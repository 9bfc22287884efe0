"""Rollout routing replay end to end: the real local engine core samples with recorded
routes, the Megatron trainer (tiny_moe) replays them.

The engine's routers are perturbed (Gaussian noise, 5% of their weights' std) so that, as between two
numerical stacks, some routes differ: with replay off the trainer's routes disagree on a few tokens and
its log-probs differ from the engine's; with `ids` / `ids_and_weights` the routes agree on 100% of the
on-policy tokens and the |log-ratio| (computed here from the trainer's and engine's log-probs) is no
larger than without replay. The worker runs in a subprocess (Megatron's global state)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_launch import run_single_worker  # noqa: E402



def worker(out: str, preset: str = "tiny_moe") -> None:
    import random

    import torch

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from tests.support.routing_probe import abs_log_ratio, engine_core, sample_batch
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset(preset), parallel=ParallelConfig(), optim=OptimConfig(lr=1e-2))
    trainer = MegatronPolicyTrainer(cfg)
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg.model.vocab_size) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    core = engine_core(trainer, dtype="float32", router_noise=0.05, max_seq_len=64)
    batch = sample_batch(core, prompts, samples=4, max_new_tokens=16, version=trainer.step)
    report = {"modes": {}}
    try:
        on = (batch.loss_mask_BT > 0) & (batch.weight_version_BT == batch.policy_version)
        report["onpolicy_tokens"] = int(on.sum())
        for mode in ("none", "ids", "ids_and_weights"):
            trainer.routing_replay = mode
            logp, metrics = trainer.logprobs(batch, with_metrics=True)
            # |log pi_trainer - log pi_engine| on on-policy trained tokens, in float64
            mean, worst = abs_log_ratio(logp, batch, on)
            report["modes"][mode] = {"mean": mean, "max": worst, **metrics}
        trainer.routing_replay = "ids"
        report["train_step"] = trainer.train_step(batch)
    finally:
        trainer.close()
    with open(out, "w") as f:
        json.dump(report, f)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("preset,moe_layers", [pytest.param("tiny_moe", 2, marks=pytest.mark.slow),
                                               ("tiny_qwen3_moe", 3)])
def test_replay_makes_routes_agree_and_does_not_increase_log_ratio(tmp_path, preset, moe_layers):
    """tiny_moe: Llama-4 top-1 sigmoid routing; tiny_qwen3_moe: Qwen3-MoE softmax top-2 renormalised, whose
    replayed gate weights (`ids`: the trainer's softmax over the replayed experts' logits) and the engine's
    (`ids_and_weights`: HF's renormalised top-k) must follow the same semantics for the log-probs to match."""
    report = run_single_worker(__file__, tmp_path / "report.json", args=(preset,))
    modes = report["modes"]
    n = report["onpolicy_tokens"]
    assert n > 100
    off, ids, both = modes["none"], modes["ids"], modes["ids_and_weights"]
    # every trained token is on-policy here and has a route
    assert off["routing_tokens_onpolicy"] == n == ids["routing_tokens_onpolicy"]
    # the perturbation bites: without replay some routes differ, and the log-probs with them
    assert off["routing_agreement_onpolicy"] < 0.995
    assert off["routing_agreement_natural_onpolicy"] == off["routing_agreement_onpolicy"]
    assert off["max"] > 1e-3
    for mode in (ids, both):
        assert mode["routing_agreement_onpolicy"] == 1.0 and mode["routing_agreement"] == 1.0
        assert all(mode[f"routing_agreement/layer{j}"] == 1.0 for j in range(moe_layers))
        # the trainer's own routers still disagree (layer >= 1 sees replayed inputs, so not exactly as
        # often as without replay): the agreement comes from the replay
        assert mode["routing_agreement_natural_onpolicy"] < 0.995
        assert mode["mean"] <= off["mean"] and mode["max"] <= off["max"]
    # the engine's weights too: only the (tiny) router perturbation of the gate values is left out, so
    # the log-probs match to float32 round-off
    assert both["max"] < 1e-5 and both["mean"] < ids["mean"]
    step = report["train_step"]
    assert step["routing_agreement"] == 1.0 and step["routing_tokens"] == step.get("routing_tokens_onpolicy", n)


if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "--worker":
    worker(*sys.argv[2:])
