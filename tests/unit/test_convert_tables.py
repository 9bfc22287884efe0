"""Pure layout/name functions of the HF <-> Megatron converter, checked against hand-worked
examples and independent re-implementations (HF complex RoPE, HF Llama4TextMoe forward)."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.convert import layout, sharding, tables
from scalerl_mega.convert.dims import dims_from_hf_config


def test_fuse_qkv_hand_worked():
    # 4 query heads, 2 groups, head_dim 1, hidden 1: Megatron groups [q q k v] per query group
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    k = torch.tensor([[10.0], [11.0]])
    v = torch.tensor([[20.0], [21.0]])
    fused = layout.fuse_qkv(q, k, v, num_groups=2, head_dim=1)
    assert fused.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    q2, k2, v2 = layout.split_qkv(fused, num_groups=2, head_dim=1, heads_per_group=2)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def _rope_complex(x, theta):  # HF Llama-4: pairs (2i, 2i+1) rotate by theta_i
    xc = torch.view_as_complex(x.reshape(-1, 2))
    return torch.view_as_real(xc * torch.polar(torch.ones_like(theta), theta)).flatten()


def _rope_half(x, theta):  # Megatron: (i, i + d/2) rotate by theta_i
    d = x.numel() // 2
    cos, sin = torch.cat([theta.cos()] * 2), torch.cat([theta.sin()] * 2)
    rot = torch.cat([-x[d:], x[:d]])
    return x * cos + rot * sin


def test_rope_pair_permutation_maps_complex_rope_to_rotate_half():
    torch.manual_seed(0)
    hd = 8
    w = torch.randn(2 * hd, 3, dtype=torch.float64)  # two heads
    hidden = torch.randn(3, dtype=torch.float64)
    theta = torch.rand(hd // 2, dtype=torch.float64) * 3
    perm_w = layout.rope_pairs_to_halves(w, head_dim=hd)
    for h in range(2):
        x_hf = w[h * hd:(h + 1) * hd] @ hidden
        x_mc = perm_w[h * hd:(h + 1) * hd] @ hidden
        want = _rope_complex(x_hf, theta)
        got = _rope_half(x_mc, theta)
        # same values, rotate-half order: (0, 2, 4, 6, 1, 3, 5, 7)
        assert torch.allclose(got, want[[0, 2, 4, 6, 1, 3, 5, 7]], atol=1e-12)
        # dot products (attention scores) are unchanged
        y = torch.randn(hd, dtype=torch.float64)
        assert math.isclose(float(want @ y), float(got @ y[[0, 2, 4, 6, 1, 3, 5, 7]]), rel_tol=1e-12)
    assert torch.equal(layout.rope_halves_to_pairs(perm_w, head_dim=hd), w)


def test_glu_tp_shard_hand_worked_and_merge():
    fc1 = torch.arange(8.0).reshape(4, 2)  # rows g0 g1 u0 u1
    r0 = sharding.tp_shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, rank=0, size=2)
    r1 = sharding.tp_shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, rank=1, size=2)
    assert r0.tolist() == [[0, 1], [4, 5]] and r1.tolist() == [[2, 3], [6, 7]]
    assert torch.equal(sharding.tp_merge("decoder.layers.0.mlp.linear_fc1.weight", [r0, r1]), fc1)
    proj = torch.arange(8.0).reshape(2, 4)
    s = [sharding.tp_shard("x.linear_proj.weight", proj, rank=r, size=2) for r in range(2)]
    assert s[0].tolist() == [[0, 1], [4, 5]]
    assert sharding.tp_kind("decoder.layers.3.mlp.router.weight") == sharding.REPLICATED


def test_local_names_map_to_global():
    g = sharding.to_global_name("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight", layer_offset=2, expert_offset=2)
    assert g == "decoder.layers.3.mlp.experts.linear_fc2.weight3"
    assert sharding.to_global_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", layer_offset=0, expert_offset=0) == "decoder.layers.0.input_layernorm.weight"


def _tiny_cfg(arch):
    from scalerl_mega.convert.tiny import tiny_hf_config

    return tiny_hf_config(arch)


def test_llama4_dims_use_megatron_nope_convention():
    cfg = _tiny_cfg("llama4").to_dict()
    d = dims_from_hf_config(cfg)
    assert cfg["no_rope_layers"] == [1, 0, 1, 0]  # HF: 1 = RoPE layer
    assert d.no_rope_layers == (0, 1, 0, 1)  # Megatron: 1 = NoPE
    assert d.moe_layers == (0, 1, 2, 3) and d.num_experts == 4 and d.attention_chunk_size == 8
    # Scout's RoPE scaling: every HF parameter is carried, none is refused
    assert (d.rope_scaling_factor, d.rope_low_freq_factor, d.rope_high_freq_factor,
            d.rope_original_max_position_embeddings) == (16.0, 1.0, 1.0, 16)
    bad = dict(cfg, rope_parameters=dict(cfg["rope_parameters"], high_freq_factor=0.5))
    with pytest.raises(ValueError, match="high_freq_factor=0.5 < low_freq_factor"):
        dims_from_hf_config(bad)
    missing = dict(cfg, rope_parameters={k: v for k, v in cfg["rope_parameters"].items() if k != "low_freq_factor"})
    with pytest.raises(ValueError, match="'low_freq_factor' is missing"):
        dims_from_hf_config(missing)
    with pytest.raises(ValueError, match="'llama' was requested"):
        dims_from_hf_config(cfg, expect_arch="llama")


def test_llama4_dims_derive_absent_layer_lists_like_transformers():
    """A config.json may leave no_rope_layers empty and moe_layers out (Llama4TextConfig derives them
    from no_rope_layer_interval / interleave_moe_layer_step): same dims as the derived lists."""
    from transformers import Llama4TextConfig

    cfg = _tiny_cfg("llama4").to_dict()
    raw = {k: v for k, v in cfg.items() if k not in ("moe_layers", "layer_types")}
    raw.update(no_rope_layers=[], no_rope_layer_interval=4, interleave_moe_layer_step=2)
    d = dims_from_hf_config(raw)
    hf = Llama4TextConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")})
    assert d.moe_layers == tuple(hf.moe_layers) == (1, 3)
    assert d.no_rope_layers == tuple(1 - f for f in hf.no_rope_layers) == (0, 0, 0, 1)


def test_model_config_from_hf_llama4():
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf

    cfg = _tiny_cfg("llama4").to_dict()
    m = model_config_from_hf(cfg)
    assert (m.no_rope_freq, m.attention_chunk_size, m.num_experts, m.moe_topk, m.shared_expert_ffn) == (2, 8, 4, 1, 48)
    assert m.moe_router_score_function == "sigmoid" and m.moe_apply_probs_on_input and m.qk_l2_norm
    assert (m.rope_scaling, m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
            m.rope_original_max_position_embeddings) == (True, 16.0, 1.0, 1.0, 16)
    assert dims_from_model_config(m) == dims_from_hf_config(cfg)


def test_tables_cover_every_hf_tensor_once():
    from transformers import AutoModelForCausalLM

    for arch in ("llama", "llama4"):
        cfg = _tiny_cfg(arch)
        hf = AutoModelForCausalLM.from_config(cfg)
        d = dims_from_hf_config(cfg.to_dict())
        names = tables.hf_names(d)
        assert sorted(names) == sorted(hf.state_dict()) and len(set(names)) == len(names)
        for n, t in hf.state_dict().items():
            assert tables.expected_hf_shape(n, d) == tuple(t.shape), n


def test_moe_layout_matches_hf_moe_forward():
    """Converted router/expert/shared weights, run through Megatron's top-1 sigmoid MoE math written
    here from its definition (probability applied to the expert input), reproduce HF Llama4TextMoe."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    torch.manual_seed(0)
    cfg = _tiny_cfg("llama4")
    moe = Llama4TextMoe(cfg).double()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    d = dims_from_hf_config(cfg.to_dict())
    sd = {f"model.layers.0.feed_forward.{k}": v for k, v in moe.state_dict().items()}
    mc = {}
    for g in tables.iter_groups(d, layers=[0], first_stage=False, last_stage=False):
        if all(n in sd for n in g.hf):
            mc.update(tables.hf_to_mcore(g, [sd[n] for n in g.hf], dims=d, padded_vocab=d.vocab_size))
    x = torch.randn(5, cfg.hidden_size, dtype=torch.float64)
    logits = x @ mc["decoder.layers.0.mlp.router.weight"].t()
    out = []
    for t in range(x.shape[0]):
        e = int(logits[t].argmax())
        xin = torch.sigmoid(logits[t, e]) * x[t]
        gate, up = (mc[f"decoder.layers.0.mlp.experts.linear_fc1.weight{e}"] @ xin).chunk(2)
        routed = mc[f"decoder.layers.0.mlp.experts.linear_fc2.weight{e}"] @ (torch.nn.functional.silu(gate) * up)
        sg, su = (mc["decoder.layers.0.mlp.shared_experts.linear_fc1.weight"] @ x[t]).chunk(2)
        shared = mc["decoder.layers.0.mlp.shared_experts.linear_fc2.weight"] @ (torch.nn.functional.silu(sg) * su)
        out.append(routed + shared)
    with torch.no_grad():
        want, _ = moe(x)
    assert torch.allclose(torch.stack(out), want, atol=1e-10)


def test_vocab_padding_round_trip():
    w = torch.randn(100, 4)
    p = layout.pad_vocab(w, padded_vocab=128)
    assert p.shape == (128, 4) and torch.equal(p[100:], torch.zeros(28, 4))
    assert torch.equal(layout.unpad_vocab(p, vocab=100), w)


def test_llama4_attention_helpers_hand_worked():
    from scalerl_mega.trainer.megatron import llama4

    s = llama4.temperature_scales(torch.tensor([0, 1, 3]), floor_scale=2, attn_scale=0.5)
    assert torch.allclose(s, torch.tensor([1.0, 1 + 0.5 * math.log(2), 1 + 0.5 * math.log(3)]))



def test_hf_layout_detection_and_errors():
    from scalerl_mega.convert import hf_layout
    from scalerl_mega.convert.tiny import tiny_conditional_config

    cond = hf_layout.layout_of_config(tiny_conditional_config().to_dict())
    assert cond.kind == "conditional" and cond.prefix == "language_model."
    assert cond.text_config["model_type"] == "llama4_text" and cond.hf_name("lm_head.weight") == "language_model.lm_head.weight"
    assert cond.is_non_text("vision_model.class_embedding") and not cond.is_non_text("language_model.lm_head.weight")
    assert dims_from_hf_config(cond.text_config) == dims_from_hf_config(_tiny_cfg("llama4").to_dict())
    causal = hf_layout.layout_of_config(_tiny_cfg("llama4").to_dict())
    assert causal.kind == "causal" and causal.prefix == "" and not causal.is_non_text("vision_model.x")
    with pytest.raises(ValueError, match="without a text_config"):
        hf_layout.layout_of_config({"model_type": "llama4"})
    with pytest.raises(ValueError, match="layout='conditional' is Llama-4 and Qwen3.5 only"):
        hf_layout.output_config("conditional", _tiny_cfg("llama").to_dict())
    out = hf_layout.output_config("conditional", causal.text_config)
    assert out["architectures"] == ["Llama4ForConditionalGeneration"] and hf_layout.layout_of_config(out).kind == "conditional"
    assert hf_layout.sglang_warnings("conditional", causal.text_config, ["x"]) == []
    assert hf_layout.sglang_warnings("causal", _tiny_cfg("llama").to_dict(), ["x"]) == []
