"""Name/layout tables of the hybrid Gated DeltaNet families (Qwen3-Next, Qwen3.5, Qwen3.5-MoE).

Scope "linear" rules apply to the GDN layers (HF `linear_attn.*` <-> Megatron `self_attention.*` of the project's
local GDN spec, trainer/megatron/gdn.py), scope "full" to the gated full-attention layers; the norms around the
mixer, the MLP / MoE block, embedding and head are shared with the other tables. Layouts: convert/gdn_layout.py.
The zero-centred norms `(1 + w)` keep their stored `w` on both sides (Megatron's norm is zero-centred too).
"""

from __future__ import annotations

from scalerl_mega.convert import gdn_layout
from scalerl_mega.convert.dims import ArchDims
from scalerl_mega.convert.tables import _EMBEDDING, _FINAL, _HL, _L, Rule, _mlp, _same

_A, _M = _HL + "linear_attn.", _L + "self_attention."


def in_proj_sections(d: ArchDims) -> list[int]:
    return gdn_layout.gdn_sections(key_dim=d.linear_num_key_heads * d.linear_key_head_dim,
                                   value_dim=d.linear_num_value_heads * d.linear_value_head_dim,
                                   value_heads=d.linear_num_value_heads)


def conv_sections(d: ArchDims) -> list[int]:
    return in_proj_sections(d)[:3]


def _heads(d: ArchDims) -> dict[str, int]:
    return dict(key_heads=d.linear_num_key_heads, key_head_dim=d.linear_key_head_dim,
                value_heads=d.linear_num_value_heads, value_head_dim=d.linear_value_head_dim)


def _split_to_mcore(ts, d, pv):
    return [gdn_layout.split_in_proj_to_mcore(*ts)]


def _split_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_split_in_proj(ts[0], in_proj_sections(d))


def _fused_to_mcore(ts, d, pv):
    return [gdn_layout.fused_in_proj_to_mcore(ts[0], ts[1], **_heads(d))]


def _fused_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_fused_in_proj(ts[0], **_heads(d))


def _gated_qkv_to_mcore(ts, d, pv):
    return [gdn_layout.gated_qkv_to_mcore(*ts, num_groups=d.num_kv_heads, head_dim=d.head_dim)]


def _gated_qkv_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_gated_qkv(ts[0], num_groups=d.num_kv_heads, head_dim=d.head_dim,
                                         heads_per_group=d.heads_per_group)


def _plain(scope: str, mcore: str, hf: str) -> Rule:
    return Rule(scope=scope, mcore=(mcore,), hf=(hf,), to_mcore=_same, to_hf=_same)


def _gdn(*, fused: bool) -> tuple[Rule, ...]:
    proj = (Rule(scope="linear", mcore=(_M + "in_proj.weight",), hf=(_A + "in_proj_qkvz.weight", _A + "in_proj_ba.weight"),
                 to_mcore=_fused_to_mcore, to_hf=_fused_to_hf) if fused else
            Rule(scope="linear", mcore=(_M + "in_proj.weight",),
                 hf=tuple(f"{_A}in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")), to_mcore=_split_to_mcore,
                 to_hf=_split_to_hf))
    return (proj, _plain("linear", _M + "conv1d.weight", _A + "conv1d.weight"), _plain("linear", _M + "A_log", _A + "A_log"),
            _plain("linear", _M + "dt_bias", _A + "dt_bias"), _plain("linear", _M + "out_norm.weight", _A + "norm.weight"),
            _plain("linear", _M + "out_proj.weight", _A + "out_proj.weight"))


_GATED_ATTENTION = (
    Rule(scope="full", mcore=(_M + "linear_qkv.weight",), hf=tuple(f"{_HL}self_attn.{p}_proj.weight" for p in "qkv"),
         to_mcore=_gated_qkv_to_mcore, to_hf=_gated_qkv_to_hf),
    _plain("full", _M + "q_layernorm.weight", _HL + "self_attn.q_norm.weight"),
    _plain("full", _M + "k_layernorm.weight", _HL + "self_attn.k_norm.weight"),
    _plain("full", _M + "linear_proj.weight", _HL + "self_attn.o_proj.weight"),
)
_NORMS = (_plain("layer", _L + "input_layernorm.weight", _HL + "input_layernorm.weight"),
          _plain("layer", _L + "pre_mlp_layernorm.weight", _HL + "post_attention_layernorm.weight"))
_MOE = (
    _plain("moe", _L + "mlp.router.weight", _HL + "mlp.gate.weight"),
    *_mlp(scope="moe", mcore="mlp.experts.", hf=_HL + "mlp.experts.{e}.", suffix="{e}", per_expert=True),
    *_mlp(scope="moe", mcore="mlp.shared_experts.", hf=_HL + "mlp.shared_expert."),
    _plain("moe", _L + "mlp.shared_experts.gate_weight", _HL + "mlp.shared_expert_gate.weight"),
)
_BODY = (*_EMBEDDING, *_NORMS, *_GATED_ATTENTION, *_mlp(scope="dense", mcore="mlp.", hf=_HL + "mlp."), *_MOE, *_FINAL)
QWEN3_NEXT_TABLE: tuple[Rule, ...] = (*_BODY[:1], *_gdn(fused=True), *_BODY[1:])
QWEN3_5_TABLE: tuple[Rule, ...] = (*_BODY[:1], *_gdn(fused=False), *_BODY[1:])


def hybrid_table(d: ArchDims) -> tuple[Rule, ...]:
    return QWEN3_NEXT_TABLE if d.fused_gdn_proj else QWEN3_5_TABLE


def hybrid_shapes(d: ArchDims) -> list[tuple[str, tuple[int, ...]]]:
    """(regex on the HF name, shape) of the tensors the hybrid families add or size differently."""
    if not d.linear_layers and not d.attn_output_gate:
        return []
    H, kd, vd, nv = d.hidden_size, d.linear_num_key_heads * d.linear_key_head_dim, \
        d.linear_num_value_heads * d.linear_value_head_dim, d.linear_num_value_heads
    S = d.shared_expert_ffn
    return [
        (r"linear_attn\.in_proj_qkvz\.weight$", (2 * kd + 2 * vd, H)), (r"linear_attn\.in_proj_ba\.weight$", (2 * nv, H)),
        (r"linear_attn\.in_proj_qkv\.weight$", (2 * kd + vd, H)), (r"linear_attn\.in_proj_z\.weight$", (vd, H)),
        (r"linear_attn\.in_proj_[ab]\.weight$", (nv, H)), (r"linear_attn\.conv1d\.weight$", (2 * kd + vd, 1, d.linear_conv_kernel)),
        (r"linear_attn\.(A_log|dt_bias)$", (nv,)), (r"linear_attn\.norm\.weight$", (d.linear_value_head_dim,)),
        (r"linear_attn\.out_proj\.weight$", (H, vd)),
        (r"self_attn\.q_proj\.weight$", (2 * d.num_heads * d.head_dim, H)),
        (r"shared_expert\.(gate|up)_proj\.weight$", (S, H)), (r"shared_expert\.down_proj\.weight$", (H, S)),
        (r"shared_expert_gate\.weight$", (1, H)),
    ]
