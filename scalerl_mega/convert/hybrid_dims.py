"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE `config.json` fields <-> `ArchDims` and `ModelConfig` fields (pure).

Read as transformers 5.23 reads them: the layer pattern from `layer_types`, or, when absent, full attention every
`full_attention_interval`-th layer (default 4); the GDN widths from the `linear_*` fields; `partial_rotary_factor`
from `rope_parameters` (or the top level, as in Qwen3-Next's published file); MoE layers as Qwen3-MoE's
(`mlp_only_layers`, `decoder_sparse_step`; Qwen3.5-MoE has neither: every layer) with a sigmoid-gated shared
expert of `shared_expert_intermediate_size` (convert/dims.py assembles them). The attention output is always gated (Qwen3.5 writes
`attn_output_gate: true`; false is refused).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from scalerl_mega.jsonvalue import JSON
from scalerl_mega.model.hybrid import FULL, LINEAR, layer_types_of

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.model.config import ModelConfig

_GDN = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
        "linear_num_value_heads")


def _layer_types(cfg: Mapping[str, JSON], *, where: str, layers: int) -> list[str]:
    given = cfg.get("layer_types")
    types = layer_types_of(num_layers=layers, layer_types=given,
                           full_attention_interval=int(cfg.get("full_attention_interval") or 4))
    if len(types) != layers or any(t not in (LINEAR, FULL) for t in types):
        raise ValueError(f"{where}: layer_types={given} must list {layers} entries, each {LINEAR!r} or {FULL!r}")
    return types


def gdn_fields(cfg: Mapping[str, JSON], *, where: str, layers: int) -> dict[str, Any]:
    """The `ArchDims` fields a hybrid GDN config adds (ValueError naming the key)."""
    if cfg.get("attn_output_gate") is False:
        raise ValueError(f"{where}: attn_output_gate=false is not supported (the trainer's attention is gated)")
    for key in _GDN:
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            raise ValueError(f"{where}: config key {key!r} must be a positive integer (got {cfg.get(key)!r})")
    if cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"]:
        raise ValueError(f"{where}: linear_num_value_heads={cfg['linear_num_value_heads']} is not a multiple of "
                         f"linear_num_key_heads={cfg['linear_num_key_heads']}")
    rope = cfg.get("rope_parameters") or {}
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    return dict(
        linear_layers=tuple(i for i, t in enumerate(_layer_types(cfg, where=where, layers=layers)) if t == LINEAR),
        linear_conv_kernel=cfg["linear_conv_kernel_dim"], linear_key_head_dim=cfg["linear_key_head_dim"],
        linear_value_head_dim=cfg["linear_value_head_dim"], linear_num_key_heads=cfg["linear_num_key_heads"],
        linear_num_value_heads=cfg["linear_num_value_heads"], partial_rotary_factor=partial, attn_output_gate=True,
        fused_gdn_proj=cfg.get("model_type") == "qwen3_next",
    )


def moe_config(cfg: Mapping[str, JSON]) -> dict[str, JSON]:
    """`cfg` as Qwen3-MoE's reader takes it: Qwen3.5-MoE has no dense MLP width (`intermediate_size`), so the
    expert width stands in (no layer uses it)."""
    out = dict(cfg)
    out.setdefault("intermediate_size", cfg.get("moe_intermediate_size"))
    out.setdefault("norm_topk_prob", True)  # Qwen3.5-MoE's router always renormalises (its file has no key)
    return out


def model_fields(d: Any) -> dict[str, Any]:
    """`ModelConfig` fields (beyond the common ones and the Qwen3-MoE routing) of hybrid `ArchDims` `d`."""
    types = [LINEAR if d.is_linear_layer(i) else FULL for i in range(d.num_layers)]
    return dict(layer_types=types, linear_conv_kernel_dim=d.linear_conv_kernel, linear_key_head_dim=d.linear_key_head_dim,
                linear_value_head_dim=d.linear_value_head_dim, linear_num_key_heads=d.linear_num_key_heads,
                linear_num_value_heads=d.linear_num_value_heads, partial_rotary_factor=d.partial_rotary_factor,
                attention_output_gate=True, shared_expert_ffn=d.shared_expert_ffn,
                moe_shared_expert_gate=d.shared_expert_gate)


def dims_fields(m: "ModelConfig") -> dict[str, JSON]:
    """`ArchDims` fields of a hybrid `ModelConfig` `m` (the inverse of `model_fields`)."""
    from scalerl_mega.model.hybrid import linear_layers

    return dict(linear_layers=linear_layers(m), linear_conv_kernel=m.linear_conv_kernel_dim,
                linear_key_head_dim=m.linear_key_head_dim, linear_value_head_dim=m.linear_value_head_dim,
                linear_num_key_heads=m.linear_num_key_heads, linear_num_value_heads=m.linear_num_value_heads,
                partial_rotary_factor=float(m.partial_rotary_factor), attn_output_gate=bool(m.attention_output_gate),
                shared_expert_ffn=m.shared_expert_ffn, shared_expert_gate=bool(m.moe_shared_expert_gate),
                fused_gdn_proj=m.arch == "qwen3_next")


def hf_config_kwargs(m: "ModelConfig", common: dict[str, JSON]) -> dict[str, JSON]:
    """`Qwen3NextConfig` / `Qwen3_5TextConfig` / `Qwen3_5MoeTextConfig` kwargs of a hybrid `ModelConfig`."""
    from scalerl_mega.model.hybrid import linear_layers

    linear = linear_layers(m)
    rope = dict(common["rope_parameters"], partial_rotary_factor=float(m.partial_rotary_factor))
    out = dict(common, rope_parameters=rope, layer_types=[LINEAR if i in linear else FULL for i in range(m.num_layers)],
               linear_conv_kernel_dim=m.linear_conv_kernel_dim, linear_key_head_dim=m.linear_key_head_dim,
               linear_value_head_dim=m.linear_value_head_dim, linear_num_key_heads=m.linear_num_key_heads,
               linear_num_value_heads=m.linear_num_value_heads)
    if m.arch == "qwen3_5":
        return dict(out, intermediate_size=m.ffn_hidden_size)
    if m.moe_router_score_function != "softmax" or m.moe_apply_probs_on_input:
        raise ValueError(f"model '{m.name}': HF {m.arch} routes with softmax scores on the expert output; got "
                         f"moe_router_score_function={m.moe_router_score_function!r}, "
                         f"moe_apply_probs_on_input={m.moe_apply_probs_on_input}")
    out.update(moe_intermediate_size=m.expert_ffn, num_experts=m.num_experts, num_experts_per_tok=m.moe_topk,
               shared_expert_intermediate_size=m.shared_expert_ffn, router_aux_loss_coef=float(m.moe_aux_loss_coeff))
    if m.arch == "qwen3_next":
        return dict(out, intermediate_size=m.ffn_hidden_size, norm_topk_prob=not m.moe_router_pre_softmax,
                    decoder_sparse_step=m.moe_layer_freq, mlp_only_layers=sorted(m.moe_dense_layers))
    dense = [i for i in range(m.num_layers) if not m.is_moe_layer(i)]
    if dense or m.moe_router_pre_softmax:
        raise ValueError(f"model '{m.name}': HF Qwen3.5-MoE has every layer MoE with renormalised top-k weights; got "
                         f"dense layers {dense}, moe_router_pre_softmax={m.moe_router_pre_softmax}")
    return out
