"""Llama-4 (Scout) attention features for Megatron-Core 0.16.1, added through a layer spec.

Megatron-Core has the QK L2 norm (``L2Norm``), NoPE layers (``TransformerConfig.no_rope_freq``, set
by ``models.transformer_config``) and top-1 sigmoid routing with probabilities on the expert input
(``moe_apply_probs_on_input``), but it applies the QK norm on every layer and has neither chunked
local attention nor attention temperature tuning. This module supplies them without touching
Megatron's files, matching Hugging Face ``Llama4TextAttention`` (transformers 5.23.0):

- NoPE layers (``ModelConfig.no_rope_freq``: every N-th layer, the last of each period) skip RoPE
  through Megatron's own ``no_rope_freq``; here they only drop the QK norm.
- QK L2 norm ``x / sqrt(mean(x^2) + eps)`` on RoPE layers only (HF applies it after RoPE; RoPE is a
  rotation and preserves ``mean(x^2)``, so norm-then-rotate, Megatron's order, is the same map).
- Chunked local attention on RoPE layers: query ``i`` sees keys ``j <= i`` with
  ``j // C == i // C`` (``C = attention_chunk_size``). Chunks start at multiples of ``C``, so after
  RoPE (absolute positions) the sequence is folded into the batch dimension, ``[s, b] -> [C, n*b]``
  (the last chunk zero-padded at its end, which causal attention never lets a real query see), and
  the *standard* core attention runs plain causal attention on it: TE's ``TEDotProductAttention``
  (flash / fused kernels) on GPU, Megatron's local ``DotProductAttention`` on CPU. Scores are
  ``[n*b*heads, C, C]``: memory grows with ``s * C``, not ``s^2``. NoPE layers attend to the full
  causal prefix.
- Temperature tuning on NoPE layers: ``q_i *= 1 + attn_scale * log(1 + floor((i + 1) / floor_scale))``,
  applied to q in the self-attention before core attention.

HF Llama-4 rotates complex pairs (dims 2k, 2k+1) while Megatron rotates halves (k, k + d/2); the
converter permutes q/k projection rows per head (``convert.layout.rope_pairs_to_halves``), so the
model itself uses Megatron's standard rotate-half RoPE.

Sequence parallelism and TP need nothing extra: ``linear_qkv`` gathers the sequence, so q/k/v hold
the whole sequence (heads sharded) when folded. Context parallelism and packed (THD) sequences are
refused with chunking on.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any


def nope_layers(model_cfg) -> tuple[int, ...]:
    """0-based layers without RoPE: every ``no_rope_freq``-th layer (HF ``no_rope_layers`` == 0)."""
    n = int(getattr(model_cfg, "no_rope_freq", 0) or 0)
    return tuple(i for i in range(model_cfg.num_layers) if n and (i + 1) % n == 0)


def no_rope_pattern(model_cfg) -> list[int] | None:
    """Megatron ``TransformerConfig.no_rope_freq`` list (1 = NoPE) for a ``ModelConfig``; None if off.
    A list rather than the int, so that Megatron does not require ``num_layers % N == 0``."""
    nope = set(nope_layers(model_cfg))
    return [int(i in nope) for i in range(model_cfg.num_layers)] if nope else None


def _is_nope(config, layer_number: int) -> bool:
    flags = getattr(config, "no_rope_freq", None)
    return bool(flags) and bool(flags[layer_number - 1])


def temperature_scales(positions, *, floor_scale: float, attn_scale: float):
    """Per-position query scale of Llama-4 temperature tuning (arXiv 2501.19399):
    ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``."""
    import torch

    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def fold_chunks(x, chunk: int):
    """``[s, b, ...] -> [chunk, n*b, ...]`` with ``n = ceil(s / chunk)``; new batch index
    ``c * b + j`` holds chunk ``c`` of row ``j``. The last chunk is zero-padded at its end."""
    import torch

    s, b = x.shape[0], x.shape[1]
    n = -(-s // chunk)
    if n * chunk != s:
        x = torch.cat([x, x.new_zeros((n * chunk - s, *x.shape[1:]))], dim=0)
    x = x.view(n, chunk, *x.shape[1:]).transpose(0, 1)
    return x.reshape(chunk, n * b, *x.shape[3:]).contiguous()  # a view when b == 1; kernels want contiguous


def unfold_chunks(y, *, seq: int, batch: int):
    """Inverse of ``fold_chunks``: ``[chunk, n*b, ...] -> [seq, b, ...]`` (padding dropped)."""
    chunk, nb = y.shape[0], y.shape[1]
    n = nb // batch
    y = y.view(chunk, n, batch, *y.shape[2:]).transpose(0, 1)
    return y.reshape(n * chunk, batch, *y.shape[3:])[:seq]


def fold_mask(mask, *, chunk: int, batch: int):
    """A boolean attention mask ``[B, h, s, s]`` (True = masked, B in {1, batch}) -> the masks of the
    folded chunks ``[n*batch, h, chunk, chunk]`` (its diagonal blocks; padded keys masked)."""
    import torch

    s = mask.shape[-1]
    n = -(-s // chunk)
    full = torch.ones((*mask.shape[:2], n * chunk, n * chunk), dtype=torch.bool, device=mask.device)
    full[..., :s, :s] = mask.bool()
    blocks = torch.stack([full[..., c * chunk:(c + 1) * chunk, c * chunk:(c + 1) * chunk] for c in range(n)])
    blocks = blocks.expand(n, batch, *blocks.shape[2:])
    return blocks.reshape(n * batch, *blocks.shape[2:])


@functools.lru_cache(maxsize=None)
def chunked_core_attention(base: type) -> type:
    """Subclass of a core attention class (``DotProductAttention`` or ``TEDotProductAttention``)
    that runs chunked local attention by folding chunks into the batch (RoPE layers only); the
    attention itself is ``base``'s, with its causal mask type unchanged."""

    class ChunkedCoreAttention(base):
        def __init__(self, config, layer_number, *args, chunk_size: int = 0, **kwargs):
            super().__init__(config, layer_number, *args, **kwargs)
            self.chunk_size = 0 if _is_nope(config, layer_number) else int(chunk_size)
            if self.chunk_size and config.context_parallel_size > 1:
                raise ValueError("attention_chunk_size with context parallelism is not supported")

        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            sq, sk, b = query.shape[0], key.shape[0], query.shape[1]
            if not self.chunk_size or max(sq, sk) <= self.chunk_size:
                return super().forward(query, key, value, attention_mask, *args, **kwargs)
            if sq != sk:
                raise NotImplementedError("chunked attention with a KV cache (sq != sk) is not supported")
            if kwargs.get("packed_seq_params") is not None:
                raise NotImplementedError("chunked attention with packed (THD) sequences is not supported")
            c = self.chunk_size
            if attention_mask is not None:
                attention_mask = fold_mask(attention_mask, chunk=c, batch=b)
            out = super().forward(fold_chunks(query, c), fold_chunks(key, c), fold_chunks(value, c),
                                  attention_mask, *args, **kwargs)
            return unfold_chunks(out, seq=sq, batch=b)

    ChunkedCoreAttention.__name__ = ChunkedCoreAttention.__qualname__ = f"Chunked{base.__name__}"
    return ChunkedCoreAttention


def _self_attention_cls():
    from megatron.core.transformer.attention import SelfAttention

    class Llama4SelfAttention(SelfAttention):
        """SelfAttention without the QK norm on NoPE layers, and with temperature tuning of q on
        NoPE layers (RoPE itself is skipped there by Megatron's ``config.no_rope_freq``)."""

        def __init__(self, *args, temperature_tuning: bool = False, floor_scale: float = 8192.0,
                     attn_scale: float = 0.1, **kwargs):
            super().__init__(*args, **kwargs)
            self.is_nope = _is_nope(self.config, self.layer_number)
            if self.is_nope:
                self.q_layernorm = None
                self.k_layernorm = None
            self.temperature_tuning = bool(temperature_tuning) and self.is_nope
            self.floor_scale = float(floor_scale)
            self.attn_scale = float(attn_scale)

        def get_query_key_value_tensors(self, hidden_states, *args, **kwargs):
            out = super().get_query_key_value_tensors(hidden_states, *args, **kwargs)
            if not self.temperature_tuning:
                return out
            import torch

            if len(out) == 2:  # (mixed_qkv, split sizes): only with fused RoPE, which NoPE layers skip
                raise NotImplementedError("attention temperature tuning needs split q/k/v")
            query = out[0]  # [s, b, heads, head_dim], the whole sequence (linear_qkv gathers SP)
            pos = torch.arange(query.shape[0], device=query.device)
            scale = temperature_scales(pos, floor_scale=self.floor_scale, attn_scale=self.attn_scale)
            query = (query.float() * scale.view(-1, 1, 1, 1)).to(query.dtype)
            return (query, *out[1:])

    return Llama4SelfAttention


def _patch(spec: Any, *, attention_cls, attention_params: dict, chunk_size: int, l2norm) -> Any:
    """Copy of a (nested) spec with SelfAttention swapped for ``attention_cls`` and its core
    attention for the chunked subclass of the same core attention class."""
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.spec_utils import ModuleSpec

    kw = dict(attention_cls=attention_cls, attention_params=attention_params, chunk_size=chunk_size, l2norm=l2norm)
    if isinstance(spec, (list, tuple)):
        return type(spec)(_patch(s, **kw) for s in spec)
    if isinstance(spec, ModuleSpec) and spec.module is SelfAttention:
        sub = spec.submodules
        core = sub.core_attention.module if isinstance(sub.core_attention, ModuleSpec) else sub.core_attention
        changes = {"core_attention": ModuleSpec(module=chunked_core_attention(core), params={"chunk_size": chunk_size})}
        if l2norm is not None:
            changes.update(q_layernorm=l2norm, k_layernorm=l2norm)
        return ModuleSpec(module=attention_cls, params={**spec.params, **attention_params},
                          submodules=dataclasses.replace(sub, **changes))
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: _patch(getattr(spec, f.name), **kw) for f in dataclasses.fields(spec) if f.init}
        return dataclasses.replace(spec, **changes)
    return spec


def llama4_layer_spec(model_cfg, use_te: bool):
    """Decoder block spec (``TransformerBlockSubmodules``) of this pipeline stage for a Llama-4
    ``ModelConfig``: per layer a dense or MoE layer spec (``model_cfg.is_moe_layer``), with the
    Llama-4 attention classes, and the block's final norm. Layers are split evenly over pipeline
    stages (``ModelConfig``/``ParallelConfig`` validation guarantees divisibility); Megatron
    parallel state must be initialised. NoPE layers need ``TransformerConfig.no_rope_freq``
    (``no_rope_pattern``), which ``models.transformer_config`` sets."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.torch_norm import L2Norm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    attention_cls = _self_attention_cls()
    attention_params = dict(
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
    kinds = {k: _patch(base(k), attention_cls=attention_cls, attention_params=attention_params,
                       chunk_size=int(model_cfg.attention_chunk_size or 0),
                       l2norm=L2Norm if model_cfg.qk_l2_norm else None) for k in (False, True)}
    layer_specs = [kinds[model_cfg.is_moe_layer(i)] for i in range(first, first + per_stage)]
    return TransformerBlockSubmodules(layer_specs=layer_specs, layer_norm=specs.TENorm if use_te else specs.LNImpl)
