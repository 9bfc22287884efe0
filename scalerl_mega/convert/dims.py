"""Architecture dimensions read from a Hugging Face ``config.json`` dict, validated early.

``ArchDims`` is the only input the name/layout tables need: it is plain data (no torch, no
transformers), built from the HF config dict so that the converter never has to import
``transformers``. Padded vocabulary follows Megatron's rule: a multiple of
``vocab_multiple * tp`` (``make_vocab_size_divisible_by`` times tensor parallelism).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from scalerl_mega.jsonvalue import JSON
from scalerl_mega.model.archs import ARCH_BY_MODEL_TYPE, arch_of_model_type  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchDims:
    """Shapes and per-layer features of one decoder-only architecture.

    ``no_rope_layers`` uses Megatron's convention (1 = this layer skips RoPE); ``moe_layers`` lists
    the 0-based layers whose MLP is a mixture of experts.
    """

    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int  # dense MLP layers
    vocab_size: int
    tie_word_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling_factor: float | None  # None = plain RoPE; else Llama-3 scaling with the three below
    rope_low_freq_factor: float | None = None
    rope_high_freq_factor: float | None = None
    rope_original_max_position_embeddings: int | None = None
    max_position_embeddings: int
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0  # routed experts and the shared expert
    moe_top_k: int = 0
    moe_layers: tuple[int, ...] = ()
    no_rope_layers: tuple[int, ...] = ()  # Megatron convention: 1 = NoPE
    qk_l2_norm: bool = False
    attention_chunk_size: int | None = None
    attn_temperature_tuning: bool = False
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    rope_interleaved_in_hf: bool = False  # HF Llama-4 rotates complex pairs (2i, 2i+1)
    qk_layernorm: bool = False  # Qwen3: per-head RMSNorm on q and k (HF q_norm / k_norm)
    moe_norm_topk: bool = False  # softmax over all experts, top-k, weights renormalised (HF norm_topk_prob)
    # DeepSeek-V3 (convert/deepseek_dims.py): MLA widths (head_dim = qk_nope_head_dim), YaRN, routing
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    yarn: tuple[float, ...] = ()  # (factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim)
    shared_expert_ffn: int = 0
    moe_num_groups: int = 0
    moe_group_topk: int = 0
    moe_scaling_factor: float = 1.0
    moe_expert_bias: bool = False
    # Qwen3-Next / Qwen3.5 (convert/hybrid_dims.py): Gated DeltaNet layers, gated attention, gated shared expert
    linear_layers: tuple[int, ...] = ()  # 0-based GDN layers (the rest: full attention)
    linear_conv_kernel: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    partial_rotary_factor: float = 1.0
    attn_output_gate: bool = False
    shared_expert_gate: bool = False
    fused_gdn_proj: bool = False  # Qwen3-Next's in_proj_qkvz / in_proj_ba, grouped per key head

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, *, vocab_multiple: int, tp: int) -> int:
        """Megatron's padded vocabulary: smallest multiple of ``vocab_multiple * tp`` >= vocab."""
        step = vocab_multiple * tp
        return int(math.ceil(self.vocab_size / step) * step)

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers

    def is_linear_layer(self, layer: int) -> bool:
        return layer in self.linear_layers


def _require(cfg: Mapping[str, JSON], key: str, where: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ValueError(f"{where}: config key {key!r} is missing")
    return cfg[key]


def _rope(cfg: Mapping[str, JSON], where: str) -> tuple[float, dict[str, JSON]]:
    """(rope_theta, ArchDims RoPE-scaling fields) from HF ``rope_parameters`` / ``rope_scaling``
    (DeepSeek-V3's YaRN is read by convert/deepseek_dims.py)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in (None, "default") or cfg.get("model_type") == "deepseek_v3":
        return theta, {"rope_scaling_factor": None}
    if rope_type != "llama3":
        raise ValueError(f"{where}: rope_type={rope_type!r} is not supported (only 'default' and 'llama3')")
    r = f"{where} rope_parameters"
    out = {
        "rope_scaling_factor": float(_require(rope, "factor", r)),
        "rope_low_freq_factor": float(_require(rope, "low_freq_factor", r)),
        "rope_high_freq_factor": float(_require(rope, "high_freq_factor", r)),
        "rope_original_max_position_embeddings": int(_require(rope, "original_max_position_embeddings", r)),
    }
    if out["rope_high_freq_factor"] < out["rope_low_freq_factor"]:
        raise ValueError(f"{r}: high_freq_factor={out['rope_high_freq_factor']} < low_freq_factor={out['rope_low_freq_factor']}")
    return theta, out


def dims_from_hf_config(cfg: Mapping[str, JSON], *, where: str = "config.json", expect_arch: str | None = None) -> ArchDims:
    """Validate an HF config dict and return its ``ArchDims`` (raises ValueError naming the key)."""
    arch = arch_of_model_type(cfg.get("model_type"), where=where)
    if expect_arch is not None and arch.name != expect_arch:
        raise ValueError(f"{where}: model_type={cfg.get('model_type')!r} is architecture {arch.name!r}, but "
                         f"{expect_arch!r} was requested")
    if cfg.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias=True is not supported")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{where}: mlp_bias=True is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act={cfg.get('hidden_act')!r} is not supported (only 'silu')")
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{where}: use_sliding_window=True is not supported (full causal attention only)")
    hidden = int(_require(cfg, "hidden_size", where))
    heads = int(_require(cfg, "num_attention_heads", where))
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(_require(cfg, "num_hidden_layers", where))
    if heads % kv:
        raise ValueError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    theta, rope_scaling = _rope(cfg, where)
    common = dict(
        arch=arch.name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=int(_require(cfg, "vocab_size", where)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        **rope_scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        qk_layernorm=arch.qk_layernorm,
    )
    return _ARCH_FIELDS[arch.name](cfg, common, where=where, layers=layers)


def _dense_dims(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> ArchDims:
    """Llama-3 and Qwen3 dense: one MLP width (`intermediate_size`)."""
    return ArchDims(ffn_hidden_size=int(_require(cfg, "intermediate_size", where)), **common)


def _qwen3_moe_dims(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> ArchDims:
    """Qwen3-MoE: layer i is MoE when i is not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0
    (as transformers' Qwen3MoeDecoderLayer decides); softmax top-k routing, renormalised when `norm_topk_prob`.
    The expert count is `num_experts` in the published files, `num_local_experts` in transformers 5's."""
    counts = {k: int(cfg[k]) for k in ("num_experts", "num_local_experts") if cfg.get(k) is not None}
    if len(set(counts.values())) > 1:
        raise ValueError(f"{where}: num_experts={counts['num_experts']} and num_local_experts="
                         f"{counts['num_local_experts']} disagree")
    if not counts:
        raise ValueError(f"{where}: config key 'num_experts' is missing")
    experts = next(iter(counts.values()))
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = [int(i) for i in cfg.get("mlp_only_layers") or []]
    bad = [i for i in dense if not 0 <= i < layers]
    if bad:
        raise ValueError(f"{where}: mlp_only_layers={dense} names layer {bad[0]}, outside 0..{layers - 1}")
    moe_layers = tuple(i for i in range(layers) if experts > 0 and i not in dense and (i + 1) % step == 0)
    if not moe_layers:
        raise ValueError(f"{where}: model_type='qwen3_moe' with no MoE layer (num_experts={experts}, "
                         f"decoder_sparse_step={step}, mlp_only_layers={dense}); a dense Qwen3 is model_type 'qwen3'")
    top_k = int(_require(cfg, "num_experts_per_tok", where))
    if not 1 <= top_k <= experts:
        raise ValueError(f"{where}: num_experts_per_tok={top_k} must be in [1, num_experts={experts}]")
    return ArchDims(
        ffn_hidden_size=int(_require(cfg, "intermediate_size", where)),
        num_experts=experts,
        moe_ffn_hidden_size=int(_require(cfg, "moe_intermediate_size", where)),
        moe_top_k=top_k,
        moe_layers=moe_layers,
        moe_norm_topk=bool(cfg.get("norm_topk_prob", False)),
        **common,
    )


def _llama4_dims(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> ArchDims:
    """The llama4_text part of `dims_from_hf_config`: NoPE layers, MoE layers and the Llama-4 attention
    options on top of the `common` dimensions (raises ValueError naming the key)."""
    # absent/empty no_rope_layers and absent moe_layers: derived as transformers' Llama4TextConfig does
    interval = int(cfg.get("no_rope_layer_interval", 4))
    hf_rope_layers = list(cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)])
    if len(hf_rope_layers) < layers:
        raise ValueError(f"{where}: no_rope_layers has {len(hf_rope_layers)} entries for {layers} layers")
    step = int(cfg.get("interleave_moe_layer_step", 1))
    moe_layers = tuple(int(i) for i in (cfg["moe_layers"] if cfg.get("moe_layers") is not None else range(step - 1, layers, step)))
    top_k = int(_require(cfg, "num_experts_per_tok", where))
    if moe_layers and top_k != 1:
        raise ValueError(f"{where}: num_experts_per_tok={top_k}; Llama-4 applies router probabilities to the expert input, which needs top-1")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        for i in range(layers):
            want = "chunked_attention" if hf_rope_layers[i] else "full_attention"
            if layer_types[i] != want:
                raise ValueError(f"{where}: layer_types[{i}]={layer_types[i]!r} but no_rope_layers[{i}]={hf_rope_layers[i]} implies {want!r}")
    chunk = cfg.get("attention_chunk_size")
    return ArchDims(
        ffn_hidden_size=int(_require(cfg, "intermediate_size_mlp", where)),
        num_experts=int(_require(cfg, "num_local_experts", where)),
        moe_ffn_hidden_size=int(_require(cfg, "intermediate_size", where)),
        moe_top_k=top_k,
        moe_layers=moe_layers,
        no_rope_layers=tuple(0 if hf_rope_layers[i] else 1 for i in range(layers)),
        qk_l2_norm=bool(cfg.get("use_qk_norm", True)),
        attention_chunk_size=int(chunk) if chunk else None,
        attn_temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)),
        floor_scale=float(cfg.get("floor_scale", 8192)),
        attn_scale=float(cfg.get("attn_scale", 0.1)),
        rope_interleaved_in_hf=True,
        **common,
    )


def _deepseek_v3_dims(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> ArchDims:
    from scalerl_mega.convert.deepseek_dims import deepseek_v3_fields

    return ArchDims(**deepseek_v3_fields(cfg, common, where=where, layers=layers))


def _hybrid_dims(cfg: Mapping[str, JSON], common: dict[str, JSON], *, where: str, layers: int) -> ArchDims:
    """Qwen3-Next / Qwen3.5 / Qwen3.5-MoE (convert/hybrid_dims.py): the GDN fields on a dense MLP or on Qwen3-MoE's
    MoE layers with a sigmoid-gated shared expert."""
    from scalerl_mega.convert.hybrid_dims import gdn_fields, moe_config

    gdn = gdn_fields(cfg, where=where, layers=layers)
    if cfg.get("model_type") == "qwen3_5_text":
        return ArchDims(ffn_hidden_size=int(_require(cfg, "intermediate_size", where)), **gdn, **common)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    return dataclasses.replace(_qwen3_moe_dims(moe_config(cfg), common, where=where, layers=layers), **gdn,
                               shared_expert_ffn=shared, shared_expert_gate=shared > 0)


_ARCH_FIELDS = {"llama": _dense_dims, "llama4": _llama4_dims, "qwen3": _dense_dims, "qwen3_moe": _qwen3_moe_dims,
                "deepseek_v3": _deepseek_v3_dims, "qwen3_next": _hybrid_dims, "qwen3_5": _hybrid_dims,
                "qwen3_5_moe": _hybrid_dims}
"""The config.json fields each architecture adds to the common ones (model/archs.py lists the architectures)."""
