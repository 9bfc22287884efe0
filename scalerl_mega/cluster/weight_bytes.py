"""Bytes of a model's weights in the generator's format, counted matrix by matrix from the architecture.

Unquantized, every parameter costs `dtype_bytes` (bf16: 2). Under `rollout.quantization=fp8` (quant/fp8.py) each
2-D linear projection of a decoder layer travels as one float8 byte per weight plus one float32 scale per
128x128 block, `ceil(rows / 128) * ceil(cols / 128)` of them, so a projection whose sides are not multiples of 128
pays for its partial blocks; norms, routers, embeddings, the LM head and fused 3-D expert tensors (Llama-4's
`experts.gate_up_proj`) keep `dtype_bytes`. The projection shapes are the HF checkpoint's `[out, in]`:

* attention: q, k, v, o (`[heads*d, h]`, `[kv*d, h]` twice, `[h, heads*d]`); MLA (DeepSeek-V3): q_a `[q_lora, h]`
  and q_b `[heads*(d+rope), q_lora]` (or one q `[heads*(d+rope), h]`), kv_a_proj_with_mqa `[kv_lora+rope, h]`,
  kv_b `[heads*(d+v), kv_lora]`, o `[h, heads*v]`;
* SwiGLU MLPs (dense, each routed expert, the shared expert): gate and up `[ffn, h]`, down `[h, ffn]`;
* Gated DeltaNet hybrids: the full-attention layers' q_proj holds the output gate too (`[2*heads*d, h]`); a GDN
  mixer's FP8 projections are `ModelShape.gdn.fp8_linears` (in_proj_qkvz `[2*(key dims + value dims), h]`, or
  Qwen3.5's in_proj_qkv and in_proj_z, and out_proj `[h, value dims]`); in_proj_ba / in_proj_b / in_proj_a, conv1d,
  A_log, dt_bias and the gated norm keep `dtype_bytes`.

Pure arithmetic on `cluster.plan.ModelShape`: tests/unit/test_sync_fp8_bytes.py checks it against the tensors the
exporter sends (convert/tables.py names and shapes through `quant.fp8.quantized_shapes`) for every model preset.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scalerl_mega.cluster.plan import ModelShape
from scalerl_mega.quant.fp8 import BLOCK, QUANTIZATIONS

Shape = tuple[int, int]
FUSED_EXPERTS = frozenset({"scout_17b16e"})
"""Models whose HF checkpoint holds a layer's experts in one tensor (Llama-4's `experts.gate_up_proj`): those 3-D
tensors are never quantized, and they travel with the stage's dense sender (weight_sync/plan.py)."""
SCALE_BYTES = 4
"""A block scale is float32."""


def attention_linears(model: ModelShape) -> list[Shape]:
    """`[out, in]` of one layer's attention projections (their sizes sum to `model.attention_params()`)."""
    h, d, n = model.hidden, model.head_dim, model.heads
    if model.mla:
        ql, kvl, rope, v = model.mla
        q = [(ql, h), (n * (d + rope), ql)] if ql else [(n * (d + rope), h)]
        return q + [(kvl + rope, h), (n * (d + v), kvl), (h, n * v)]
    q = n * d * (2 if model.gdn else 1)  # a hybrid's full attention: q_proj holds the query and its output gate
    return [(q, h), (model.kv_heads * d, h), (model.kv_heads * d, h), (h, n * d)]


def swiglu_linears(hidden: int, ffn: int) -> list[Shape]:
    """gate, up `[ffn, hidden]` and down `[hidden, ffn]` of one SwiGLU MLP (none when `ffn` is 0)."""
    return [(ffn, hidden), (ffn, hidden), (hidden, ffn)] if ffn else []


def linears_bytes(shapes: Iterable[Shape], *, dtype_bytes: int, quantization: str, count: int = 1) -> int:
    """Bytes of `count` copies of the projections `shapes`: `dtype_bytes` a weight, or FP8 (module doc)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is not one of {QUANTIZATIONS}")
    one = 0
    for rows, cols in shapes:
        if quantization == "fp8":
            one += rows * cols + SCALE_BYTES * math.ceil(rows / BLOCK[0]) * math.ceil(cols / BLOCK[1])
        else:
            one += rows * cols * dtype_bytes
    return count * one


def layer_part_bytes(model: ModelShape, *, dtype_bytes: int, quantization: str = "none",
                     fused_experts: bool | None = None) -> dict[str, int]:
    """Bytes of one layer's parts: `attention`, `dense_mlp`, `experts` (all routed experts of an MoE layer; in
    `dtype_bytes` when `fused_experts`, by default the models of `FUSED_EXPERTS`: 3-D tensors are not quantized),
    `shared_expert`."""
    fused_experts = model.name in FUSED_EXPERTS if fused_experts is None else fused_experts
    q = {"dtype_bytes": dtype_bytes, "quantization": quantization}
    expert = swiglu_linears(model.hidden, model.expert_ffn)
    return {"attention": linears_bytes(attention_linears(model), **q),
            "dense_mlp": linears_bytes(swiglu_linears(model.hidden, model.ffn), **q),
            "experts": (model.expert_params_per_layer() * dtype_bytes if fused_experts
                        else linears_bytes(expert, count=model.num_experts, **q)),
            "shared_expert": linears_bytes(swiglu_linears(model.hidden, model.shared_expert_ffn), **q)}


def router_params(model: ModelShape) -> int:
    """One MoE layer's router tensors as weight sync sends them: the router weight, DeepSeek-V3's (an MLA model's)
    e_score_correction_bias (one per expert; a buffer in the trainer, a tensor the engine loads) and Qwen3-Next's
    shared-expert gate `[1, hidden]`."""
    bias = model.num_experts if model.mla else 0
    return model.router_params() + bias + model.shared_expert_gate_params()


def mixer_bytes(model: ModelShape, *, layers: range, dtype_bytes: int, quantization: str = "none") -> int:
    """Bytes of the token mixers of decoder layers `layers` (0-based) with the layers' norms: attention, and in a
    Gated DeltaNet hybrid's GDN layers (cluster/gdn_shape.py) a GDN mixer's FP8 projections (`gdn.fp8_linears`) and
    the rest of it (conv, A_log, dt_bias, norm, the b/a projections) in `dtype_bytes`."""
    attention = linears_bytes(attention_linears(model), dtype_bytes=dtype_bytes, quantization=quantization)
    gdn = model.gdn.count(layers) if model.gdn else 0
    full = (len(layers) - gdn) * (attention + model.norm_params_per_layer() * dtype_bytes)
    if not gdn:
        return full
    linears = linears_bytes(model.gdn.fp8_linears, dtype_bytes=dtype_bytes, quantization=quantization)
    unquantized = model.gdn.mixer - sum(r * c for r, c in model.gdn.fp8_linears)
    return full + gdn * (linears + (unquantized + 2 * model.hidden) * dtype_bytes)


def model_bytes(model: ModelShape, *, dtype_bytes: int, quantization: str = "none",
                fused_experts: bool | None = None) -> int:
    """Bytes of the whole model: every layer's parts, its norms and routers, the embedding, final norm and head."""
    part = layer_part_bytes(model, dtype_bytes=dtype_bytes, quantization=quantization, fused_experts=fused_experts)
    total = mixer_bytes(model, layers=range(model.layers), dtype_bytes=dtype_bytes, quantization=quantization)
    total += model.dense_layers * part["dense_mlp"] + model.moe_layers * (part["experts"] + part["shared_expert"])
    rest = model.moe_layers * router_params(model) + model.embedding_params() + model.head_params() + model.hidden
    return total + rest * dtype_bytes
