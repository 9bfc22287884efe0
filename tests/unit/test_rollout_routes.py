"""Rollout routing replay, engine side: the local engine's recorded MoE routes.

References are independent full-sequence HF forwards whose routers are observed with a hook; the
gate weight is recomputed as sigmoid(top logit) in float64 (HF Llama-4's gate)."""

from __future__ import annotations

import random

import pytest
import torch

from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest, moe_routers
from scalerl_mega.rollout.local import LocalModelSpec, build_model
from scalerl_mega.types import SamplingParams
from tests.support.routing_probe import hf_router_logits

LLAMA4 = dict(vocab_size=61, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=1,
              interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0], attention_chunk_size=64,
              max_position_embeddings=256, tie_word_embeddings=False)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(seed=0):
    m = build_model(LocalModelSpec(arch="llama4", config=LLAMA4, init_seed=seed))
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(8.0)
        for r in moe_routers(m):
            r.weight.mul_(20.0)  # spread router logits so routes differ between tokens and versions
    return m


def _req(rid, prompt, **sp):
    return GenRequest(rid=str(rid), prompt_id=str(rid), sample_index=0, prompt_ids=prompt,
                      sampling=SamplingParams(**sp), seed=1000 + int(rid))


def _oracle_routes(model, seq):
    """[N, L] expert ids and float64 gates of a full-sequence forward over `seq` (top-1 routers)."""
    top, ids = hf_router_logits(model, seq, output=1).max(dim=-1)  # over [N, L, E]
    return ids, torch.sigmoid(top)


def _routes(c):
    R = c.routes
    R.check(where="test")
    n = R.num_positions
    return (torch.tensor(R.expert_ids).view(n, R.num_layers, R.topk)[..., 0],
            torch.tensor(R.weights, dtype=torch.float64).view(n, R.num_layers, R.topk)[..., 0])


def test_routes_of_batched_engine_match_a_full_forward():
    model = _model()
    assert len(moe_routers(model)) == 2  # interleave step 2: HF layers 1 and 3
    rng = random.Random(0)
    reqs = [_req(i, [rng.randrange(61) for _ in range(rng.randrange(2, 9))], max_new_tokens=rng.randrange(2, 12))
            for i in range(7)]
    core = GenerationCore(model, config=CoreConfig(max_batch=3, max_seq_len=24, record_routes=True))
    for r in reqs:
        core.add(r)
    out = core.run_until_done()
    assert len(out) == 7
    distinct = set()
    for c in out:
        seq = c.prompt_ids + c.output_ids
        ids, w = _routes(c)
        assert c.routes.num_positions == len(seq) - 1  # the last token is never an input
        assert c.routes.versions == [0] * (len(seq) - 1)
        ref_ids, ref_w = _oracle_routes(model, seq[:-1])
        assert torch.equal(ids, ref_ids)
        assert float((w - ref_w).abs().max()) < 1e-5
        distinct |= set(ids.flatten().tolist())
    assert len(distinct) >= 3  # the check is not vacuous: several experts are used


def test_routes_not_recorded_by_default_or_for_dense_models():
    core = GenerationCore(_model(), config=CoreConfig(max_batch=2, max_seq_len=24))
    core.add(_req(1, [3, 4], max_new_tokens=3))
    assert core.run_until_done()[0].routes is None


def test_in_flight_update_routes_carry_the_version_that_produced_them():
    """Positions decoded after an in-flight update carry version 1 and the v1 router's choice on the
    stale KV; earlier positions keep v0's routes (what the behaviour policy used)."""
    model_b = _model(seed=1)
    prompt, k, total = [5, 9, 2, 11], 5, 12
    core = GenerationCore(_model(seed=0), config=CoreConfig(max_batch=2, max_seq_len=32, record_routes=True))
    core.add(_req(1, prompt, max_new_tokens=total))
    while len(core.rows[0].output_ids if core.rows else []) < k:
        core.step()
    core.load_weights(model_b.state_dict().items())
    core.set_version(1)
    c = core.run_until_done()[0]
    P = len(prompt)
    # position P-1+j produced output token j: its version is weight_versions[j]
    assert c.routes.versions == [0] * (P - 1) + c.weight_versions[: total]
    assert c.routes.versions.count(1) == total - k
    ids, _ = _routes(c)
    ref0, _ = _oracle_routes(_model(seed=0), (c.prompt_ids + c.output_ids)[: P - 1 + k])
    assert torch.equal(ids[: P - 1 + k], ref0)


def test_retract_keeps_the_routes_that_sampled_each_token():
    core = GenerationCore(_model(seed=0), config=CoreConfig(max_batch=2, max_seq_len=32, record_routes=True))
    core.add(_req(1, [5, 9, 2], max_new_tokens=10))
    for _ in range(4):
        core.step()
    core.retract_all()
    core.load_weights(_model(seed=1).state_dict().items())
    core.set_version(1)
    c = core.run_until_done()[0]
    # prefill of 3 + 3 decodes under v0 (positions 0..5), the re-prefill adds position 6 under v1
    assert c.routes.versions == [0] * 6 + [1] * 6
    ids, _ = _routes(c)
    ref0, _ = _oracle_routes(_model(seed=0), (c.prompt_ids + c.output_ids)[:6])
    assert torch.equal(ids[:6], ref0)


def test_shared_prefill_copies_carry_their_source_routes():
    """Samples of one prompt admitted together share one prefill (CoreConfig.share_prefill): each copy's
    prompt routes are its source's, and every position still matches a full forward of its own sequence."""
    model = _model()
    prompt = [7, 3, 19, 44, 2]
    reqs = [_req(i, prompt if i < 4 else [11, 5, 8 + i], max_new_tokens=6, temperature=1.0) for i in range(6)]
    core = GenerationCore(model, config=CoreConfig(max_batch=8, max_seq_len=24, record_routes=True))
    for r in reqs:
        core.add(r)
    out = core.run_until_done()
    assert core.stats()["prefill_tokens"] == 5 + 3 + 3  # the four copies of `prompt` computed once
    assert len({tuple(c.output_ids) for c in out if c.prompt_ids == prompt}) > 1  # sampled apart
    for c in out:
        seq = c.prompt_ids + c.output_ids
        ids, w = _routes(c)
        ref_ids, ref_w = _oracle_routes(model, seq[:-1])
        assert torch.equal(ids, ref_ids)
        assert float((w - ref_w).abs().max()) < 1e-5
