"""DeepSeek-V3's additions to a `ModelConfig`: Multi-head Latent Attention (DeepSeek-V2 paper, Sec. 2.1),
YaRN RoPE scaling and sigmoid, bias-corrected, group-limited top-k routing (DeepSeek-V3 paper, Sec. 2.1.2).

Pure checks and sizes (no torch): which combinations Megatron-Core can build so that its model equals
transformers' `DeepseekV3ForCausalLM`, the attention's parameter count and the KV bytes a generator
caches per token. Every check raises ValueError naming the key.
"""

from __future__ import annotations

from typing import Any

_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "yarn_factor")
_ROUTER_KEYS = ("moe_router_num_groups", "moe_router_group_topk", "moe_router_expert_bias")


def validate_deepseek(m, where: str) -> None:
    """MLA / YaRN / group-limited routing settings of ModelConfig `m` (ValueError naming the key)."""
    is_ds = m.arch == "deepseek_v3"
    if not is_ds:
        used = [k for k in (*_MLA_KEYS, *_ROUTER_KEYS) if getattr(m, k)]
        if used:
            raise ValueError(f"{where}: {used[0]}={getattr(m, used[0])!r} is a DeepSeek-V3 setting but arch="
                             f"{m.arch!r} (set arch: deepseek_v3)")
        return
    for key in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
        if not isinstance(getattr(m, key), int) or getattr(m, key) <= 0:
            raise ValueError(f"{where}: {key}={getattr(m, key)!r} must be a positive integer for arch='deepseek_v3' "
                             "(Multi-head Latent Attention)")
    if m.head_dim is None:
        raise ValueError(f"{where}: head_dim is unset; for arch='deepseek_v3' it is the q/k head width without "
                         "RoPE (HF qk_nope_head_dim)")
    if m.q_lora_rank is not None and m.q_lora_rank <= 0:
        raise ValueError(f"{where}: q_lora_rank={m.q_lora_rank!r} must be a positive integer or null")
    if m.qk_rope_head_dim % 2:
        raise ValueError(f"{where}: qk_rope_head_dim={m.qk_rope_head_dim} must be even (RoPE rotates pairs)")
    if m.num_query_groups != m.num_attention_heads:
        raise ValueError(f"{where}: num_query_groups={m.num_query_groups} must equal num_attention_heads="
                         f"{m.num_attention_heads} with Multi-head Latent Attention (every head has its own k and v)")
    if m.rope_scaling or m.qk_layernorm:
        raise ValueError(f"{where}: rope_scaling / qk_layernorm are Llama-3 / Qwen3 settings; DeepSeek-V3 scales RoPE "
                         "with yarn_factor")
    if m.yarn_factor and m.yarn_factor < 1:
        raise ValueError(f"{where}: yarn_factor={m.yarn_factor} must be 0 (off) or >= 1")
    if not m.is_moe:
        raise ValueError(f"{where}: arch='deepseek_v3' needs routed experts (num_experts > 0)")
    if m.moe_router_score_function != "sigmoid" or m.moe_router_pre_softmax or m.moe_apply_probs_on_input:
        raise ValueError(f"{where}: DeepSeek-V3 routes with sigmoid scores on the expert output: set "
                         "moe_router_score_function=sigmoid, moe_router_pre_softmax=false, moe_apply_probs_on_input=false")
    _validate_groups(m, where)


def _validate_groups(m, where: str) -> None:
    groups, keep, k, experts = m.moe_router_num_groups, m.moe_router_group_topk, m.moe_topk, m.num_experts
    if groups < 0 or keep < 0:
        raise ValueError(f"{where}: moe_router_num_groups={groups} / moe_router_group_topk={keep} must be >= 0")
    if not groups:
        if keep:
            raise ValueError(f"{where}: moe_router_group_topk={keep} without moe_router_num_groups")
        return
    if experts % groups:
        raise ValueError(f"{where}: moe_router_num_groups={groups} does not divide num_experts={experts}")
    if not 1 <= keep <= groups:
        raise ValueError(f"{where}: moe_router_group_topk={keep} must be in [1, moe_router_num_groups={groups}]")
    if keep * (experts // groups) < k:
        raise ValueError(f"{where}: moe_router_group_topk={keep} groups of {experts // groups} experts cannot hold "
                         f"moe_topk={k} experts")
    # HF ranks a group by the sum of its 2 best corrected scores, Megatron by its best moe_topk // group_topk
    if groups > 1 and k // keep != 2:
        raise ValueError(f"{where}: moe_topk={k} // moe_router_group_topk={keep} = {k // keep}: Megatron-Core ranks "
                         "a group by the sum of its top (moe_topk // group_topk) scores and transformers by its top 2; "
                         "they agree only when that quotient is 2")


def validate_mla_layout(m, *, tp: int, where: str = "parallel") -> None:
    """Megatron splits MLA's down projections column-wise over TP (then gathers them)."""
    if not m.is_mla:
        return
    if (m.kv_lora_rank + m.qk_rope_head_dim) % tp:
        raise ValueError(f"{where}: tp={tp} does not divide model.kv_lora_rank + model.qk_rope_head_dim = "
                         f"{m.kv_lora_rank + m.qk_rope_head_dim}")
    if m.q_lora_rank and m.q_lora_rank % tp:
        raise ValueError(f"{where}: tp={tp} does not divide model.q_lora_rank={m.q_lora_rank}")


def mla_attention_params(m) -> int:
    """Parameters of one MLA block: q (low-rank with its RMSNorm, or full), the joint kv down projection
    (compressed KV + the shared RoPE key) with its RMSNorm, the kv up projection and the output."""
    h, n, nope, rope, v = m.hidden_size, m.num_attention_heads, m.kv_channels, m.qk_rope_head_dim, m.v_head_dim
    q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * (nope + rope) if m.q_lora_rank else h * n * (nope + rope)
    kv = h * (m.kv_lora_rank + rope) + m.kv_lora_rank + m.kv_lora_rank * n * (nope + v)
    return q + kv + n * v * h


def mla_kv_cache_bytes_per_token(m, *, dtype_bytes: int = 2) -> int:
    """KV-cache bytes per token of an MLA model in an engine that caches the latent (SGLang's MLA backends):
    the compressed KV and the RoPE key, once per layer, shared by every head (not split over TP)."""
    return (m.kv_lora_rank + m.qk_rope_head_dim) * m.num_layers * dtype_bytes
