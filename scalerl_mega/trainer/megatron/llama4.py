"""Llama-4 (Scout) attention features for Megatron-Core 0.16.1, added through a layer spec.

Megatron-Core has the QK L2 norm (``L2Norm``) and top-1 sigmoid routing with probabilities on the
expert input (``moe_apply_probs_on_input``), but it applies the QK norm on every layer, and it has
no chunked local attention and no attention temperature tuning. This module supplies them without
touching Megatron's files, matching Hugging Face ``Llama4TextAttention`` (transformers 5.23.0):

- NoPE layers (``ModelConfig.no_rope_freq``: every N-th layer, the last of each period) skip RoPE.
- QK L2 norm ``x / sqrt(mean(x^2) + eps)`` on RoPE layers only (HF applies it after RoPE; RoPE is a
  rotation and preserves ``mean(x^2)``, so norm-then-rotate, Megatron's order, is the same map).
- Chunked local attention on RoPE layers: query ``i`` sees keys ``j <= i`` with
  ``j // C == i // C`` (``C = attention_chunk_size``); NoPE layers attend to the full causal prefix.
- Temperature tuning on NoPE layers: ``q_i *= 1 + attn_scale * log(1 + floor((i + 1) / floor_scale))``.

HF Llama-4 rotates complex pairs (dims 2k, 2k+1) while Megatron rotates halves (k, k + d/2); the
converter permutes q/k projection rows per head (``convert.layout.rope_pairs_to_halves``), so the
model itself uses Megatron's standard rotate-half RoPE.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


def nope_layers(model_cfg) -> tuple[int, ...]:
    """0-based layers without RoPE: every ``no_rope_freq``-th layer (HF ``no_rope_layers`` == 0)."""
    n = int(getattr(model_cfg, "no_rope_freq", 0) or 0)
    return tuple(i for i in range(model_cfg.num_layers) if n and (i + 1) % n == 0)


def temperature_scales(positions, *, floor_scale: float, attn_scale: float):
    """Per-position query scale of Llama-4 temperature tuning (arXiv 2501.19399):
    ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``."""
    import torch

    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def chunked_causal_mask(sq: int, sk: int, *, chunk_size: int, device=None):
    """Boolean mask [1, 1, sq, sk], True = masked: key after query or in a different chunk.
    Queries are the last ``sq`` of ``sk`` positions."""
    import torch

    q = torch.arange(sk - sq, sk, device=device)[:, None]
    k = torch.arange(sk, device=device)[None, :]
    return ((k > q) | (k // chunk_size != q // chunk_size))[None, None]


def _classes():
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class Llama4SelfAttention(SelfAttention):
        """SelfAttention that skips RoPE and the QK norm on NoPE layers."""

        def __init__(self, *args, nope_layers: Sequence[int] = (), **kwargs):
            super().__init__(*args, **kwargs)
            self.is_nope = (self.layer_number - 1) in set(nope_layers)
            if self.is_nope:
                self.q_layernorm = None
                self.k_layernorm = None

        def forward(self, hidden_states, attention_mask, *args, **kwargs):
            if self.is_nope:
                if "rotary_pos_emb" in kwargs or len(args) < 3:
                    kwargs["rotary_pos_emb"] = None
                else:
                    args = (*args[:2], None, *args[3:])
            return super().forward(hidden_states, attention_mask, *args, **kwargs)

    class Llama4CoreAttention(DotProductAttention):
        """Dot-product attention with chunked masks on RoPE layers and temperature tuning on NoPE
        layers (exact softmax attention, Megatron's local implementation otherwise)."""

        def __init__(self, *args, nope_layers: Sequence[int] = (), chunk_size: int = 0,
                     temperature_tuning: bool = False, floor_scale: float = 8192.0, attn_scale: float = 0.1,
                     **kwargs):
            super().__init__(*args, **kwargs)
            self.is_nope = (self.layer_number - 1) in set(nope_layers)
            self.chunk_size = 0 if self.is_nope else int(chunk_size)
            self.temperature_tuning = bool(temperature_tuning) and self.is_nope
            self.floor_scale = float(floor_scale)
            self.attn_scale = float(attn_scale)
            if self.chunk_size and self.config.context_parallel_size > 1:
                raise ValueError("attention_chunk_size with context parallelism is not supported")

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            import torch

            sq, sk = query.shape[0], key.shape[0]  # [s, b, heads, head_dim]
            if self.temperature_tuning:
                pos = torch.arange(sk - sq, sk, device=query.device)
                scale = temperature_scales(pos, floor_scale=self.floor_scale, attn_scale=self.attn_scale)
                query = (query.float() * scale.view(sq, 1, 1, 1)).to(query.dtype)
            if self.chunk_size and self.chunk_size < sk:
                chunk = chunked_causal_mask(sq, sk, chunk_size=self.chunk_size, device=query.device)
                attention_mask = chunk if attention_mask is None else (attention_mask.bool() | chunk)
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params)

    return Llama4SelfAttention, Llama4CoreAttention


def _patch(spec: Any, *, attention_cls, core_cls, params: dict, l2norm) -> Any:
    """Copy of a (nested) spec with SelfAttention/core attention swapped for the Llama-4 classes."""
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(spec, (list, tuple)):
        return type(spec)(_patch(s, attention_cls=attention_cls, core_cls=core_cls, params=params, l2norm=l2norm) for s in spec)
    if isinstance(spec, ModuleSpec) and spec.module is SelfAttention:
        sub = spec.submodules
        changes = {"core_attention": ModuleSpec(module=core_cls, params=dict(params))}
        if l2norm is not None:
            changes.update(q_layernorm=l2norm, k_layernorm=l2norm)
        return ModuleSpec(module=attention_cls, params={**spec.params, "nope_layers": params["nope_layers"]},
                          submodules=dataclasses.replace(sub, **changes))
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: _patch(getattr(spec, f.name), attention_cls=attention_cls, core_cls=core_cls, params=params, l2norm=l2norm)
                   for f in dataclasses.fields(spec) if f.init}
        return dataclasses.replace(spec, **changes)
    return spec


def llama4_layer_spec(model_cfg, use_te: bool):
    """Decoder block spec (``TransformerBlockSubmodules``) of this pipeline stage for a Llama-4
    ``ModelConfig``: per layer a dense or MoE layer spec (``model_cfg.is_moe_layer``), with the
    Llama-4 attention classes, and the block's final norm. Layers are split evenly over pipeline
    stages (``ModelConfig``/``ParallelConfig`` validation guarantees divisibility); Megatron
    parallel state must be initialised."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.torch_norm import L2Norm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    attention_cls, core_cls = _classes()
    params = dict(
        nope_layers=nope_layers(model_cfg),
        chunk_size=int(model_cfg.attention_chunk_size or 0),
        temperature_tuning=bool(model_cfg.attn_temperature_tuning),
        floor_scale=float(model_cfg.floor_scale),
        attn_scale=float(model_cfg.attn_scale),
    )

    def base(moe: bool):
        experts = model_cfg.num_experts if moe else None
        if use_te:
            return specs.get_gpt_layer_with_transformer_engine_spec(num_experts=experts, moe_grouped_gemm=False)
        return specs.get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm")

    pp = ps.get_pipeline_model_parallel_world_size()
    per_stage = model_cfg.num_layers // pp
    first = ps.get_pipeline_model_parallel_rank() * per_stage
    kinds = {k: _patch(base(k), attention_cls=attention_cls, core_cls=core_cls, params=params,
                       l2norm=L2Norm if model_cfg.qk_l2_norm else None) for k in (False, True)}
    layer_specs = [kinds[model_cfg.is_moe_layer(i)] for i in range(first, first + per_stage)]
    return TransformerBlockSubmodules(layer_specs=layer_specs, layer_norm=specs.TENorm if use_te else specs.LNImpl)
