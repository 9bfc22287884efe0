"""Local generation core: sampling, KV-cache batching, interruption, in-flight weight updates.

References are computed independently with the plain HF model (full-sequence forward, or HF's
own DynamicCache) in float64 log-softmax.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
from scalerl_mega.rollout.local import LocalModelSpec, build_model
from scalerl_mega.rollout.sampling import counter_uniform, sample_tokens, top_p_mask
from scalerl_mega.types import FinishReason, SamplingParams
from tests.support.inflight_update import swapped_reference, update_after

LLAMA = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
LLAMA4 = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=32,
    intermediate_size_mlp=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    no_rope_layers=[1, 1, 1, 0],
    attention_chunk_size=8,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(arch="llama", seed=0, cfg=None):
    spec = LocalModelSpec(arch=arch, config=cfg or (LLAMA if arch == "llama" else LLAMA4), init_seed=seed)
    m = build_model(spec)
    # sharpen the random model so tokens depend on the weights (random tiny models are near-uniform)
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(8.0)
    return m


def _req(rid, prompt, **sp):
    seed = sp.pop("seed", 1000 + int(rid))
    return GenRequest(
        rid=str(rid), prompt_id=str(rid), sample_index=0, prompt_ids=prompt, sampling=SamplingParams(**sp), seed=seed
    )


def _oracle_logprobs(model, prompt, output, temperature=1.0):
    """float64 log_softmax(logits / T) of each output token from one full-sequence forward."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    p = len(prompt)
    return [logp[p - 1 + j, t].item() for j, t in enumerate(output)]


# ---- sampling ------------------------------------------------------------------------------
def test_counter_uniform_is_a_function_of_seed_step_token():
    a = counter_uniform(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0]), 5)
    b = counter_uniform(torch.tensor([8, 7]), torch.tensor([0, 0]), 5)
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    u = counter_uniform(torch.arange(200), torch.zeros(200, dtype=torch.long), 50)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01  # 10k draws: std of mean ~0.003


def test_top_p_mask_hand_example():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    keep = top_p_mask(probs, torch.tensor([0.7, 0.3]))
    # row 0: sorted 0.5 (mass before 0) 0.3 (0.5 < 0.7) 0.1 (0.8) -> keep tokens 1, 2
    assert keep[0].tolist() == [False, True, True, False]
    # row 1: the first sorted token (mass 0) and the second (0.25 < 0.3)
    assert int(keep[1].sum()) == 2


def test_sample_tokens_distribution_and_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float32)
    n = 20000
    toks, lps = sample_tokens(
        logits.expand(n, 4),
        temperature_N=torch.full((n,), 0.5),
        top_p_N=torch.full((n,), 0.9),
        seeds_N=torch.arange(n),
        steps_N=torch.zeros(n, dtype=torch.long),
    )
    z = [math.exp(x / 0.5) for x in (2.0, 1.0, 0.0, -1.0)]
    p = [x / sum(z) for x in z]  # 0.8668, 0.1173, 0.0159, 0.0021 -> nucleus 0.9 = tokens {0, 1}
    nucleus = [p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1]), 0.0, 0.0]
    freq = torch.bincount(toks, minlength=4).double() / n
    for f, q in zip(freq.tolist(), nucleus):
        assert abs(f - q) < 4 * math.sqrt(max(q * (1 - q), 1e-9) / n) + 1e-9
    # log-probs are log_softmax(logits / T) before top-p (SGLang convention)
    for t, lp in zip(toks[:50].tolist(), lps[:50].tolist()):
        assert abs(lp - math.log(p[t])) < 1e-5
    greedy, glp = sample_tokens(
        logits, temperature_N=torch.zeros(1), top_p_N=torch.ones(1), seeds_N=torch.zeros(1), steps_N=torch.zeros(1)
    )
    assert greedy.item() == 0 and abs(glp.item() - torch.log_softmax(logits.double(), -1)[0, 0].item()) < 1e-6


# ---- batching vs the HF oracle ---------------------------------------------------------------
@pytest.mark.parametrize("arch,attn", [("llama", "sdpa"), ("llama4", "sdpa"), ("llama4", "eager")])
def test_batched_engine_matches_full_forward_and_is_batch_invariant(arch, attn):
    """The decode step's own masks (SDPA: 4-D, with Llama-4's chunked layers at chunk 8 < the longest
    request) and HF's masks (eager: built by HF from the 2-D mask) both reproduce the oracle."""
    model = _model(arch)
    model.config._attn_implementation = attn
    rng = random.Random(0)
    reqs = []
    for i in range(9):
        prompt = [rng.randrange(61) for _ in range(rng.randrange(2, 10))]
        reqs.append(
            _req(i, prompt, max_new_tokens=rng.randrange(2, 16), temperature=1.0, top_p=0.9 if i % 2 else 1.0)
        )
    # 3 slots for 9 requests (continuous admission); max_seq_len 26 -> capacity 52 forces relayouts
    core = GenerationCore(model, config=CoreConfig(max_batch=3, max_seq_len=26))
    for r in reqs:
        core.add(r)
    out = {c.prompt_id: c for c in core.run_until_done()}
    assert sorted(out) == sorted(r.rid for r in reqs)
    for r in reqs:
        c = out[r.rid]
        assert len(c.output_ids) == r.sampling.max_new_tokens and c.finish_reason == FinishReason.LENGTH
        ref = _oracle_logprobs(model, r.prompt_ids, c.output_ids)
        assert max(abs(a - b) for a, b in zip(ref, c.gen_logprobs)) < 1e-5
        assert c.weight_versions == [0] * len(c.output_ids) and c.mask() == [1] * len(c.output_ids)
    solo = GenerationCore(model, config=CoreConfig(max_batch=1, max_seq_len=26))
    for r in reqs:
        solo.add(r)
    for c in solo.run_until_done():
        assert c.output_ids == out[c.prompt_id].output_ids


@pytest.mark.parametrize("arch", ["llama", "llama4"])
def test_shared_prefill_matches_a_prefill_per_request(arch):
    """A group's samples of one prompt admitted together: the engine computes the prompt once and copies
    its KV row and logits (share_prefill). Every request gets the tokens and log-probs of an engine that
    prefills each request itself, and of the float64 oracle; only distinct inputs count as prefill work."""
    model = _model(arch)
    rng = random.Random(3)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(3, 9))] for _ in range(3)]
    reqs = [_req(i, prompts[i % 3], max_new_tokens=rng.randrange(4, 12), temperature=1.0) for i in range(12)]
    outs = {}
    for share in (True, False):
        # 8 slots for 12 requests: a first admission of 8 (3 distinct prompts), then 4 more as slots free up
        core = GenerationCore(model, config=CoreConfig(max_batch=8, max_seq_len=26, share_prefill=share))
        for r in reqs:
            core.add(r)
        outs[share] = {c.prompt_id: c for c in core.run_until_done()}
        st = core.stats()
        first = sum(len(p) for p in prompts)  # the first admission: 8 requests, 3 distinct prompts
        if share:
            assert st["prefill_tokens"] < sum(len(r.prompt_ids) for r in reqs)
            assert st["prefill_tokens"] >= first + min(len(p) for p in prompts)
        else:
            assert st["prefill_tokens"] == sum(len(r.prompt_ids) for r in reqs)
    for r in reqs:
        a, b = outs[True][r.rid], outs[False][r.rid]
        assert a.output_ids == b.output_ids and len(a.output_ids) == r.sampling.max_new_tokens
        assert max(abs(x - y) for x, y in zip(a.gen_logprobs, b.gen_logprobs)) < 1e-5
        ref = _oracle_logprobs(model, r.prompt_ids, a.output_ids)
        assert max(abs(x - y) for x, y in zip(ref, a.gen_logprobs)) < 1e-5
    assert len({tuple(outs[True][str(i)].output_ids) for i in (0, 3, 6, 9)}) > 1  # copies are sampled apart


def test_decode_builds_its_own_masks_only_for_sdpa_full_and_chunked_layers():
    """Sliding-window layers or another attention implementation: the decode step hands HF the 2-D mask."""
    cases = [("llama4", "sdpa", None, dict), ("llama", "sdpa", None, torch.Tensor),
             ("llama", "sdpa", ["full_attention", "sliding_attention"], None), ("llama4", "eager", None, None)]
    for arch, attn, layer_types, kind in cases:
        model = _model(arch)
        model.config._attn_implementation = attn
        if layer_types is not None:
            model.config.layer_types = layer_types
        core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=26))
        core.add(_req(0, [1, 2, 3], max_new_tokens=2, temperature=1.0))
        seen = []
        forward = core._forward
        core._forward = lambda ids, mask, pos, cache: (seen.append(mask), forward(ids, mask, pos, cache))[1]
        core.run_until_done()
        decode_masks = seen[1:]  # seen[0] is the prefill's
        assert decode_masks, (arch, attn, layer_types)
        for m in decode_masks:
            if kind is None:
                assert isinstance(m, torch.Tensor) and m.dim() == 2, (arch, attn, layer_types)
            elif kind is dict:
                assert set(m) == {"full_attention", "chunked_attention"}
            else:
                assert isinstance(m, torch.Tensor) and m.dim() == 4


def test_stop_token_ends_request_and_is_kept():
    model = _model()
    core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=40))
    core.add(_req(1, [3, 4, 5], max_new_tokens=12, temperature=0.0))
    greedy = core.run_until_done()[0].output_ids
    stop = greedy[4]
    first = greedy.index(stop)
    core.add(_req(1, [3, 4, 5], max_new_tokens=12, temperature=0.0, stop_token_ids=[stop]))
    c = core.run_until_done()[0]
    assert c.finish_reason == FinishReason.STOP
    assert c.output_ids == greedy[: first + 1]


def test_forced_interruption_injects_phrase_with_zero_mask():
    model = _model()
    phrase = [7, 8, 9]
    core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=40))
    core.add(_req(1, [3, 4, 5], max_new_tokens=20, interruption_at=4, interruption_ids=phrase, answer_budget=5))
    core.add(_req(2, [6, 5], max_new_tokens=3, interruption_at=10, interruption_ids=phrase, answer_budget=5))
    out = {c.prompt_id: c for c in core.run_until_done()}
    c = out["1"]
    # interrupted, then out of answer budget too: a truncation (App. A.13), the interruption recorded
    assert c.finish_reason == FinishReason.LENGTH and c.interrupted_at == 4
    assert len(c.output_ids) == 4 + 3 + 5
    assert c.output_ids[4:7] == phrase
    assert c.loss_mask == [1] * 4 + [0] * 3 + [1] * 5
    assert c.gen_logprobs[4:7] == [0.0, 0.0, 0.0]
    ref = _oracle_logprobs(model, [3, 4, 5], c.output_ids)
    for j, m in enumerate(c.loss_mask):
        if m:
            assert abs(ref[j] - c.gen_logprobs[j]) < 1e-5
    # budget exhausted before the interruption point: a plain truncation
    assert out["2"].finish_reason == FinishReason.LENGTH and out["2"].interrupted_at is None


def test_interrupted_sample_that_stops_in_its_answer_is_interrupted_not_truncated():
    model = _model()
    phrase = [7, 8, 9]
    kw = dict(max_new_tokens=20, interruption_at=4, interruption_ids=phrase, answer_budget=5, temperature=0.0)
    core = GenerationCore(model, config=CoreConfig(max_batch=1, max_seq_len=40))
    core.add(_req(1, [3, 4, 5], **kw))
    greedy = core.run_until_done()[0].output_ids
    answer = greedy[7:]
    stop = next(t for t in answer if t not in greedy[:7])  # first answer token not seen before
    core.add(_req(1, [3, 4, 5], stop_token_ids=[stop], **kw))
    c = core.run_until_done()[0]
    assert c.finish_reason == FinishReason.INTERRUPTED and c.interrupted_at == 4
    assert c.output_ids == greedy[: 7 + answer.index(stop) + 1]


def test_truncation_alarm_fires_when_interrupted_samples_exhaust_their_answer_budget():
    """Under forced interruptions, samples out of answer budget count as truncated and fire the alarm."""
    import warnings

    from scalerl_mega.metrics.alarms import TruncationAlarm, TruncationRateWarning
    from scalerl_mega.metrics.rollout_stats import rollout_metrics
    from scalerl_mega.types import Group, Prompt, ScoredCompletion

    core = GenerationCore(_model(), config=CoreConfig(max_batch=4, max_seq_len=40))
    for i in range(4):  # no stop token: every answer runs out of its 3-token budget
        core.add(_req(i, [3, 4 + i], max_new_tokens=20, interruption_at=4, interruption_ids=[7, 8],
                      answer_budget=3))
    done = core.run_until_done()
    assert all(c.interrupted_at == 4 and len(c.output_ids) == 4 + 2 + 3 for c in done)
    group = Group(prompt=Prompt(prompt_id="p", text="q", task="synthetic", gold="1"),
                  samples=[ScoredCompletion(completion=c, reward=0.0, passed=False) for c in done])
    m = rollout_metrics([group], step=0)
    assert m["truncation_rate"] == 1.0 and m["interruption_rate"] == 1.0
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert TruncationAlarm(0.10).check(step=0, truncation_rate=m["truncation_rate"])
    assert any(issubclass(w.category, TruncationRateWarning) for w in rec)


def test_load_weights_rejects_unknown_names_and_shapes():
    core = GenerationCore(_model(), config=CoreConfig(max_batch=1, max_seq_len=16))
    with pytest.raises(ValueError, match="unknown parameter name"):
        core.load_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        core.load_weights([("model.norm.weight", torch.zeros(5))])


def test_request_exceeding_max_seq_len_is_refused():
    core = GenerationCore(_model(), config=CoreConfig(max_batch=1, max_seq_len=16))
    with pytest.raises(ValueError, match="max_seq_len=16"):
        core.add(_req(1, [1] * 10, max_new_tokens=7))


# ---- in-flight weight update -----------------------------------------------------------------
def test_in_flight_update_keeps_stale_kv_and_tags_versions():
    """A request started under v0 continues under v1 after k tokens: tokens tagged 0 then 1, and
    the continuation equals a reference (HF DynamicCache) that swaps weights at the same token."""
    model_a, model_b = _model(seed=0), _model(seed=1)
    new_weights = {k: v.clone() for k, v in model_b.state_dict().items()}
    prompt, k, total = [5, 9, 2, 11], 5, 14
    req = _req(1, prompt, max_new_tokens=total, temperature=1.0, seed=4242)
    core = GenerationCore(_model(seed=0), config=CoreConfig(max_batch=2, max_seq_len=32))
    core.add(req)
    core.add(_req(2, [1, 2], max_new_tokens=total, temperature=1.0))  # a neighbour in the batch
    c = next(x for x in update_after(core, rid="1", k=k, weights=new_weights) if x.prompt_id == "1")
    assert c.weight_versions == [0] * k + [1] * (total - k)

    # reference: HF's own cache; weights swapped after the k-th token was sampled
    from transformers import DynamicCache

    ref_tokens, ref_lps = swapped_reference(_model(seed=0), new_weights, prompt, k=k, total=total, seed=4242,
                                            cache=DynamicCache())
    assert c.output_ids == ref_tokens
    assert max(abs(a - b) for a, b in zip(ref_lps, c.gen_logprobs)) < 1e-5
    # and it is really the stale KV: recomputing the prefix with v1 gives different log-probs
    fresh = _oracle_logprobs(model_b, prompt, c.output_ids)
    assert max(abs(a - b) for a, b in zip(fresh[k:], c.gen_logprobs[k:])) > 1e-3
    del model_a


def test_retract_recomputes_kv_with_new_weights_and_abort_returns_partial():
    model_b = _model(seed=1)
    core = GenerationCore(_model(seed=0), config=CoreConfig(max_batch=2, max_seq_len=32))
    core.add(_req(1, [5, 9, 2], max_new_tokens=10))
    for _ in range(4):
        core.step()
    assert core.retract_all() == 1 and core.num_running == 0 and core.num_waiting == 1
    core.load_weights(model_b.state_dict().items())
    core.set_version(1)
    c = core.run_until_done()[0]
    assert c.weight_versions == [0] * 4 + [1] * 6
    # after retract, the continuation sees a KV recomputed under v1: equals a full v1 forward
    fresh = _oracle_logprobs(model_b, [5, 9, 2], c.output_ids)
    assert max(abs(a - b) for a, b in zip(fresh[4:], c.gen_logprobs[4:])) < 1e-5
    core.add(_req(2, [5, 9, 2], max_new_tokens=10))
    core.add(_req(3, [4], max_new_tokens=10))
    core.step()
    aborted = core.abort_all()
    assert {a.finish_reason for a in aborted} == {FinishReason.ABORT}
    assert sorted(len(a.output_ids) for a in aborted) == [1, 1]


def test_bad_sampling_parameters_are_refused():
    core = GenerationCore(_model(), config=CoreConfig(max_batch=1, max_seq_len=16))
    with pytest.raises(ValueError, match="top_p=0.0"):
        core.add(_req(1, [1], max_new_tokens=2, top_p=0.0))
    with pytest.raises(ValueError, match="interruption_ids empty"):
        core.add(_req(1, [1], max_new_tokens=4, interruption_at=2))


def test_bf16_head_ablation_differs_from_fp32_head():
    """bf16 model: the FP32 head's log-probs follow the float64 product of the same bf16 weights
    and hidden states; the bf16 head (logits rounded to bf16) deviates more."""
    model = _model().to(torch.bfloat16)
    fp32 = GenerationCore(model, config=CoreConfig(max_batch=1, max_seq_len=16, fp32_lm_head=True))
    bf16 = GenerationCore(model, config=CoreConfig(max_batch=1, max_seq_len=16, fp32_lm_head=False))
    torch.manual_seed(0)
    hidden = torch.randn(64, 32).to(torch.bfloat16)
    w = model.get_output_embeddings().weight
    ref = torch.log_softmax(hidden.double() @ w.double().T, -1)
    err32 = (torch.log_softmax(fp32._logits(hidden), -1).double() - ref).abs().max().item()
    err16 = (torch.log_softmax(bf16._logits(hidden), -1).double() - ref).abs().max().item()
    assert err32 < 1e-4 and err16 > 10 * err32


def test_hold_at_stops_decoding_until_the_next_version_only_when_nothing_else_needs_it():
    """`SamplingParams.hold_at` (rollout.inflight_hold_tokens): a holdable request keeps decoding while
    a non-holdable one runs, stops at `hold_at` tokens once only holdable work remains, and resumes
    under the next weight version, so its completion spans two versions."""
    core = GenerationCore(_model(seed=0), config=CoreConfig(max_batch=4, max_seq_len=64))
    needed = _req(1, [5, 9], max_new_tokens=6, temperature=1.0, seed=7, stop_token_ids=[])
    held = _req(2, [3, 4], max_new_tokens=20, temperature=1.0, seed=8, stop_token_ids=[], hold_at=2)
    core.add(needed)
    core.add(held)
    done = []
    while core.can_progress():
        done += core.step()
    # the needed request finished (6 tokens); the held one decoded alongside it, then stopped
    assert [c.prompt_id for c in done] == ["1"] and len(done[0].output_ids) == 6
    assert core.has_work() and not core.can_progress() and core.step() == []
    n_before = len(core.rows[0].output_ids)
    assert n_before >= 2
    core.set_version(1)  # the next weight version arrives: the hold is released
    assert core.can_progress()
    done = core.run_until_done()
    c = done[0]
    assert c.weight_versions == [0] * n_before + [1] * (20 - n_before)
    # a request submitted under the current version holds at exactly hold_at when alone
    core.add(_req(3, [6], max_new_tokens=10, temperature=1.0, stop_token_ids=[], hold_at=3))
    core.waiting[0].req.submitted_version = 1
    assert core.run_until_done() == [] and len(core.rows[0].output_ids) == 3
