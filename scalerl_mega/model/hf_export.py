"""The reverse of `convert.model_config.model_config_from_hf`: trainer ModelConfig -> HF config kwargs.

The local engine builds its HF `transformers` model from these kwargs (the architecture's config class,
model/archs.py: LlamaConfig, Llama4TextConfig, Qwen3Config, Qwen3MoeConfig), so trainer and engine hold the same architecture and the trainer's exported
HF-named tensors load into the engine one to one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.model.config import ModelConfig


def hf_config_from_model(m: ModelConfig) -> tuple[str, dict[str, Any]]:
    """(arch, kwargs) for `LocalModelSpec(arch=..., config=kwargs)`; `m` is a trainer ModelConfig.

    Llama-4: HF's `no_rope_layers` uses 1 = RoPE layer (Megatron's convention is the opposite);
    `attention_chunk_size=0` (off) becomes a chunk as long as the context, which is full attention.
    """
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(m.rope_theta)}
    if m.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": float(m.rope_theta), "factor": float(m.rope_scaling_factor),
                "low_freq_factor": float(m.rope_low_freq_factor), "high_freq_factor": float(m.rope_high_freq_factor),
                "original_max_position_embeddings": int(m.rope_original_max_position_embeddings)}
    common = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                  num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_query_groups,
                  head_dim=m.kv_channels, max_position_embeddings=m.max_position_embeddings,
                  rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tie_embeddings, rope_parameters=rope,
                  initializer_range=m.init_method_std, attention_bias=False)
    if m.arch in ("llama", "qwen3"):
        if m.is_moe:
            raise ValueError(f"model '{m.name}': arch={m.arch!r} with num_experts={m.num_experts}; MoE needs arch: "
                             f"{'llama4' if m.arch == 'llama' else 'qwen3_moe'}")
        extra = {"mlp_bias": False} if m.arch == "llama" else {"use_sliding_window": False}
        return m.arch, dict(common, intermediate_size=m.ffn_hidden_size, **extra)
    if m.arch == "qwen3_moe":
        return "qwen3_moe", _qwen3_moe_kwargs(m, common)
    if m.arch == "deepseek_v3":
        from scalerl_mega.convert.deepseek_dims import hf_config_kwargs

        return "deepseek_v3", hf_config_kwargs(m, common)
    if m.arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        from scalerl_mega.convert.hybrid_dims import hf_config_kwargs as hybrid_kwargs

        return m.arch, hybrid_kwargs(m, common)
    if m.arch != "llama4":
        raise ValueError(f"model '{m.name}': arch={m.arch!r} has no HF config mapping")
    if m.is_moe:
        if m.moe_topk != 1 or m.moe_router_score_function != "sigmoid" or not m.moe_apply_probs_on_input:
            raise ValueError(f"model '{m.name}': HF Llama-4 routes top-1 with sigmoid scores applied to the expert "
                             f"input; got moe_topk={m.moe_topk}, score={m.moe_router_score_function!r}, "
                             f"apply_probs_on_input={m.moe_apply_probs_on_input}")
        if m.shared_expert_ffn != m.expert_ffn:
            raise ValueError(f"model '{m.name}': shared_expert_ffn={m.shared_expert_ffn} != moe_ffn_hidden_size="
                             f"{m.expert_ffn}; HF Llama-4 uses one width for both")
    n = int(m.no_rope_freq or 0)
    return "llama4", dict(
        common,
        intermediate_size=m.expert_ffn if m.is_moe else m.ffn_hidden_size,
        intermediate_size_mlp=m.ffn_hidden_size,
        num_local_experts=max(m.num_experts, 1),
        num_experts_per_tok=1,
        moe_layers=[i for i in range(m.num_layers) if m.is_moe_layer(i)],
        no_rope_layers=[0 if n and (i + 1) % n == 0 else 1 for i in range(m.num_layers)],
        attention_chunk_size=int(m.attention_chunk_size or m.max_position_embeddings),
        use_qk_norm=bool(m.qk_l2_norm),
        attn_temperature_tuning=bool(m.attn_temperature_tuning),
        floor_scale=int(m.floor_scale),
        attn_scale=float(m.attn_scale),
    )


def _qwen3_moe_kwargs(m: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
    """Qwen3MoeConfig kwargs: HF routes softmax top-k over every expert (renormalised when
    `norm_topk_prob`, Megatron's `moe_router_pre_softmax=False`), without a shared expert; a layer is MoE
    unless in `mlp_only_layers`, every `decoder_sparse_step`-th layer."""
    if not m.is_moe:
        raise ValueError(f"model '{m.name}': arch='qwen3_moe' without experts (num_experts=0); a dense Qwen3 is arch: qwen3")
    if m.moe_router_score_function != "softmax" or m.shared_expert_ffn or m.moe_apply_probs_on_input:
        raise ValueError(f"model '{m.name}': HF Qwen3-MoE routes with softmax scores on the expert output and has no "
                         f"shared expert; got moe_router_score_function={m.moe_router_score_function!r}, "
                         f"shared_expert_ffn={m.shared_expert_ffn}, moe_apply_probs_on_input={m.moe_apply_probs_on_input}")
    return dict(common, intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.expert_ffn,
                num_experts=m.num_experts, num_experts_per_tok=m.moe_topk, norm_topk_prob=not m.moe_router_pre_softmax,
                decoder_sparse_step=m.moe_layer_freq, mlp_only_layers=sorted(m.moe_dense_layers),
                router_aux_loss_coef=float(m.moe_aux_loss_coeff), use_sliding_window=False)
