"""The trainer ``ModelConfig`` of a built Megatron ``GPTModel``, read back from the model itself.

Training checkpoints must carry their model config (so ``tools/convert_megatron_to_hf.py`` can
rebuild the model), but ``checkpoint.save_checkpoint`` only receives the model chunks. This module
reads every ``ModelConfig`` field that changes the weights or the forward pass from what the built
model holds: the Megatron ``TransformerConfig`` (shapes, norm eps, MoE routing), ``GPTModel``
attributes (vocab, context, tied embeddings, RoPE base/scaling) and, per layer, the Llama-4
attention modules of ``trainer.megatron.llama4`` (NoPE layers, chunk size, temperature tuning,
QK L2 norm). With pipeline parallelism each stage only holds its own layers, so the per-layer facts
are all-gathered (collective: every rank must call ``describe_model``).

The Llama-3 RoPE scaling factor is not stored by Megatron (only the scaled inverse frequencies
are); it is solved from the lowest frequency and verified by recomputing all frequencies exactly.
Anything that cannot be recovered exactly raises ValueError.
"""

from __future__ import annotations

import math
from typing import Any

_LOW_FREQ_WAVELEN = 8192.0  # Megatron's _apply_scaling defaults: original context 8192, low/high factors 1/4
_HIGH_FREQ_WAVELEN = 8192.0 / 4.0


def _unwrap(chunk):
    return getattr(chunk, "module", chunk)


def _layer_facts(gpt) -> dict[int, dict[str, Any]]:
    """{global 0-based layer: facts} for the layers of this stage."""
    from megatron.core.transformer.torch_norm import L2Norm

    facts: dict[int, dict[str, Any]] = {}
    for layer in gpt.decoder.layers:
        attn = layer.self_attention
        core = attn.core_attention
        llama4 = type(attn).__name__ == "Llama4SelfAttention"
        facts[int(layer.layer_number) - 1] = {
            "llama4": llama4,
            "nope": bool(getattr(attn, "is_nope", False)),
            "chunk": int(getattr(core, "chunk_size", 0) or 0),
            "temperature": bool(getattr(core, "temperature_tuning", False)),
            "floor_scale": float(getattr(core, "floor_scale", 8192.0)),
            "attn_scale": float(getattr(core, "attn_scale", 0.1)),
            "l2": isinstance(getattr(attn, "q_layernorm", None), L2Norm),
        }
    return facts


def _rope_scaling_factor(gpt) -> float:
    """Solve Megatron's Llama-3 RoPE scaling factor from the scaled inverse frequencies (see module doc)."""
    import torch

    rot = gpt.rotary_pos_emb
    scaled = rot.inv_freq.detach().cpu().float()
    dim = 2 * scaled.numel()
    base = 1.0 / (gpt.rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    wavelen = 2 * math.pi / base
    k = int(scaled.numel()) - 1  # the lowest frequency is the most scaled one
    if wavelen[k] < _HIGH_FREQ_WAVELEN:
        return 8.0  # no frequency is scaled: the factor has no effect; keep ModelConfig's default
    if wavelen[k] > _LOW_FREQ_WAVELEN:
        factor = float(base[k] / scaled[k])
    else:
        s = float((_LOW_FREQ_WAVELEN / wavelen[k] - 1.0) / 3.0)
        factor = float((1 - s) * base[k] / (scaled[k] - s * base[k]))
    factor = round(factor, 4)
    if not torch.equal(rot._apply_scaling(base, factor=factor), scaled):
        raise ValueError(f"cannot recover the RoPE scaling factor from the model (closest {factor}); "
                         "pass model_config explicitly")
    return factor


def _local_facts(chunks: list) -> dict[str, Any]:
    gpt = _unwrap(chunks[0])
    out: dict[str, Any] = {"layers": _layer_facts(gpt)}
    out["fp32_lm_head"] = bool(getattr(getattr(gpt, "output_layer", None), "_scalerl_fp32", False))
    out["has_output_layer"] = getattr(gpt, "output_layer", None) is not None
    if gpt.rotary_scaling:
        out["rope_scaling_factor"] = _rope_scaling_factor(gpt)
    return out


def _gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def describe_model(chunks: list):
    """``ModelConfig`` (name ``"from-checkpoint"``) of the built model ``chunks`` (collective).

    Every rank must call it; a rank whose local inspection fails still takes part in the gather,
    and then every rank raises the same ValueError.
    """
    from scalerl_mega.convert.model_config import _every_nth
    from scalerl_mega.trainer.megatron.config import ModelConfig

    try:
        local: Any = _local_facts(chunks)
    except Exception as exc:  # keep the collective in step; raised below on every rank
        local = {"error": f"{type(exc).__name__}: {exc}"}
    gathered = _gather(local)
    errors = [g["error"] for g in gathered if "error" in g]
    if errors:
        raise ValueError(f"cannot describe the model: {errors[0]}")
    gpt = _unwrap(chunks[0])
    c = gpt.config
    layers: dict[int, dict[str, Any]] = {}
    for g in gathered:
        layers.update(g["layers"])
    n = int(c.num_layers)
    if sorted(layers) != list(range(n)):
        raise ValueError(f"cannot describe the model: layers {sorted(layers)} gathered, expected 0..{n - 1}")
    facts = [layers[i] for i in range(n)]
    factors = {g["rope_scaling_factor"] for g in gathered if "rope_scaling_factor" in g}
    rope_factor = factors.pop() if factors else 8.0
    rope = [f for f in facts if not f["nope"]]
    nope = [f for f in facts if f["nope"]]
    llama4 = [f for f in facts if f["llama4"]]
    experts = int(c.num_moe_experts or 0)
    heads, hidden = int(c.num_attention_heads), int(c.hidden_size)
    kv = int(c.kv_channels)
    kw: dict[str, Any] = dict(
        name="from-checkpoint",
        arch="llama4" if (llama4 or experts) else "llama",
        vocab_size=int(gpt.vocab_size), hidden_size=hidden, ffn_hidden_size=int(c.ffn_hidden_size), num_layers=n,
        num_attention_heads=heads, num_query_groups=int(c.num_query_groups or heads),
        head_dim=None if kv == hidden // heads else kv,
        max_position_embeddings=int(gpt.max_sequence_length), rope_theta=float(gpt.rotary_base),
        rope_scaling=bool(gpt.rotary_scaling), rope_scaling_factor=float(rope_factor),
        norm_eps=float(c.layernorm_epsilon), tie_embeddings=bool(gpt.share_embeddings_and_output_weights),
        qk_layernorm=bool(c.qk_layernorm), init_method_std=float(c.init_method_std),
        fp32_lm_head=any(g["fp32_lm_head"] for g in gathered if g["has_output_layer"]),
    )
    if experts:
        freq = c.moe_layer_freq
        flags = [1] * n if isinstance(freq, int) and freq == 1 else (
            list(freq) if isinstance(freq, (list, tuple)) else [int(i % int(freq) == 0) for i in range(n)])
        balancing = str(c.moe_router_load_balancing_type)
        kw.update(
            num_experts=experts, moe_topk=int(c.moe_router_topk), moe_ffn_hidden_size=int(c.moe_ffn_hidden_size),
            shared_expert_ffn=int(c.moe_shared_expert_intermediate_size or 0),
            moe_layer_freq=_every_nth(flags, key="moe_layer_freq", where="model") or 1,
            moe_router_pre_softmax=bool(c.moe_router_pre_softmax),
            moe_router_score_function=str(c.moe_router_score_function),
            moe_router_load_balancing_type=balancing,
            moe_apply_probs_on_input=bool(c.moe_apply_probs_on_input),
        )
        if balancing != "none":
            coeff = c.moe_aux_loss_coeff
            kw["moe_aux_loss_coeff"] = float(coeff[0] if isinstance(coeff, (list, tuple)) else coeff)
    if llama4:
        kw.update(
            no_rope_freq=_every_nth([int(f["nope"]) for f in facts], key="no_rope_layers", where="model"),
            attention_chunk_size=max((f["chunk"] for f in rope), default=0),
            attn_temperature_tuning=any(f["temperature"] for f in nope),
            floor_scale=llama4[0]["floor_scale"], attn_scale=llama4[0]["attn_scale"],
            qk_l2_norm=any(f["l2"] for f in rope),
        )
    return ModelConfig(**kw).validate()
