"""The local engine on the Gated DeltaNet hybrids: Qwen3.5 (dense), Qwen3.5-MoE and Qwen3-Next.

Each request carries a per-slot recurrent state in its GDN layers (the causal convolution's input window and
the delta-rule state) beside the K/V of the full-attention layers. The references are independent of the
engine's slots: one full forward of the whole sequence (teacher forced, float64 log-softmax), and
transformers' own `DynamicCache` for a single request. Interleavings are forced by step counts (which request
joins or finishes at which engine step), never by timing.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
from scalerl_mega.rollout.local import LocalModelSpec, build_model
from scalerl_mega.types import FinishReason, SamplingParams
from tests.support.inflight_update import swapped_reference, update_after

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-5
"""Engine log-probs against the full forward (FP32 model, float64 log-softmax): docs/sglang.md states it."""

_COMMON = dict(vocab_size=61, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_conv_kernel_dim=4, max_position_embeddings=256, tie_word_embeddings=False)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
CONFIGS = {
    # GDN, attention, GDN: a recurrent layer after the full-attention one too
    "qwen3_5": dict(_COMMON, num_hidden_layers=3, intermediate_size=64,
                    layer_types=["linear_attention", "full_attention", "linear_attention"]),
    # the layout derived from full_attention_interval: layers 0 and 2 GDN, 1 and 3 attention
    "qwen3_5_moe": dict(_COMMON, num_hidden_layers=4, full_attention_interval=2, **_MOE),
    # the default interval (4): three GDN layers, then attention; layer 1 a dense MLP
    "qwen3_next": dict(_COMMON, num_hidden_layers=4, intermediate_size=64, mlp_only_layers=[1], **_MOE),
}


def _model(arch: str, seed: int = 0):
    m = build_model(LocalModelSpec(arch=arch, config=CONFIGS[arch], init_seed=seed))
    with torch.no_grad():  # sharpen the random model so that tokens depend on the weights
        m.get_output_embeddings().weight.mul_(8.0)
    return m


def _req(rid: int, prompt: list[int], *, n: int, seed: int | None = None) -> GenRequest:
    return GenRequest(rid=str(rid), prompt_id=str(rid), sample_index=0, prompt_ids=prompt,
                      sampling=SamplingParams(max_new_tokens=n, temperature=1.0), seed=1000 + rid if seed is None else seed)


def _oracle_logprobs(model, prompt: list[int], output: list[int]) -> list[float]:
    """float64 log-softmax of each output token from one full forward of prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


class _KernelSpy:
    """Counts the sequence lengths transformers' GDN layers hand to its chunked and recurrent kernels."""

    def __init__(self, monkeypatch, model):
        import sys

        self.chunk: list[int] = []
        self.recurrent: list[int] = []
        module = sys.modules[type(model.model.layers[0].linear_attn).__module__]
        for name, calls in (("torch_chunk_gated_delta_rule", self.chunk),
                            ("torch_recurrent_gated_delta_rule", self.recurrent)):
            monkeypatch.setattr(module, name, self._spy(getattr(module, name), calls))

    @staticmethod
    def _spy(fn, calls):
        def wrapped(query, *args, **kwargs):
            calls.append(query.shape[1])
            return fn(query, *args, **kwargs)

        return wrapped


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_engine_logprobs_equal_a_full_forward_and_batching_changes_no_token(arch, monkeypatch):
    """8 requests through 3 slots: requests join (admission prefills while others decode) and finish (the last
    active row moves into the freed slot, its state with it) at different steps; two share a prompt (one
    prefill, state copied). Every log-prob equals the full forward's within TOL, and an engine with one slot
    samples the same tokens. Prefills run the chunked kernel over the padded prompts, decode steps the
    recurrent one on single tokens."""
    model = _model(arch)
    spy = _KernelSpy(monkeypatch, model)
    rng = random.Random(0)
    reqs = [_req(i, [rng.randrange(61) for _ in range(rng.randrange(2, 10))], n=rng.randrange(2, 12))
            for i in range(7)]
    reqs.insert(1, _req(7, list(reqs[0].prompt_ids), n=9, seed=77))  # admitted with request 0: a shared prefill
    core = GenerationCore(model, config=CoreConfig(max_batch=3, max_seq_len=24, admit_min_free=1))
    for r in reqs:
        core.add(r)
    out = {c.prompt_id: c for c in core.run_until_done()}
    chunk, recurrent = list(spy.chunk), list(spy.recurrent)  # the engine's calls (the oracle's come after)
    assert sorted(out) == sorted(r.rid for r in reqs)
    for r in reqs:
        c = out[r.rid]
        assert len(c.output_ids) == r.sampling.max_new_tokens and c.finish_reason == FinishReason.LENGTH
        ref = _oracle_logprobs(model, r.prompt_ids, c.output_ids)
        assert max(abs(a - b) for a, b in zip(ref, c.gen_logprobs)) < TOL
    st = core.stats()
    gdn = len(core.kv.states.spec.layers)
    assert st["prefill_steps"] >= 3 and st["prefill_tokens"] < sum(len(r.prompt_ids) for r in reqs)
    assert recurrent == [1] * (gdn * st["decode_steps"])
    assert len(chunk) == gdn * st["prefill_steps"] and min(chunk) > 1
    assert out["0"].output_ids != out["7"].output_ids
    solo = GenerationCore(model, config=CoreConfig(max_batch=1, max_seq_len=24))
    for r in reqs:
        solo.add(r)
    for c in solo.run_until_done():
        assert c.output_ids == out[c.prompt_id].output_ids


def test_kv_buffers_only_for_attention_layers_and_state_sizes_from_the_model():
    core = GenerationCore(_model("qwen3_next"), config=CoreConfig(max_batch=2, max_seq_len=8))
    kv, spec = core.kv, core.kv.states.spec
    assert kv.attn_layers == [3] and len(kv.keys) == 1 and spec.layers == (0, 1, 2)
    # conv channels: q and k (2 key heads x 8) plus v (4 value heads x 8); the delta-rule state per value head
    assert kv.states.conv[0].shape == (2, 2 * 2 * 8 + 4 * 8, 4)
    assert kv.states.state[2].shape == (2, 4, 8, 8) and kv.states.state[2].dtype == torch.float32


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_in_flight_update_keeps_the_recurrent_state(arch):
    """A request started under v0 continues under v1 after k tokens (weights loaded between two decode steps,
    a neighbour in the batch): its tokens and log-probs equal transformers' own cache swapping the weights at
    the same token, and the kept state is stale, not recomputed (a fresh v1 forward differs)."""
    new_weights = {k: v.clone() for k, v in _model(arch, seed=1).state_dict().items()}
    prompt, k, total = [5, 9, 2, 11, 7], 4, 10
    core = GenerationCore(_model(arch), config=CoreConfig(max_batch=2, max_seq_len=24))
    core.add(_req(2, [1, 2], n=total + 2))  # admitted first: the request under test shares its forwards
    core.add(_req(1, prompt, n=total, seed=4242))
    c = next(x for x in update_after(core, rid="1", k=k, weights=new_weights) if x.prompt_id == "1")
    assert c.weight_versions == [0] * k + [1] * (total - k)
    ref_model = _model(arch)
    ref_tokens, ref_lps = swapped_reference(ref_model, new_weights, prompt, k=k, total=total, seed=4242,
                                            cache=DynamicCache(config=ref_model.config))
    assert c.output_ids == ref_tokens
    assert max(abs(a - b) for a, b in zip(ref_lps, c.gen_logprobs)) < TOL
    model_b = _model(arch)
    model_b.load_state_dict(new_weights)
    fresh = _oracle_logprobs(model_b, prompt, c.output_ids)
    assert max(abs(a - b) for a, b in zip(fresh[k:], c.gen_logprobs[k:])) > 1e-3


def test_retraction_recomputes_the_state_with_the_new_weights():
    """Retracted requests are re-admitted with prompt + output so far: the prefill rebuilds their state from zero
    under v1 (a stale state would not match a full v1 forward)."""
    model_b = _model("qwen3_5_moe", seed=1)
    core = GenerationCore(_model("qwen3_5_moe"), config=CoreConfig(max_batch=2, max_seq_len=24))
    core.add(_req(1, [5, 9, 2], n=10))
    core.add(_req(2, [4, 4, 8, 1, 3], n=10))
    for _ in range(4):
        core.step()
    assert core.retract_all() == 2
    core.load_weights(model_b.state_dict().items())
    core.set_version(1)
    for c in core.run_until_done():
        assert c.weight_versions == [0] * 4 + [1] * 6
        fresh = _oracle_logprobs(model_b, c.prompt_ids, c.output_ids)
        assert max(abs(a - b) for a, b in zip(fresh[4:], c.gen_logprobs[4:])) < TOL


def test_recorded_routes_of_a_hybrid_are_a_full_forwards():
    """Routing replay on Qwen3-Next (MoE layers 0, 2, 3; layer 1 dense): the expert ids the engine records per
    position, through prefills and recurrent decode steps, are the router's top-k of one full forward."""
    from scalerl_mega.rollout.core import moe_routers

    model = _model("qwen3_next")
    routers = moe_routers(model)
    with torch.no_grad():
        for r in routers:
            r.weight.mul_(30.0)  # spread the router logits: routes differ between tokens
    core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=24, record_routes=True))
    for i, prompt in enumerate([[3, 17, 40, 8], [5, 9], [22, 1, 1, 60, 14, 7]]):
        core.add(_req(i, prompt, n=6 + i))
    for c in core.run_until_done():
        seq = c.prompt_ids + c.output_ids
        n = c.routes.num_positions
        assert (n, c.routes.num_layers, c.routes.topk) == (len(seq) - 1, 3, 2)
        seen = []
        hooks = [r.register_forward_hook(lambda m, a, out: seen.append(out[2])) for r in routers]
        with torch.no_grad():
            model(torch.tensor([seq[:-1]]))
        for h in hooks:
            h.remove()
        assert torch.equal(torch.tensor(c.routes.expert_ids).view(n, 3, 2).long(), torch.stack(seen, 1).long())


def test_engine_serves_the_language_model_of_a_multimodal_checkpoint(tmp_path):
    """A published Qwen3.5 checkpoint is multimodal (model_type qwen3_5, `text_config`, weights under
    `model.language_model.`, a vision tower): the engine loads its language model as transformers' text-only
    `Qwen3_5ForCausalLM` (the vision tower left out) and its log-probs are the multimodal model's on text."""
    import transformers

    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                  spatial_merge_size=1, temporal_patch_size=1)
    torch.manual_seed(0)
    full = transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=CONFIGS["qwen3_5"], vision_config=vision)).eval()
    full.save_pretrained(tmp_path)
    spec = LocalModelSpec(arch="qwen3_5", path=str(tmp_path))
    model = build_model(spec)
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and not any("visual" in n for n, _ in model.named_parameters())
    core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=24))
    core.add(_req(1, [3, 4, 5, 9], n=8))
    c = core.run_until_done()[0]
    assert max(abs(a - b) for a, b in zip(_oracle_logprobs(full, [3, 4, 5, 9], c.output_ids), c.gen_logprobs)) < TOL
