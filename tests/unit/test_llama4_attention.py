"""Llama-4 attention pieces without a process group: chunk folding (exactness against a masked
float64 reference), the layer-spec rewrite (TE's core attention is kept), Llama-3/Scout RoPE
scaling against transformers and Megatron, and that the tiny test model's features all bite."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.trainer.megatron import llama4
from scalerl_mega.model.rope import Llama3RopeScaling, llama3_inv_freq


def test_fold_chunks_hand_worked_and_inverse():
    x = torch.arange(10.0).view(5, 2)  # [s=5, b=2]: x[i, j] = 2i + j
    f = llama4.fold_chunks(x, 2)  # 3 chunks, the last padded: [2, 3*2]
    assert f.tolist() == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 0]]
    assert torch.equal(llama4.unfold_chunks(f, seq=5, batch=2), x)
    one = llama4.fold_chunks(torch.arange(6.0).view(6, 1), 3)  # b == 1: still contiguous
    assert one.is_contiguous() and one.tolist() == [[0, 3], [1, 4], [2, 5]]
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)[None, None]
    fm = llama4.fold_mask(mask, chunk=2, batch=2)  # diagonal blocks, padded key masked
    assert fm.shape == (6, 1, 2, 2)
    assert fm[0, 0].tolist() == [[False, True], [False, False]] and fm[5, 0].tolist() == [[False, True], [True, True]]


def _attention(q, k, v, mask):  # [s, b, h, d], mask [s, s] True = masked; float64 reference
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,kbhd->qbhd", probs, v)


@pytest.mark.parametrize("seq", [21, 24, 5])  # ragged last chunk, exact multiple, one short chunk
def test_folded_causal_attention_equals_chunk_masked_attention(seq):
    torch.manual_seed(0)
    chunk, b = 8, 2
    q, k, v = (torch.randn(seq, b, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pos = torch.arange(seq)
    chunk_mask = (pos[None] > pos[:, None]) | (pos[None] // chunk != pos[:, None] // chunk)
    want = _attention(q, k, v, chunk_mask)
    causal = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), 1)
    folded = _attention(*(llama4.fold_chunks(t, chunk) for t in (q, k, v)), causal)
    got = llama4.unfold_chunks(folded, seq=seq, batch=b)
    assert torch.allclose(got, want, atol=1e-12)
    upstream = torch.randn_like(want)  # gradients (the training path) agree too
    g_want = torch.autograd.grad(want, (q, k, v), upstream)
    g_got = torch.autograd.grad(got, (q, k, v), upstream)
    assert all(torch.allclose(a, b_, atol=1e-12) for a, b_ in zip(g_got, g_want))
    got, want = got.detach(), want.detach()
    if seq > chunk:  # the chunk mask matters: plain causal attention differs
        assert (got - _attention(q, k, v, torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))).abs().max() > 1e-3


def test_layer_spec_keeps_the_spec_core_attention_class():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.torch_norm import L2Norm

    from scalerl_mega.trainer.megatron.models import replace_in_spec

    class FakeTEDotProductAttention(torch.nn.Module):  # stands in for TE's class (not installed on CPU)
        pass

    spec = replace_in_spec(get_gpt_layer_local_spec(normalization="RMSNorm"), DotProductAttention, FakeTEDotProductAttention)
    attention_cls = llama4._self_attention_cls()
    layer = llama4._patch(spec, attention_cls=attention_cls, attention_params={"temperature_tuning": True},
                          chunk_size=8, l2norm=L2Norm)
    new = layer.submodules.self_attention
    core = new.submodules.core_attention
    assert new.module is attention_cls and issubclass(attention_cls, SelfAttention)
    assert issubclass(core.module, FakeTEDotProductAttention) and core.params == {"chunk_size": 8}
    assert core.module.__name__ == "ChunkedFakeTEDotProductAttention"
    assert new.params == {"attn_mask_type": AttnMaskType.causal, "temperature_tuning": True}
    assert new.submodules.q_layernorm is L2Norm and new.submodules.k_layernorm is L2Norm
    assert llama4.chunked_core_attention(FakeTEDotProductAttention) is core.module  # one class per base


def test_no_rope_pattern_is_megatron_convention():
    from scalerl_mega.model.config import ModelConfig

    cfg = ModelConfig(arch="llama4", num_layers=6, no_rope_freq=4).validate()
    assert llama4.no_rope_pattern(cfg) == [0, 0, 0, 1, 0, 0]  # 6 % 4 != 0: a list, not Megatron's int
    assert llama4.no_rope_pattern(ModelConfig(arch="llama4")) is None


def _hf_llama3_inv_freq(rope: dict, head_dim: int):
    from transformers import Llama4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = Llama4TextConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope)
    return ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")[0]


@pytest.mark.parametrize("low,high,ctx", [(1.0, 1.0, 8192), (1.0, 4.0, 8192), (1.0, 1.0, 16), (2.0, 8.0, 64)])
def test_llama3_inv_freq_equals_transformers(low, high, ctx):
    head_dim, theta = 128, 500000.0
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": 16.0, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": ctx}
    base = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    got = llama3_inv_freq(base, Llama3RopeScaling(factor=16.0, low_freq_factor=low, high_freq_factor=high,
                                                  original_max_position_embeddings=ctx))
    want = _hf_llama3_inv_freq(rope, head_dim)
    assert torch.allclose(got, want, rtol=1e-6, atol=0) and not torch.isnan(got).any()
    assert not torch.equal(got, base)  # the scaling changes something


def test_scout_scaling_hand_worked_and_megatron_llama31():
    # low == high: a hard split at wavelength L; longer wavelengths are divided by the factor
    base = torch.tensor([1.0, 2 * math.pi / 10, 2 * math.pi / 100], dtype=torch.float64)  # wavelengths 2pi, 10, 100
    got = llama3_inv_freq(base, Llama3RopeScaling(factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                                                  original_max_position_embeddings=16))
    assert torch.allclose(got, torch.tensor([1.0, 2 * math.pi / 10, 2 * math.pi / 100 / 16], dtype=torch.float64))
    # Llama-3.1's values: Megatron's own (fixed-parameter) implementation agrees
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    inv = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)
    mc = RotaryEmbedding._apply_scaling(None, inv, factor=8.0)
    assert torch.allclose(llama3_inv_freq(inv, Llama3RopeScaling(factor=8.0)), mc, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="high_freq_factor=0.5 < low_freq_factor=1.0"):
        Llama3RopeScaling(factor=8.0, high_freq_factor=0.5).validate("model 'x'")


def test_tiny_llama4_features_change_hf_logits():
    """The tiny config the logits tests use (chunk 8, Scout RoPE scaling past its 16-token original
    context, temperature tuning) at 44 tokens: switching any feature off changes HF's logits, so a
    Megatron model that matched without it would be caught."""
    from transformers import Llama4ForCausalLM

    from scalerl_mega.convert.tiny import tiny_hf_config

    tokens = torch.randint(0, 100, (1, 44), generator=torch.Generator().manual_seed(0))

    def logits(**changes):
        cfg = tiny_hf_config("llama4")
        for k, v in changes.items():
            setattr(cfg, k, v)
        torch.manual_seed(0)
        model = Llama4ForCausalLM._from_config(cfg, attn_implementation="eager").eval()
        with torch.no_grad():
            return model(tokens).logits

    ref = logits()
    for change in ({"attention_chunk_size": 64}, {"attn_temperature_tuning": False},
                   {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}):
        assert (logits(**change) - ref).abs().max() > 1e-2, change
