"""Tiny random HF checkpoints built from config objects (tests, benchmarks; no downloads)."""

from __future__ import annotations


# Llama-4 Scout's RoPE scaling (factor 16, low = high = 1.0) with the original context scaled
# down from 8192 to 16, so that sequences of a few dozen tokens reach beyond it.
SCOUT_ROPE_TINY = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 1.0, "original_max_position_embeddings": 16}


def tiny_hf_config(arch: str, *, tie: bool = False, init_std: float = 0.15, **overrides):
    """Tiny Llama-3 (dense, Llama-3.1 RoPE scaling), Llama-4 text (4 experts top-1 + shared
    expert, NoPE every 2nd layer, chunk size 8, temperature tuning and QK L2 norm on, Scout's RoPE
    scaling ``SCOUT_ROPE_TINY``), Qwen3 (q/k norms, head_dim 32 != hidden / heads, RoPE base 1e6) or
    Qwen3-MoE (4 experts top-2 renormalised, layer 1 dense through `mlp_only_layers`) config.
    ``init_std`` is large so that every feature visibly changes the logits; ``overrides`` replace
    config fields (e.g. ``norm_topk_prob=False``)."""
    from transformers import Llama4TextConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    if arch == "llama":
        return LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, rope_parameters={**rope, "factor": 8.0},
                           tie_word_embeddings=tie, initializer_range=init_std, rms_norm_eps=1e-5)
    if arch == "llama4":
        return Llama4TextConfig(vocab_size=100, hidden_size=64, intermediate_size=48, intermediate_size_mlp=96,
                                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                num_local_experts=4, num_experts_per_tok=1, no_rope_layer_interval=2,
                                attention_chunk_size=8, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
                                use_qk_norm=True, rope_parameters=dict(SCOUT_ROPE_TINY), tie_word_embeddings=tie,
                                initializer_range=init_std, max_position_embeddings=128)
    qwen = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                tie_word_embeddings=tie, initializer_range=init_std, max_position_embeddings=128)
    if arch == "qwen3":
        return Qwen3Config(**{**qwen, "num_hidden_layers": 2, **overrides})
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**{**qwen, "num_hidden_layers": 4, "moe_intermediate_size": 32, "num_experts": 4,
                                 "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
                                 "mlp_only_layers": [1], "router_aux_loss_coef": 0.001, **overrides})
    if arch == "deepseek_v3":
        return tiny_deepseek_v3_config(tie=tie, init_std=init_std, **overrides)
    if arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        return tiny_hybrid_config(arch, tie=tie, **overrides)  # its own initializer_range
    raise ValueError(f"arch={arch!r}: expected 'llama', 'llama4', 'qwen3', 'qwen3_moe', 'deepseek_v3', 'qwen3_next', "
                     "'qwen3_5' or 'qwen3_5_moe'")


def tiny_hybrid_config(arch: str, *, tie: bool = False, init_std: float = 0.1, **overrides):
    """Tiny Gated DeltaNet hybrid: 3 layers (GDN, gated full attention, GDN: `full_attention_interval` 2), hidden
    32, 4 query / 2 KV heads of 16 with RoPE on the first half (`partial_rotary_factor` 0.5), GDN with 2 key heads
    of 8 and 4 value heads of 8 (two value heads per key head), conv kernel 4; Qwen3-Next and Qwen3.5-MoE: 4 experts
    top-2 (renormalised) of width 16 and a sigmoid-gated shared expert of 24, Qwen3-Next's last layer dense
    through `mlp_only_layers`; Qwen3.5: a dense MLP of 48. Same shapes as conf/model/tiny_<arch>.yaml.
    `initializer_range` 0.1 keeps the logits near 3 (0.15 doubles them, and the FP32 rounding of TP-split sums
    then reaches 1e-5)."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3NextConfig

    common = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=2, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                  tie_word_embeddings=tie, initializer_range=init_std, max_position_embeddings=128)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
               router_aux_loss_coef=0.001)
    if arch == "qwen3_5":
        return Qwen3_5TextConfig(**{**common, "intermediate_size": 48, **overrides})
    if arch == "qwen3_5_moe":
        return Qwen3_5MoeTextConfig(**{**common, **moe, **overrides})
    return Qwen3NextConfig(**{**common, **moe, "intermediate_size": 48, "norm_topk_prob": True, "decoder_sparse_step": 1,
                              "mlp_only_layers": [2], **overrides})


# YaRN as DeepSeek-V3's (factor 40 of 4096, mscale = mscale_all_dim = 1) scaled down to an original context of 16
DEEPSEEK_YARN_TINY = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def tiny_deepseek_v3_config(*, tie: bool = False, init_std: float = 0.15, **overrides):
    """Tiny DeepSeek-V3: MLA (q_lora 24, kv_lora 16, no-RoPE q/k 16 + RoPE 8, v 12), YaRN past its original
    context of 16, layer 0 dense then MoE: 8 routed experts in 4 groups, top-4 within the best 2 groups (HF's
    top-2-per-group ranking = Megatron's top-(4 // 2)), 2 shared experts, routed_scaling_factor 2.5; the same
    shapes as conf/model/tiny_deepseek_v3.yaml."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**{**dict(
        vocab_size=100, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=8, routed_scaling_factor=2.5,
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16, n_group=4,
        topk_group=2, num_experts_per_tok=4, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=128,
        rms_norm_eps=1e-6, initializer_range=init_std, tie_word_embeddings=tie, num_nextn_predict_layers=0,
        rope_parameters=dict(DEEPSEEK_YARN_TINY)), **overrides})


def tiny_conditional_config(*, tie: bool = False, init_std: float = 0.15):
    """Tiny multimodal ``Llama4Config`` (``Llama4ForConditionalGeneration``): the tiny Llama-4 text
    config plus a one-layer vision tower."""
    from transformers import Llama4Config, Llama4VisionConfig

    vision = Llama4VisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                image_size=28, patch_size=14, vision_output_dim=64, projector_input_dim=64,
                                projector_output_dim=64, pixel_shuffle_ratio=0.5)
    text = tiny_hf_config("llama4", tie=tie, init_std=init_std)
    return Llama4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), tie_word_embeddings=tie)


def tiny_qwen_vl_model(arch: str, *, tie: bool = False):
    """Tiny multimodal ``Qwen3_5(Moe)ForConditionalGeneration``: the tiny text model plus a one-block vision tower."""
    import torch
    import transformers

    cls = "Qwen3_5MoeForConditionalGeneration" if arch == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    config_cls = "Qwen3_5MoeConfig" if arch == "qwen3_5_moe" else "Qwen3_5Config"
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2)
    config = getattr(transformers, config_cls)(text_config=tiny_hybrid_config(arch, tie=tie).to_dict(),
                                               vision_config=vision, tie_word_embeddings=tie)
    return getattr(transformers, cls)(config).to(torch.float32)


def save_tiny_hf(arch: str, path: str, *, seed: int = 0, tie: bool = False, max_shard_size: str | None = None,
                 conditional: bool = False, **overrides) -> None:
    """Random tiny model of ``arch`` saved with ``save_pretrained`` (safetensors) to ``path``;
    ``conditional``: Llama-4 as the multimodal ``Llama4ForConditionalGeneration`` checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, Llama4ForConditionalGeneration

    torch.manual_seed(seed)
    if conditional and arch in ("qwen3_5", "qwen3_5_moe"):
        model = tiny_qwen_vl_model(arch, tie=tie)
    elif conditional:
        if arch != "llama4":
            raise ValueError(f"arch={arch!r}: only 'llama4', 'qwen3_5' and 'qwen3_5_moe' have a conditional "
                             "(multimodal) checkpoint")
        model = Llama4ForConditionalGeneration._from_config(tiny_conditional_config(tie=tie), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(tiny_hf_config(arch, tie=tie, **overrides), dtype=torch.float32)
    if arch == "deepseek_v3":  # a non-zero score-correction bias, so that it visibly changes the routes
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(torch.randn_like(buf) * 0.3)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
