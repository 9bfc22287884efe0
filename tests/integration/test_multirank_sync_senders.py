"""`rollout.weight_sync_senders=per_stage` through the real loop: `torchrun --nproc-per-node 2
-m scalerl_mega.train` on `tiny_dense` at PP2, PPO-off-policy k=1, 1 step (syncs before it and after it). Each pipeline stage's rank sends
its own layers over its own group to the local engine, the controller coordinating; the engine's weights after
the last sync equal a single-process export of the saved checkpoint bit for bit (SHA-256), and every train
record carries the real sync: two senders whose bytes add up to the whole model; with `rollout.num_engines=2` both
engines hold exactly that export. The same at EP2 on `tiny_qwen3_moe`
(an expert sender besides the stage's leader), where each record's largest per-rank transient sync memory
(`sync/max_rank_transient_bytes`) is at most the stage's dense weights plus one bucket, both
computed here from the exported model's parameter shapes."""

from __future__ import annotations

import pytest
from multirank_util import COMMON, convert, hf_digest, records, run_job

DENSE = ["model=demo_dense"]  # demo widths (4 x 128)


@pytest.mark.parametrize("engines", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: ~2 min; the engine set is
# bit-exact in the default suite by tests/integration/test_multi_sender_sync.py
def test_pp2_per_stage_senders_through_the_loop(tmp_path, engines):
    """With 2 engines (`build.EngineSet`) each sender's group holds both; the digest is the engines' common one."""
    out = tmp_path / "run"
    run_job(out, [*COMMON, *DENSE, "sft.steps=0", "train.steps=1", "train.save_every=1", "metrics.weights_digest=true",
                  "parallel.pp=2", "rollout.weight_sync_senders=per_stage", "rollout.weight_sync_bucket_mb=1",
                  f"rollout.num_engines={engines}"], nproc=2)
    recs = records(out)
    assert [r["step"] for r in recs] == [1]
    convert(out / "checkpoints", tmp_path / "hf")
    assert recs[-1]["gen/weights_version"] == 1.0
    assert hf_digest(tmp_path / "hf") == recs[-1]["gen/weights_sha256"]

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    total = sum(p.numel() * p.element_size() for _, p in model.named_parameters())
    for r in recs:
        assert r["sync/senders"] == 2.0
        assert r["sync/bytes"] == total  # every tensor once, over both stages' groups
        assert total / 2 <= r["sync/max_sender_bytes"] < total  # each stage sent only its own share
        assert r["sync/seconds"] > 0 and r["weight_sync_s"] == r["sync/seconds"]


def _hf_params(path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return {n: p.numel() * p.element_size() for n, p in model.named_parameters()}


def test_ep2_per_stage_senders_through_the_loop_and_their_transient_memory(tmp_path):
    out = tmp_path / "run"
    run_job(out, [*COMMON, "model=tiny_qwen3_moe", "sft.steps=0", "train.steps=1", "train.save_every=1",
                  "metrics.weights_digest=true", "parallel.ep=2", "rollout.weight_sync_senders=per_stage",
                  "rollout.weight_sync_bucket_mb=0"], nproc=2)  # bucket 0: one tensor per bucket
    recs = records(out)
    convert(out / "checkpoints", tmp_path / "hf")
    assert recs[-1]["gen/weights_version"] == 1.0 and hf_digest(tmp_path / "hf") == recs[-1]["gen/weights_sha256"]
    sizes = _hf_params(tmp_path / "hf")
    total = sum(sizes.values())
    dense = sum(b for n, b in sizes.items() if ".experts." not in n)  # PP1: the one stage's dense weights
    bucket = max(sizes.values())  # one bucket: the largest tensor
    assert 0 < dense and dense + bucket < total  # the bound is below the whole model: not met by gathering it all
    for r in recs:
        assert r["sync/senders"] == 2.0 and r["sync/bytes"] == total
        assert dense <= r["sync/max_sender_bytes"] < total  # the leader: dense + experts 0-1; the pool: experts 2-3
        assert 0 < r["sync/max_rank_transient_bytes"] <= dense + bucket
        print(f"EP2 per_stage: max rank transient {r['sync/max_rank_transient_bytes']:.0f} B <= dense {dense} + "
              f"bucket {bucket} B (model {total} B)")
