"""Bridge between HF ``config.json`` dicts, the trainer's ``ModelConfig`` and ``ArchDims``."""

from __future__ import annotations

from typing import Any, Mapping

from scalerl_mega.convert.dims import ArchDims, dims_from_hf_config


def _every_nth(flags: list[int], *, key: str, where: str) -> int:
    """Period N such that flags[i] == ((i + 1) % N == 0); 0 if no flag is set."""
    on = [i for i, f in enumerate(flags) if f]
    if not on:
        return 0
    n = on[0] + 1
    if [int((i + 1) % n == 0) for i in range(len(flags))] != [int(bool(f)) for f in flags]:
        raise ValueError(f"{where}: {key}={flags} is not 'every N-th layer', which ModelConfig expresses")
    return n


def _rope_fields(d: ArchDims) -> dict[str, Any]:
    """ModelConfig RoPE-scaling fields of ``d`` (ModelConfig defaults when scaling is off)."""
    if d.rope_scaling_factor is None:
        return {}
    return dict(rope_scaling_factor=d.rope_scaling_factor, rope_low_freq_factor=d.rope_low_freq_factor,
                rope_high_freq_factor=d.rope_high_freq_factor,
                rope_original_max_position_embeddings=d.rope_original_max_position_embeddings)


def _moe_layer_fields(d: ArchDims) -> dict[str, Any]:
    """`moe_layer_freq` (+ `moe_dense_layers`) reproducing ``d.moe_layers``: every N-th layer when that
    is exact, else the period of the first MoE layer with the remaining layers listed dense."""
    flags = [int(d.is_moe_layer(i)) for i in range(d.num_layers)]
    n = next(i for i, f in enumerate(flags) if f) + 1
    every = [i for i in range(d.num_layers) if (i + 1) % n == 0]
    if all(flags[i] for i in every):
        return {"moe_layer_freq": n, "moe_dense_layers": [i for i in every if not flags[i]]}
    return {"moe_layer_freq": 1, "moe_dense_layers": [i for i, f in enumerate(flags) if not f]}


def _qwen3_moe_fields(d: ArchDims, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE routing in Megatron's terms: softmax scores, top-k; `norm_topk_prob` (renormalised top-k
    weights) is Megatron's softmax over the top-k logits (`moe_router_pre_softmax=False`), without it the
    all-expert softmax (`pre_softmax=True`); the Switch load-balancing loss with `router_aux_loss_coef`."""
    return dict(num_experts=d.num_experts, moe_topk=d.moe_top_k, moe_ffn_hidden_size=d.moe_ffn_hidden_size,
                shared_expert_ffn=0, **_moe_layer_fields(d), moe_router_score_function="softmax",
                moe_router_pre_softmax=not d.moe_norm_topk, moe_router_load_balancing_type="aux_loss",
                moe_aux_loss_coeff=float(cfg.get("router_aux_loss_coef", 0.001)))


def _deepseek_v3_fields(d: ArchDims) -> dict[str, Any]:
    """`ModelConfig` fields (beyond the common ones) of DeepSeek-V3 `ArchDims` `d`."""
    out: dict[str, Any] = dict(
        num_experts=d.num_experts, moe_topk=d.moe_top_k, moe_ffn_hidden_size=d.moe_ffn_hidden_size,
        shared_expert_ffn=d.shared_expert_ffn, moe_layer_freq=1,
        moe_dense_layers=[i for i in range(d.num_layers) if i not in d.moe_layers],
        moe_router_score_function="sigmoid", moe_router_pre_softmax=False, moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, kv_lora_rank=d.kv_lora_rank, q_lora_rank=d.q_lora_rank,
        qk_rope_head_dim=d.qk_rope_head_dim, v_head_dim=d.v_head_dim, moe_router_num_groups=d.moe_num_groups,
        moe_router_group_topk=d.moe_group_topk, moe_router_topk_scaling_factor=d.moe_scaling_factor,
        moe_router_expert_bias=d.moe_expert_bias,
    )
    if d.yarn:
        out.update(zip(("yarn_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
                        "yarn_mscale", "yarn_mscale_all_dim"), d.yarn))
    return out


def model_config_from_hf(cfg: Mapping[str, Any], *, name: str = "hf", where: str = "config.json"):
    """``ModelConfig`` (trainer) equivalent to an HF Llama / Llama-4 text / Qwen3 / Qwen3-MoE config."""
    from scalerl_mega.model.config import ModelConfig

    d = dims_from_hf_config(cfg, where=where)
    common = dict(
        name=name, arch=d.arch, vocab_size=d.vocab_size, hidden_size=d.hidden_size, ffn_hidden_size=d.ffn_hidden_size,
        num_layers=d.num_layers, num_attention_heads=d.num_heads, num_query_groups=d.num_kv_heads, head_dim=d.head_dim,
        max_position_embeddings=d.max_position_embeddings, rope_theta=d.rope_theta,
        rope_scaling=d.rope_scaling_factor is not None, **_rope_fields(d),
        norm_eps=d.rms_norm_eps, tie_embeddings=d.tie_word_embeddings, qk_layernorm=d.qk_layernorm,
    )
    if d.arch in ("llama", "qwen3"):
        return ModelConfig(**common).validate()
    if d.arch == "qwen3_moe":
        return ModelConfig(**common, **_qwen3_moe_fields(d, cfg)).validate()
    if d.arch == "deepseek_v3":
        return ModelConfig(**common, **_deepseek_v3_fields(d)).validate()
    if d.arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        from scalerl_mega.convert.hybrid_dims import model_fields

        moe = _qwen3_moe_fields(d, cfg) if d.num_experts else {}
        return ModelConfig(**common, **{**moe, **model_fields(d)}).validate()
    moe_freq = _every_nth([int(d.is_moe_layer(i)) for i in range(d.num_layers)], key="moe_layers", where=where)
    return ModelConfig(
        **common,
        num_experts=d.num_experts if moe_freq else 0,
        moe_topk=1,
        moe_ffn_hidden_size=d.moe_ffn_hidden_size,
        shared_expert_ffn=d.moe_ffn_hidden_size,
        moe_layer_freq=moe_freq or 1,
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=False,
        moe_router_load_balancing_type="none",
        moe_apply_probs_on_input=True,
        no_rope_freq=_every_nth(list(d.no_rope_layers), key="no_rope_layers", where=where),
        attention_chunk_size=d.attention_chunk_size or 0,
        attn_temperature_tuning=d.attn_temperature_tuning,
        floor_scale=d.floor_scale,
        attn_scale=d.attn_scale,
        qk_l2_norm=d.qk_l2_norm,
    ).validate()


def _arch_rope(m) -> dict[str, Any]:
    if not m.rope_scaling:
        return {"rope_scaling_factor": None}
    return dict(rope_scaling_factor=float(m.rope_scaling_factor), rope_low_freq_factor=float(m.rope_low_freq_factor),
                rope_high_freq_factor=float(m.rope_high_freq_factor),
                rope_original_max_position_embeddings=int(m.rope_original_max_position_embeddings))


def dims_from_model_config(m) -> ArchDims:
    """``ArchDims`` of a trainer ``ModelConfig`` (an ``ArchDims`` is returned unchanged)."""
    if isinstance(m, ArchDims):
        return m
    n = int(m.no_rope_freq or 0)
    llama4 = m.arch == "llama4"
    if llama4 and m.is_moe and m.shared_expert_ffn and m.shared_expert_ffn != m.expert_ffn:
        raise ValueError(f"model '{m.name}': shared_expert_ffn={m.shared_expert_ffn} != expert width {m.expert_ffn}; "
                         "HF Llama-4 uses one width for both")
    if m.arch == "qwen3_moe" and m.shared_expert_ffn:
        raise ValueError(f"model '{m.name}': shared_expert_ffn={m.shared_expert_ffn} but HF Qwen3-MoE has no shared "
                         "expert (its weights would have no HF name); set model.shared_expert_ffn=0")
    extra: dict[str, Any] = {}
    if m.arch == "deepseek_v3":
        from scalerl_mega.convert.deepseek_dims import dims_fields

        extra = dims_fields(m)
    if m.arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        from scalerl_mega.convert.hybrid_dims import dims_fields as hybrid_fields

        extra = hybrid_fields(m)
    return ArchDims(
        **extra,
        arch=m.arch, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_attention_heads,
        num_kv_heads=m.num_query_groups, head_dim=m.kv_channels, ffn_hidden_size=m.ffn_hidden_size,
        vocab_size=m.vocab_size, tie_word_embeddings=m.tie_embeddings, rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta, **_arch_rope(m),
        max_position_embeddings=m.max_position_embeddings,
        num_experts=m.num_experts, moe_ffn_hidden_size=m.expert_ffn if m.is_moe else 0, moe_top_k=m.moe_topk if m.is_moe else 0,
        moe_layers=tuple(i for i in range(m.num_layers) if m.is_moe_layer(i)),
        # Llama-3 configs have no per-layer NoPE list (HF dense: ()); Llama-4 lists every layer
        no_rope_layers=tuple(int(bool(n) and (i + 1) % n == 0) for i in range(m.num_layers)) if llama4 else (),
        qk_l2_norm=m.qk_l2_norm, attention_chunk_size=m.attention_chunk_size or None,
        attn_temperature_tuning=m.attn_temperature_tuning, floor_scale=m.floor_scale, attn_scale=m.attn_scale,
        rope_interleaved_in_hf=llama4, qk_layernorm=m.qk_layernorm,
        moe_norm_topk=m.is_moe and (m.arch == "deepseek_v3" or (m.moe_router_score_function == "softmax"
                                                                  and not m.moe_router_pre_softmax)),
    )
