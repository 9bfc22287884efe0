"""DeepSeek-V3's `config.json` fields (Moonlight, DeepSeek-V3/R1, Kimi-K2) -> `ArchDims` fields, validated.

Read as transformers 5.23's `DeepseekV3Config` / `DeepseekV3ForCausalLM` read them: layers
`first_k_dense_replace` and up are MoE (`moe_layer_freq` is not read there; anything but 1 is refused),
`n_shared_experts` shared experts form one MLP of `n_shared_experts * moe_intermediate_size`, routing is
`topk_method: noaux_tc` (sigmoid scores + `e_score_correction_bias` for the choice, `n_group` / `topk_group`
group limit, weights renormalised when `norm_topk_prob`, times `routed_scaling_factor`). Pure (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from scalerl_mega.jsonvalue import JSON

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.model.config import ModelConfig


def _req(cfg: Mapping[str, JSON], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"{where}: config key {key!r} is missing")
    return cfg[key]


def _yarn(cfg: Mapping[str, JSON], where: str) -> tuple[float, ...]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) in (None, "default"):
        return ()
    r = f"{where} rope_scaling"
    if rope.get("rope_type", rope.get("type")) != "yarn":
        raise ValueError(f"{r}: type={rope.get('rope_type', rope.get('type'))!r} is not supported for deepseek_v3 "
                         "(only 'yarn' or none)")
    if rope.get("truncate") is False:
        raise ValueError(f"{r}: truncate=false is not supported (Megatron's YaRN rounds the correction range)")
    return (float(_req(rope, "factor", r)), int(_req(rope, "original_max_position_embeddings", r)),
            float(rope.get("beta_fast", 32)), float(rope.get("beta_slow", 1)), float(rope.get("mscale", 1.0)),
            float(rope.get("mscale_all_dim", 0.0)))


def deepseek_v3_fields(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> dict[str, JSON]:
    """All `ArchDims` keyword arguments of a DeepSeek-V3 config (`common` from `dims_from_hf_config`)."""
    checks = {"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",), "moe_layer_freq": (1,)}
    for key, allowed in checks.items():
        if cfg.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{where}: {key}={cfg.get(key)!r} is not supported (only {allowed[0]!r}, as "
                             "transformers' DeepseekV3ForCausalLM routes)")
    if cfg.get("rope_interleave", True) is not True:
        raise ValueError(f"{where}: rope_interleave={cfg.get('rope_interleave')!r} is not supported: Megatron-Core's MLA "
                         "reads the RoPE dims of q/k as interleaved pairs, DeepSeek's layout (rope_interleave=true)")
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    if experts <= 0:
        raise ValueError(f"{where}: config key 'n_routed_experts' is missing")
    top_k = int(_req(cfg, "num_experts_per_tok", where))
    if not cfg.get("norm_topk_prob", False) and top_k > 1:
        raise ValueError(f"{where}: norm_topk_prob=false with num_experts_per_tok={top_k}: Megatron-Core renormalises "
                         "sigmoid top-k weights always")
    first_dense = int(cfg.get("first_k_dense_replace", 0))
    if not 0 <= first_dense < layers:
        raise ValueError(f"{where}: first_k_dense_replace={first_dense} leaves no MoE layer among {layers}")
    groups, keep = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
    if experts % groups or not 1 <= keep <= groups:
        raise ValueError(f"{where}: n_group={groups} / topk_group={keep} do not split n_routed_experts={experts}")
    if groups > 1 and top_k // keep != 2:
        raise ValueError(f"{where}: num_experts_per_tok={top_k} // topk_group={keep} != 2: Megatron-Core ranks a "
                         "group by its top (k // topk_group) scores, transformers by its top 2")
    heads = common["num_heads"]
    if int(cfg.get("num_key_value_heads") or heads) != heads:
        raise ValueError(f"{where}: num_key_value_heads={cfg.get('num_key_value_heads')} != num_attention_heads={heads} "
                         "(MLA has per-head keys and values)")
    q_lora = cfg.get("q_lora_rank")
    moe_ffn = int(_req(cfg, "moe_intermediate_size", where))
    out = dict(common)
    out.update(
        head_dim=int(_req(cfg, "qk_nope_head_dim", where)),
        ffn_hidden_size=int(_req(cfg, "intermediate_size", where)),
        num_experts=experts, moe_ffn_hidden_size=moe_ffn, moe_top_k=top_k,
        moe_layers=tuple(range(first_dense, layers)), moe_norm_topk=True,
        q_lora_rank=int(q_lora) if q_lora else None, kv_lora_rank=int(_req(cfg, "kv_lora_rank", where)),
        qk_rope_head_dim=int(_req(cfg, "qk_rope_head_dim", where)), v_head_dim=int(_req(cfg, "v_head_dim", where)),
        yarn=_yarn(cfg, where), shared_expert_ffn=moe_ffn * int(cfg.get("n_shared_experts") or 0),
        moe_num_groups=groups if groups > 1 else 0, moe_group_topk=keep if groups > 1 else 0,
        moe_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)), moe_expert_bias=True,
    )
    return out


def dims_fields(m: "ModelConfig") -> dict[str, JSON]:
    """`ArchDims` fields of a DeepSeek-V3 `ModelConfig` `m` (the inverse of convert/model_config.py's `_deepseek_v3_fields`)."""
    yarn = (float(m.yarn_factor), int(m.yarn_original_max_position_embeddings), float(m.yarn_beta_fast),
            float(m.yarn_beta_slow), float(m.yarn_mscale), float(m.yarn_mscale_all_dim)) if m.yarn_factor else ()
    return dict(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim,
                v_head_dim=m.v_head_dim, yarn=yarn, shared_expert_ffn=m.shared_expert_ffn,
                moe_num_groups=m.moe_router_num_groups, moe_group_topk=m.moe_router_group_topk,
                moe_scaling_factor=float(m.moe_router_topk_scaling_factor), moe_expert_bias=m.moe_router_expert_bias)


def hf_config_kwargs(m: "ModelConfig", common: dict[str, JSON]) -> dict[str, JSON]:
    """`DeepseekV3Config` kwargs of a DeepSeek-V3 `ModelConfig` (the local engine's model, exported config.json)."""
    if m.shared_expert_ffn % m.expert_ffn:
        raise ValueError(f"model '{m.name}': shared_expert_ffn={m.shared_expert_ffn} is not a multiple of "
                         f"moe_ffn_hidden_size={m.expert_ffn} (HF n_shared_experts * moe_intermediate_size)")
    dense = [i for i in range(m.num_layers) if not m.is_moe_layer(i)]
    if dense != list(range(len(dense))):
        raise ValueError(f"model '{m.name}': dense layers {dense} are not the first k layers (HF first_k_dense_replace)")
    rope = {"rope_type": "default", "rope_theta": float(m.rope_theta)}
    if m.yarn_factor:
        rope = {"rope_type": "yarn", "rope_theta": float(m.rope_theta), "factor": float(m.yarn_factor),
                "original_max_position_embeddings": int(m.yarn_original_max_position_embeddings),
                "beta_fast": float(m.yarn_beta_fast), "beta_slow": float(m.yarn_beta_slow),
                "mscale": float(m.yarn_mscale), "mscale_all_dim": float(m.yarn_mscale_all_dim)}
    out = dict(common, rope_parameters=rope, intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.expert_ffn,
               n_routed_experts=m.num_experts, n_shared_experts=m.shared_expert_ffn // m.expert_ffn,
               num_experts_per_tok=m.moe_topk, first_k_dense_replace=len(dense), norm_topk_prob=True,
               n_group=m.moe_router_num_groups or 1, topk_group=m.moe_router_group_topk or 1,
               routed_scaling_factor=float(m.moe_router_topk_scaling_factor), q_lora_rank=m.q_lora_rank,
               kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.kv_channels, qk_rope_head_dim=m.qk_rope_head_dim,
               v_head_dim=m.v_head_dim, rope_interleave=True)
    out.pop("head_dim", None)
    return out
