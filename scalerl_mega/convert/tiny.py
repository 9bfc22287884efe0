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
    raise ValueError(f"arch={arch!r}: expected 'llama', 'llama4', 'qwen3' or 'qwen3_moe'")


def tiny_conditional_config(*, tie: bool = False, init_std: float = 0.15):
    """Tiny multimodal ``Llama4Config`` (``Llama4ForConditionalGeneration``): the tiny Llama-4 text
    config plus a one-layer vision tower."""
    from transformers import Llama4Config, Llama4VisionConfig

    vision = Llama4VisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                image_size=28, patch_size=14, vision_output_dim=64, projector_input_dim=64,
                                projector_output_dim=64, pixel_shuffle_ratio=0.5)
    text = tiny_hf_config("llama4", tie=tie, init_std=init_std)
    return Llama4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), tie_word_embeddings=tie)


def save_tiny_hf(arch: str, path: str, *, seed: int = 0, tie: bool = False, max_shard_size: str | None = None,
                 conditional: bool = False, **overrides) -> None:
    """Random tiny model of ``arch`` saved with ``save_pretrained`` (safetensors) to ``path``;
    ``conditional``: Llama-4 as the multimodal ``Llama4ForConditionalGeneration`` checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, Llama4ForConditionalGeneration

    torch.manual_seed(seed)
    if conditional:
        if arch != "llama4":
            raise ValueError(f"arch={arch!r}: only 'llama4' has a conditional (multimodal) checkpoint")
        model = Llama4ForConditionalGeneration._from_config(tiny_conditional_config(tie=tie), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(tiny_hf_config(arch, tie=tie, **overrides), dtype=torch.float32)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
