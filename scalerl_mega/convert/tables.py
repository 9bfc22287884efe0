"""Per-architecture name/layout tables between Megatron-Core and Hugging Face weights.

A table is a tuple of ``Rule``s. A rule links a group of Megatron tensors to a group of HF tensors
(``{i}`` = global layer, ``{e}`` = global expert: all experts in one group, or one group per expert
for a ``per_expert`` rule) and carries the two pure layout functions. The tables are assembled from
shared pieces (embedding, attention with optional Qwen3 q/k norms, SwiGLU MLP, final norm and head):
an architecture's table spells out only what differs (its MoE block, its HF prefixes). ``scope`` says where the rule applies: once per model ("model"), per layer
("layer"), only dense-MLP layers ("dense"), only MoE layers ("moe"); ``untied`` rules are skipped
when the embeddings are tied. Megatron names are the unsharded, global-index names of a local-spec
``GPTModel`` (``mlp.experts.linear_fc1.weight{e}`` for experts, as in the grouped-GEMM layout).

Everything here is pure: ``(names, tensors) -> (names, tensors)``; no files, no process groups.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Sequence

import torch

from scalerl_mega.convert import gdn_layout, layout
from scalerl_mega.convert.dims import ArchDims

Fn = Callable[[Sequence[torch.Tensor], ArchDims, int], list[torch.Tensor]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    scope: str  # "model" | "final" | "layer" | "dense" | "moe" | "linear" | "full"
    mcore: tuple[str, ...]
    hf: tuple[str, ...]
    to_mcore: Fn  # (hf tensors, dims, padded_vocab) -> mcore tensors
    to_hf: Fn  # (mcore tensors, dims, padded_vocab) -> hf tensors
    untied: bool = False
    per_expert: bool = False  # "{e}" on both sides: one group per expert (else all experts in one group)

    @property
    def fused_experts(self) -> bool:
        """All experts of a layer in one HF tensor (Llama-4 `experts.gate_up_proj` [E, H, 2F])."""
        return not self.per_expert and any("{e}" in n for n in self.mcore)


@dataclasses.dataclass(frozen=True)
class Group:
    """One instantiated rule: concrete Megatron and HF names (global indices)."""

    rule: Rule
    layer: int | None
    mcore: tuple[str, ...]
    hf: tuple[str, ...]

    def to_mcore(self, hf_tensors: Sequence[torch.Tensor], dims: ArchDims, padded_vocab: int) -> list[torch.Tensor]:
        return self.rule.to_mcore(hf_tensors, dims, padded_vocab)

    def to_hf(self, mcore_tensors: Sequence[torch.Tensor], dims: ArchDims, padded_vocab: int) -> list[torch.Tensor]:
        return self.rule.to_hf(mcore_tensors, dims, padded_vocab)


def _same(ts, dims, pv):
    return [t.contiguous() for t in ts]


def _pad(ts, dims, pv):
    return [layout.pad_vocab(ts[0], padded_vocab=pv)]


def _unpad(ts, dims, pv):
    return [layout.unpad_vocab(ts[0], vocab=dims.vocab_size)]


def _qkv_to_mcore(ts, dims, pv):
    q, k, v = ts
    if dims.rope_interleaved_in_hf:
        q = layout.rope_pairs_to_halves(q, head_dim=dims.head_dim)
        k = layout.rope_pairs_to_halves(k, head_dim=dims.head_dim)
    return [layout.fuse_qkv(q, k, v, num_groups=dims.num_kv_heads, head_dim=dims.head_dim)]


def _qkv_to_hf(ts, dims, pv):
    q, k, v = layout.split_qkv(ts[0], num_groups=dims.num_kv_heads, head_dim=dims.head_dim, heads_per_group=dims.heads_per_group)
    if dims.rope_interleaved_in_hf:
        q = layout.rope_halves_to_pairs(q, head_dim=dims.head_dim)
        k = layout.rope_halves_to_pairs(k, head_dim=dims.head_dim)
    return [q, k, v]


def _gate_up_to_mcore(ts, dims, pv):
    return [layout.fuse_gate_up(ts[0], ts[1])]


def _gate_up_to_hf(ts, dims, pv):
    return list(layout.split_gate_up(ts[0]))


def _experts_fc1_to_mcore(ts, dims, pv):
    return layout.experts_gate_up_to_fc1(ts[0])


def _experts_fc1_to_hf(ts, dims, pv):
    return [layout.fc1_to_experts_gate_up(list(ts))]


def _experts_fc2_to_mcore(ts, dims, pv):
    return layout.experts_down_to_fc2(ts[0])


def _experts_fc2_to_hf(ts, dims, pv):
    return [layout.fc2_to_experts_down(list(ts))]


_L = "decoder.layers.{i}."
_HL = "model.layers.{i}."


def _mlp(*, scope: str, mcore: str, hf: str, suffix: str = "", per_expert: bool = False) -> tuple[Rule, Rule]:
    """A SwiGLU MLP: HF gate/up/down (`<hf>gate_proj.weight`, ...) <-> Megatron fused `linear_fc1` and
    `linear_fc2` (`<mcore>linear_fc1.weight<suffix>`). The dense MLP of every architecture, Llama-4's
    shared expert and each Qwen3-MoE routed expert (`per_expert`: one group per expert) are this rule."""
    return (
        Rule(scope=scope, mcore=(_L + mcore + "linear_fc1.weight" + suffix,), hf=(hf + "gate_proj.weight", hf + "up_proj.weight"),
             to_mcore=_gate_up_to_mcore, to_hf=_gate_up_to_hf, per_expert=per_expert),
        Rule(scope=scope, mcore=(_L + mcore + "linear_fc2.weight" + suffix,), hf=(hf + "down_proj.weight",),
             to_mcore=_same, to_hf=_same, per_expert=per_expert),
    )


def _attention(*, qk_norm: bool = False) -> tuple[Rule, ...]:
    """Pre-attention norm, fused q/k/v (GQA, grouped per query group), output projection, pre-MLP norm;
    `qk_norm`: Qwen3's per-head q/k RMSNorm weights [head_dim] (Megatron `q_layernorm` / `k_layernorm`)."""
    norms = tuple(Rule(scope="layer", mcore=(_L + f"self_attention.{p}_layernorm.weight",), hf=(_HL + f"self_attn.{p}_norm.weight",),
                       to_mcore=_same, to_hf=_same) for p in "qk") if qk_norm else ()
    return (
        Rule(scope="layer", mcore=(_L + "input_layernorm.weight",), hf=(_HL + "input_layernorm.weight",), to_mcore=_same, to_hf=_same),
        Rule(scope="layer", mcore=(_L + "self_attention.linear_qkv.weight",), hf=tuple(f"{_HL}self_attn.{p}_proj.weight" for p in "qkv"),
             to_mcore=_qkv_to_mcore, to_hf=_qkv_to_hf),
        *norms,
        Rule(scope="layer", mcore=(_L + "self_attention.linear_proj.weight",), hf=(_HL + "self_attn.o_proj.weight",), to_mcore=_same, to_hf=_same),
        Rule(scope="layer", mcore=(_L + "pre_mlp_layernorm.weight",), hf=(_HL + "post_attention_layernorm.weight",), to_mcore=_same, to_hf=_same),
    )


_EMBEDDING = (Rule(scope="model", mcore=("embedding.word_embeddings.weight",), hf=("model.embed_tokens.weight",), to_mcore=_pad, to_hf=_unpad),)
_FINAL = (
    Rule(scope="final", mcore=("decoder.final_layernorm.weight",), hf=("model.norm.weight",), to_mcore=_same, to_hf=_same),
    Rule(scope="final", mcore=("output_layer.weight",), hf=("lm_head.weight",), to_mcore=_pad, to_hf=_unpad, untied=True),
)
_FF = _HL + "feed_forward."

LLAMA_TABLE: tuple[Rule, ...] = (*_EMBEDDING, *_attention(), *_mlp(scope="layer", mcore="mlp.", hf=_HL + "mlp."), *_FINAL)

LLAMA4_TABLE: tuple[Rule, ...] = (
    *_EMBEDDING,
    *_attention(),
    *_mlp(scope="dense", mcore="mlp.", hf=_FF),
    # MoE layers: router, routed experts (HF fused [E, H, 2F] / [E, F, H]), shared expert
    Rule(scope="moe", mcore=(_L + "mlp.router.weight",), hf=(_FF + "router.weight",), to_mcore=_same, to_hf=_same),
    Rule(scope="moe", mcore=(_L + "mlp.experts.linear_fc1.weight{e}",), hf=(_FF + "experts.gate_up_proj",), to_mcore=_experts_fc1_to_mcore, to_hf=_experts_fc1_to_hf),
    Rule(scope="moe", mcore=(_L + "mlp.experts.linear_fc2.weight{e}",), hf=(_FF + "experts.down_proj",), to_mcore=_experts_fc2_to_mcore, to_hf=_experts_fc2_to_hf),
    *_mlp(scope="moe", mcore="mlp.shared_experts.", hf=_FF + "shared_expert."),
    *_FINAL,
)

QWEN3_TABLE: tuple[Rule, ...] = (*_EMBEDDING, *_attention(qk_norm=True), *_mlp(scope="layer", mcore="mlp.", hf=_HL + "mlp."), *_FINAL)

QWEN3_MOE_TABLE: tuple[Rule, ...] = (
    *_EMBEDDING,
    *_attention(qk_norm=True),
    *_mlp(scope="dense", mcore="mlp.", hf=_HL + "mlp."),  # `mlp_only_layers` / `decoder_sparse_step` layers
    # MoE layers: router (`mlp.gate`), then each routed expert as its own SwiGLU MLP (no shared expert)
    Rule(scope="moe", mcore=(_L + "mlp.router.weight",), hf=(_HL + "mlp.gate.weight",), to_mcore=_same, to_hf=_same),
    *_mlp(scope="moe", mcore="mlp.experts.", hf=_HL + "mlp.experts.{e}.", suffix="{e}", per_expert=True),
    *_FINAL,
)


def _mla(*, q_lora: bool) -> tuple[Rule, ...]:
    """Multi-head Latent Attention (DeepSeek-V2/V3): q (low-rank `q_a_proj` + RMSNorm + `q_b_proj`, or a full
    `q_proj`), the joint down projection of the compressed KV and the shared RoPE key with its RMSNorm, the KV up
    projection; each HF tensor is one Megatron tensor, same layout (the RoPE dims stay interleaved pairs, which
    Megatron's MLA reads as HF does with `rope_interleave`)."""
    a, m = _HL + "self_attn.", _L + "self_attention."
    pairs = ((("q_a_proj", "linear_q_down_proj"), ("q_a_layernorm", "q_layernorm"), ("q_b_proj", "linear_q_up_proj"))
             if q_lora else (("q_proj", "linear_q_proj"),))
    pairs += (("kv_a_proj_with_mqa", "linear_kv_down_proj"), ("kv_a_layernorm", "kv_layernorm"),
              ("kv_b_proj", "linear_kv_up_proj"), ("o_proj", "linear_proj"))
    return (
        Rule(scope="layer", mcore=(_L + "input_layernorm.weight",), hf=(_HL + "input_layernorm.weight",), to_mcore=_same, to_hf=_same),
        *(Rule(scope="layer", mcore=(m + mc + ".weight",), hf=(a + h + ".weight",), to_mcore=_same, to_hf=_same) for h, mc in pairs),
        Rule(scope="layer", mcore=(_L + "pre_mlp_layernorm.weight",), hf=(_HL + "post_attention_layernorm.weight",), to_mcore=_same, to_hf=_same),
    )


def _deepseek_v3(*, q_lora: bool) -> tuple[Rule, ...]:
    """DeepSeek-V3: MLA; the first `first_k_dense_replace` layers dense; MoE layers with the sigmoid router and
    its score-correction bias (a buffer: Megatron `router.expert_bias`), per-expert routed experts and the
    shared experts as one MLP."""
    return (
        *_EMBEDDING,
        *_mla(q_lora=q_lora),
        *_mlp(scope="dense", mcore="mlp.", hf=_HL + "mlp."),
        Rule(scope="moe", mcore=(_L + "mlp.router.weight",), hf=(_HL + "mlp.gate.weight",), to_mcore=_same, to_hf=_same),
        Rule(scope="moe", mcore=(_L + "mlp.router.expert_bias",), hf=(_HL + "mlp.gate.e_score_correction_bias",),
             to_mcore=_same, to_hf=_same),
        *_mlp(scope="moe", mcore="mlp.experts.", hf=_HL + "mlp.experts.{e}.", suffix="{e}", per_expert=True),
        *_mlp(scope="moe", mcore="mlp.shared_experts.", hf=_HL + "mlp.shared_experts."),
        *_FINAL,
    )


DEEPSEEK_V3_TABLE = _deepseek_v3(q_lora=True)
DEEPSEEK_V3_NO_Q_LORA_TABLE = _deepseek_v3(q_lora=False)  # Moonlight, DeepSeek-V2-Lite: q_lora_rank null


# --- Qwen3-Next / Qwen3.5 / Qwen3.5-MoE: scope "linear" rules apply to the Gated DeltaNet layers (HF `linear_attn.*`
# <-> Megatron `self_attention.*` of the local GDN spec, trainer/megatron/gdn.py), scope "full" to the gated
# full-attention layers; layouts in convert/gdn_layout.py. The zero-centred norms keep their stored `w` on both sides.
_A, _M = _HL + "linear_attn.", _L + "self_attention."


def _gdn_heads(d: ArchDims) -> dict[str, int]:
    return dict(key_heads=d.linear_num_key_heads, key_head_dim=d.linear_key_head_dim,
                value_heads=d.linear_num_value_heads, value_head_dim=d.linear_value_head_dim)


def _split_to_mcore(ts, d, pv):
    return [gdn_layout.split_in_proj_to_mcore(*ts)]


def _split_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_split_in_proj(ts[0], gdn_layout.in_proj_sections(d))


def _fused_to_mcore(ts, d, pv):
    return [gdn_layout.fused_in_proj_to_mcore(ts[0], ts[1], **_gdn_heads(d))]


def _fused_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_fused_in_proj(ts[0], **_gdn_heads(d))


def _gated_qkv_to_mcore(ts, d, pv):
    return [gdn_layout.gated_qkv_to_mcore(*ts, num_groups=d.num_kv_heads, head_dim=d.head_dim)]


def _gated_qkv_to_hf(ts, d, pv):
    return gdn_layout.mcore_to_gated_qkv(ts[0], num_groups=d.num_kv_heads, head_dim=d.head_dim,
                                         heads_per_group=d.heads_per_group)


def _one(scope: str, mcore: str, hf: str) -> Rule:
    return Rule(scope=scope, mcore=(mcore,), hf=(hf,), to_mcore=_same, to_hf=_same)


def _gdn_rules(*, fused: bool) -> tuple[Rule, ...]:
    proj = (Rule(scope="linear", mcore=(_M + "in_proj.weight",), hf=(_A + "in_proj_qkvz.weight", _A + "in_proj_ba.weight"),
                 to_mcore=_fused_to_mcore, to_hf=_fused_to_hf) if fused else
            Rule(scope="linear", mcore=(_M + "in_proj.weight",),
                 hf=tuple(f"{_A}in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")), to_mcore=_split_to_mcore,
                 to_hf=_split_to_hf))
    return (proj, _one("linear", _M + "conv1d.weight", _A + "conv1d.weight"), _one("linear", _M + "A_log", _A + "A_log"),
            _one("linear", _M + "dt_bias", _A + "dt_bias"), _one("linear", _M + "out_norm.weight", _A + "norm.weight"),
            _one("linear", _M + "out_proj.weight", _A + "out_proj.weight"))


_GATED_ATTENTION = (
    Rule(scope="full", mcore=(_M + "linear_qkv.weight",), hf=tuple(f"{_HL}self_attn.{p}_proj.weight" for p in "qkv"),
         to_mcore=_gated_qkv_to_mcore, to_hf=_gated_qkv_to_hf),
    _one("full", _M + "q_layernorm.weight", _HL + "self_attn.q_norm.weight"),
    _one("full", _M + "k_layernorm.weight", _HL + "self_attn.k_norm.weight"),
    _one("full", _M + "linear_proj.weight", _HL + "self_attn.o_proj.weight"),
)
_NORMS = (_one("layer", _L + "input_layernorm.weight", _HL + "input_layernorm.weight"),
          _one("layer", _L + "pre_mlp_layernorm.weight", _HL + "post_attention_layernorm.weight"))
_MOE = (
    _one("moe", _L + "mlp.router.weight", _HL + "mlp.gate.weight"),
    *_mlp(scope="moe", mcore="mlp.experts.", hf=_HL + "mlp.experts.{e}.", suffix="{e}", per_expert=True),
    *_mlp(scope="moe", mcore="mlp.shared_experts.", hf=_HL + "mlp.shared_expert."),
    _one("moe", _L + "mlp.shared_experts.gate_weight", _HL + "mlp.shared_expert_gate.weight"),
)
_BODY = (*_EMBEDDING, *_NORMS, *_GATED_ATTENTION, *_mlp(scope="dense", mcore="mlp.", hf=_HL + "mlp."), *_MOE, *_FINAL)
QWEN3_NEXT_TABLE: tuple[Rule, ...] = (*_BODY[:1], *_gdn_rules(fused=True), *_BODY[1:])
QWEN3_5_TABLE: tuple[Rule, ...] = (*_BODY[:1], *_gdn_rules(fused=False), *_BODY[1:])


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


TABLES: dict[str, tuple[Rule, ...]] = {"llama": LLAMA_TABLE, "llama4": LLAMA4_TABLE, "qwen3": QWEN3_TABLE,
                                       "qwen3_moe": QWEN3_MOE_TABLE, "deepseek_v3": DEEPSEEK_V3_TABLE}


def table_of(dims: ArchDims) -> tuple[Rule, ...]:
    if dims.arch == "deepseek_v3" and not dims.q_lora_rank:
        return DEEPSEEK_V3_NO_Q_LORA_TABLE
    if dims.arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):  # the Gated DeltaNet hybrids
        return hybrid_table(dims)
    return TABLES[dims.arch]


def _expand(templates: tuple[str, ...], layer: int | None, num_experts: int, expert: int | None = None) -> tuple[str, ...]:
    """Concrete names: `{i}` -> `layer`; `{e}` -> `expert`, or every expert 0..num_experts-1."""
    out: list[str] = []
    for t in templates:
        if "{e}" in t and expert is None:
            out.extend(t.format(i=layer, e=e) for e in range(num_experts))
        elif "{e}" in t:
            out.append(t.format(i=layer, e=expert))
        else:
            out.append(t.format(i=layer) if layer is not None else t)
    return tuple(out)


def _applies(rule: Rule, dims: ArchDims, layer: int | None) -> bool:
    if rule.untied and dims.tie_word_embeddings:
        return False
    if rule.scope == "dense":
        return not dims.is_moe_layer(layer)
    if rule.scope == "moe":
        return dims.is_moe_layer(layer)
    if rule.scope in ("linear", "full"):  # Gated DeltaNet / full-attention layers of the hybrid families
        return dims.is_linear_layer(layer) == (rule.scope == "linear")
    return True


def iter_groups(dims: ArchDims, *, layers: Sequence[int] | None = None, first_stage: bool = True, last_stage: bool = True) -> Iterator[Group]:
    """All groups of the model in a fixed order: embedding, layers ascending (table order inside a
    layer), final norm, output layer. ``layers``/``first_stage``/``last_stage`` restrict it to one
    pipeline stage."""
    table = table_of(dims)
    layer_ids = range(dims.num_layers) if layers is None else layers
    if first_stage:
        for rule in table:
            if rule.scope == "model" and _applies(rule, dims, None):
                yield Group(rule, None, _expand(rule.mcore, None, 0), _expand(rule.hf, None, 0))
    for i in layer_ids:
        for rule in table:
            if rule.scope not in ("layer", "dense", "moe", "linear", "full") or not _applies(rule, dims, i):
                continue
            for e in range(dims.num_experts) if rule.per_expert else [None]:
                yield Group(rule, i, _expand(rule.mcore, i, dims.num_experts, e), _expand(rule.hf, i, dims.num_experts, e))
    if last_stage:
        for rule in table:
            if rule.scope == "final" and _applies(rule, dims, None):
                yield Group(rule, None, _expand(rule.mcore, None, 0), _expand(rule.hf, None, 0))


def hf_names(dims: ArchDims) -> list[str]:
    return [n for g in iter_groups(dims) for n in g.hf]


def mcore_names(dims: ArchDims) -> list[str]:
    return [n for g in iter_groups(dims) for n in g.mcore]


def mcore_to_hf(group: Group, tensors: Sequence[torch.Tensor], *, dims: ArchDims, padded_vocab: int) -> list[tuple[str, torch.Tensor]]:
    """Full (unsharded) Megatron tensors of ``group`` -> HF ``(name, tensor)`` pairs."""
    out = group.to_hf(tensors, dims, padded_vocab)
    return list(zip(group.hf, out, strict=True))


def hf_to_mcore(group: Group, tensors: Sequence[torch.Tensor], *, dims: ArchDims, padded_vocab: int) -> list[tuple[str, torch.Tensor]]:
    """HF tensors of ``group`` -> full Megatron ``(name, tensor)`` pairs."""
    out = group.to_mcore(tensors, dims, padded_vocab)
    return list(zip(group.mcore, out, strict=True))


def _hf_shape_by_pattern(dims: ArchDims) -> list[tuple[str, tuple[int, ...]]]:
    """(regex on the HF name, shape); the first match wins, so specific names come before general ones."""
    H, V, hd = dims.hidden_size, dims.vocab_size, dims.head_dim
    nq, nkv, F, Fm, E = dims.num_heads * hd, dims.num_kv_heads * hd, dims.ffn_hidden_size, dims.moe_ffn_hidden_size, dims.num_experts
    return [*_mla_shapes(dims), *hybrid_shapes(dims), *_plain_shapes(H, V, hd, nq, nkv, F, Fm, E)]


def _mla_shapes(d: ArchDims) -> list[tuple[str, tuple[int, ...]]]:
    if d.arch != "deepseek_v3":
        return []
    H, n, rope, ql, kvl = d.hidden_size, d.num_heads, d.qk_rope_head_dim, d.q_lora_rank, d.kv_lora_rank
    qk = d.head_dim + rope
    return [
        (r"q_a_proj\.weight$", (ql, H)), (r"q_a_layernorm\.weight$", (ql,)), (r"q_b_proj\.weight$", (n * qk, ql)),
        (r"self_attn\.q_proj\.weight$", (n * qk, H)), (r"kv_a_proj_with_mqa\.weight$", (kvl + rope, H)),
        (r"kv_a_layernorm\.weight$", (kvl,)), (r"kv_b_proj\.weight$", (n * (d.head_dim + d.v_head_dim), kvl)),
        (r"o_proj\.weight$", (H, n * d.v_head_dim)), (r"shared_experts\.(gate|up)_proj\.weight$", (d.shared_expert_ffn, H)),
        (r"shared_experts\.down_proj\.weight$", (H, d.shared_expert_ffn)), (r"e_score_correction_bias$", (d.num_experts,)),
    ]


def _plain_shapes(H, V, hd, nq, nkv, F, Fm, E) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (r"embed_tokens\.weight$", (V, H)),
        (r"lm_head\.weight$", (V, H)),
        (r"self_attn\.[qk]_norm\.weight$", (hd,)),
        (r"norm\.weight$", (H,)),
        (r"q_proj\.weight$", (nq, H)),
        (r"[kv]_proj\.weight$", (nkv, H)),
        (r"o_proj\.weight$", (H, nq)),
        (r"(shared_expert|experts\.\d+)\.(gate|up)_proj\.weight$", (Fm, H)),
        (r"(shared_expert|experts\.\d+)\.down_proj\.weight$", (H, Fm)),
        (r"(gate|up)_proj\.weight$", (F, H)),
        (r"down_proj\.weight$", (H, F)),
        (r"(router|mlp\.gate)\.weight$", (E, H)),
        (r"experts\.gate_up_proj$", (E, H, 2 * Fm)),
        (r"experts\.down_proj$", (E, Fm, H)),
    ]


def expected_hf_shape(name: str, dims: ArchDims) -> tuple[int, ...]:
    """Shape an HF tensor of this architecture must have (first matching pattern wins)."""
    for pattern, shape in _hf_shape_by_pattern(dims):
        if re.search(pattern, name):
            return shape
    raise ValueError(f"no expected shape for HF tensor {name!r}")


def expected_mcore_shapes(group: Group, *, dims: ArchDims, padded_vocab: int) -> list[tuple[int, ...]]:
    """Full Megatron shapes of a group, derived by running the HF->Megatron layout on meta tensors."""
    metas = [torch.empty(expected_hf_shape(n, dims), device="meta") for n in group.hf]
    return [tuple(t.shape) for t in group.to_mcore(metas, dims, padded_vocab)]
