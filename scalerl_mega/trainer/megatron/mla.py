"""Megatron-Core's Multi-head Latent Attention (DeepSeek-V2/V3) in the local (non-TransformerEngine) spec.

`transformer/multi_latent_attention.py` ships MLA, but without TransformerEngine two things stop the local
spec from building it (megatron-core 0.16.1):
- its core attention is built with `k_channels` / `v_channels` (q/k heads are `qk_head_dim +
  qk_pos_emb_head_dim` wide, v heads `v_head_dim`), which the local `DotProductAttention` does not take.
  `mla_core_attention()` takes and drops them: that class's matmuls already follow the q/k and v tensors'
  own widths, and its output width is `kv_channels * heads`, so the config's `kv_channels` is `v_head_dim`.
- `MLASelfAttention.__init__` tests `isinstance(linear_proj, TELinear)` under `HAVE_TE`, which the module
  sets True when `megatron.core.extensions.transformer_engine` imports; without TE that module imports
  fine and `TELinear` is a mock, so the test raises TypeError. `build_fixes()` sets the module's flag to
  whether TransformerEngine itself imports.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from scalerl_mega.jsonvalue import JSON

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.model.config import ModelConfig



@functools.lru_cache(maxsize=None)
def mla_core_attention() -> type:
    """`MLADotProductAttention`: the local core attention, accepting MLA's q/k and v head widths (module
    docstring). Built on first use (megatron is imported only here)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            if v_channels is not None and v_channels != self.hidden_size_per_attention_head:
                raise ValueError(f"MLA core attention: v_channels={v_channels} but the config's kv_channels="
                                 f"{self.hidden_size_per_attention_head} (transformer_config sets it to v_head_dim)")

    return MLADotProductAttention


@functools.lru_cache(maxsize=None)
def mla_without_q_lora() -> type:
    """`MLASelfAttention` for MLA without a query LoRA (Moonlight, DeepSeek-V2-Lite: `q_lora_rank` null): the
    query is projected straight from the input-normed hidden states, with no norm of its own (HF's `q_proj`);
    the compressed kv keeps its norm. megatron-core 0.16.1 builds exactly that from the local spec. 0.19 resolves
    the norms in `QKNormConfigResolver`, which, under `qk_layernorm` and without a q LoRA, demands a fused
    norm+linear `linear_q_proj` (a second RMSNorm on the hidden states: not this model) and rejects a plain one;
    this class resolves the no-q-LoRA case itself: plain `linear_q_proj`, identity q norm, the spec's kv norm
    and a plain `linear_kv_up_proj`. With a q LoRA, or on releases without the resolver, it is the base class."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    class MLASelfAttentionNoQLora(MLASelfAttention):
        def _resolve_qk_norm_config(self, submodules):
            if self.config.q_lora_rank is not None or submodules.kv_layernorm in (None, IdentityOp):
                return super()._resolve_qk_norm_config(submodules)
            return dict(linear_q_proj=submodules.linear_q_proj, linear_q_up_proj=IdentityOp,
                        linear_kv_up_proj=submodules.linear_kv_up_proj, q_layernorm=IdentityOp,
                        kv_layernorm=submodules.kv_layernorm)

    return MLASelfAttentionNoQLora


def build_fixes(use_te: bool) -> None:
    """Make `MLASelfAttention` buildable without TransformerEngine (module docstring)."""
    import megatron.core.transformer.multi_latent_attention as mla

    if not use_te:
        mla.HAVE_TE = False


def mla_config_kwargs(model: "ModelConfig") -> dict[str, JSON]:
    """`MLATransformerConfig` fields of a DeepSeek-V3 ModelConfig. YaRN (`rope_type="yarn"`) or plain RoPE;
    Megatron's YaRN applies HF's `attention_factor` (mscale / mscale_all_dim) to cos/sin and
    mscale_all_dim's square to the softmax scale, as transformers' DeepseekV3Attention does."""
    out: dict[str, JSON] = dict(
        multi_latent_attention=True, q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank,
        qk_head_dim=model.kv_channels, qk_pos_emb_head_dim=model.qk_rope_head_dim, v_head_dim=model.v_head_dim,
        rotary_base=float(model.rope_theta), kv_channels=model.v_head_dim,
    )
    if model.yarn_factor:
        out.update(rope_type="yarn", rotary_scaling_factor=float(model.yarn_factor),
                   original_max_position_embeddings=int(model.yarn_original_max_position_embeddings),
                   beta_fast=float(model.yarn_beta_fast), beta_slow=float(model.yarn_beta_slow),
                   mscale=float(model.yarn_mscale), mscale_all_dim=float(model.yarn_mscale_all_dim))
    else:
        out.update(rope_type="rope", rotary_scaling_factor=1.0, mscale_all_dim=0.0)
    return out


def router_kwargs(model: "ModelConfig") -> dict[str, JSON]:
    """Megatron router fields of DeepSeek-V3's routing: sigmoid scores, top-k on the bias-corrected scores within
    the best `group_topk` of `num_groups` groups, weights from the uncorrected scores renormalised over the
    top-k and times `topk_scaling_factor`. The bias is a buffer (`router.expert_bias`); its aux-free
    update (DeepSeek-V3 Sec. 2.1.2) is off in RL (`moe_router_bias_update_rate=0`: frozen at the loaded values)."""
    out: dict[str, JSON] = {}
    if model.moe_router_num_groups:
        out.update(moe_router_num_groups=model.moe_router_num_groups, moe_router_group_topk=model.moe_router_group_topk)
    if model.moe_router_topk_scaling_factor != 1.0:
        out["moe_router_topk_scaling_factor"] = float(model.moe_router_topk_scaling_factor)
    if model.moe_router_expert_bias:
        out.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)
    return out


def freeze_expert_bias(gpt) -> None:
    """Stop the routers counting tokens per expert for the aux-free bias update: the update is off
    (`moe_router_bias_update_rate=0`, `router_kwargs`), so the counts would only feed a zero step; and the count
    itself fails on any padding mask in megatron-core 0.16.1 (`TopKRouter._apply_expert_bias` ands the
    [tokens, experts] routing map with the [tokens] mask: a broadcast error). The bias stays the loaded buffer."""
    from megatron.core.transformer.moe.router import TopKRouter

    for module in gpt.modules():
        if isinstance(module, TopKRouter) and getattr(module, "enable_expert_bias", False):
            module._apply_expert_bias = lambda *args, **kwargs: None
