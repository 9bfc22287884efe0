"""The hybrid Gated DeltaNet families (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) in a `ModelConfig`: which layers are
linear attention, what the GDN and gated-attention settings must be, the parameters they add, and the recurrent
state a generator keeps per sequence.

A GDN layer (Yang et al. 2024, "Gated Delta Networks") projects the hidden states to q/k (`linear_num_key_heads`
x `linear_key_head_dim`), v and the output gate z (`linear_num_value_heads` x `linear_value_head_dim`) and two
per-value-head scalars (beta, the write strength; a, the decay), runs a short causal depthwise convolution
(`linear_conv_kernel_dim`) over q/k/v and the gated delta rule over the sequence, then a gated RMSNorm and the
output projection. The other layers are full attention with an output gate (`q_proj` yields query and gate),
partial RoPE and q/k norms. Every RMSNorm except the GDN's gated one is zero-centred: `(1 + w) * x / rms(x)`.

Pure checks and sizes (no torch): every check raises ValueError naming the key.
"""

from __future__ import annotations

HYBRID_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
LINEAR, FULL = "linear_attention", "full_attention"
_GDN_KEYS = ("linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
             "linear_conv_kernel_dim")


def is_hybrid(arch: str) -> bool:
    return arch in HYBRID_ARCHS


def layer_types_of(*, num_layers: int, layer_types, full_attention_interval: int) -> list[str]:
    """Per-layer `linear_attention` / `full_attention`: `layer_types` when given, else layer i is full attention
    when (i + 1) % `full_attention_interval` == 0 (transformers' Qwen3NextConfig / Qwen3_5TextConfig rule)."""
    if layer_types:
        return list(layer_types)
    return [FULL if (i + 1) % full_attention_interval == 0 else LINEAR for i in range(num_layers)]


def linear_layers(m) -> tuple[int, ...]:
    """0-based GDN layers of ModelConfig `m` (none for the non-hybrid architectures)."""
    if not is_hybrid(m.arch):
        return ()
    types = layer_types_of(num_layers=m.num_layers, layer_types=m.layer_types,
                           full_attention_interval=m.full_attention_interval)
    return tuple(i for i, t in enumerate(types) if t == LINEAR)


def validate_hybrid(m, where: str) -> None:
    """GDN / gated-attention settings of ModelConfig `m` (module docstring)."""
    if not is_hybrid(m.arch):
        used = [k for k in ("layer_types", "attention_output_gate", "moe_shared_expert_gate") if getattr(m, k)]
        if m.partial_rotary_factor != 1.0:
            used.append("partial_rotary_factor")
        if used:
            raise ValueError(f"{where}: {used[0]}={getattr(m, used[0])!r} is a Qwen3-Next / Qwen3.5 setting but arch="
                             f"{m.arch!r} (set arch: qwen3_next, qwen3_5 or qwen3_5_moe)")
        return
    for key in _GDN_KEYS:
        v = getattr(m, key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{where}: {key}={v!r} must be a positive integer for arch={m.arch!r} (Gated DeltaNet)")
    if m.linear_num_value_heads % m.linear_num_key_heads:
        raise ValueError(f"{where}: linear_num_value_heads={m.linear_num_value_heads} is not a multiple of "
                         f"linear_num_key_heads={m.linear_num_key_heads}")
    if m.layer_types:
        bad = [t for t in m.layer_types if t not in (LINEAR, FULL)]
        if len(m.layer_types) != m.num_layers or bad:
            raise ValueError(f"{where}: layer_types={list(m.layer_types)} must list {m.num_layers} entries, each "
                             f"{LINEAR!r} or {FULL!r}")
    elif not isinstance(m.full_attention_interval, int) or m.full_attention_interval <= 0:
        raise ValueError(f"{where}: full_attention_interval={m.full_attention_interval!r} must be a positive integer")
    if not m.attention_output_gate:
        raise ValueError(f"{where}: attention_output_gate=False but arch={m.arch!r} gates its attention output "
                         "(q_proj yields query and gate); set model.attention_output_gate=true")
    rot = m.kv_channels * m.partial_rotary_factor
    if not 0 < m.partial_rotary_factor <= 1 or rot != int(rot) or int(rot) % 2:
        raise ValueError(f"{where}: partial_rotary_factor={m.partial_rotary_factor} must give an even number of "
                         f"rotated dims of head_dim={m.kv_channels}")
    if m.arch == "qwen3_5" and m.is_moe:
        raise ValueError(f"{where}: arch='qwen3_5' is dense but num_experts={m.num_experts}; use arch: qwen3_5_moe")
    if m.arch != "qwen3_5" and not m.is_moe:
        raise ValueError(f"{where}: arch={m.arch!r} needs routed experts (num_experts > 0)")
    if m.is_moe and bool(m.moe_shared_expert_gate) != bool(m.shared_expert_ffn):
        raise ValueError(f"{where}: moe_shared_expert_gate={m.moe_shared_expert_gate} with shared_expert_ffn="
                         f"{m.shared_expert_ffn}: the shared expert of arch={m.arch!r} is sigmoid-gated (both on or off)")


def validate_hybrid_layout(m, *, tp: int, cp: int, where: str = "parallel") -> None:
    """What Megatron's GDN layer can split: key and value heads over TP; no context parallelism (its torch
    path and megatron-core 0.16.1 have none)."""
    if not linear_layers(m):
        return
    if cp > 1:
        raise ValueError(f"{where}: cp={cp} > 1 with Gated DeltaNet layers (model '{m.name}', arch={m.arch!r}): "
                         "the GDN layer has no context-parallel path here; set parallel.cp=1")
    for key in ("linear_num_key_heads", "linear_num_value_heads"):
        if getattr(m, key) % tp:
            raise ValueError(f"{where}: tp={tp} does not divide model.{key}={getattr(m, key)}")


def gdn_params(m) -> int:
    """Parameters of one GDN block (its input RMSNorm counted with the layer): in_proj (q, k, v, z, b, a),
    the depthwise conv over q/k/v, A_log and dt_bias per value head, the gated norm and out_proj."""
    qk, v, nv = m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim, \
        m.linear_num_value_heads
    in_proj = m.hidden_size * (2 * qk + 2 * v + 2 * nv)
    conv = (2 * qk + v) * m.linear_conv_kernel_dim
    return in_proj + conv + 2 * nv + m.linear_value_head_dim + v * m.hidden_size


def gdn_fp8_linears(m) -> tuple[tuple[int, int], ...]:
    """`[out, in]` of one GDN mixer's HF projections that FP8 weight sync quantizes (quant/fp8.py, as SGLang serves
    the published FP8 checkpoints): Qwen3-Next's fused `in_proj_qkvz` or Qwen3.5's `in_proj_qkv` and `in_proj_z`, and
    `out_proj`; `in_proj_ba` (`in_proj_b`, `in_proj_a`) stays unquantized."""
    h, qk = m.hidden_size, m.linear_num_key_heads * m.linear_key_head_dim
    v = m.linear_num_value_heads * m.linear_value_head_dim
    inputs = ((2 * qk + 2 * v, h),) if m.arch == "qwen3_next" else ((2 * qk + v, h), (v, h))
    return (*inputs, (h, v))


def gated_attention_extra_params(m) -> int:
    """What the output gate adds to a plain GQA block: a second query-sized projection."""
    return m.hidden_size * m.num_attention_heads * m.kv_channels if m.attention_output_gate else 0


def recurrent_state_bytes_per_sequence(m, *, dtype_bytes: int = 2, state_bytes: int = 4) -> int:
    """A generator's per-sequence state over all GDN layers, independent of the length: the delta-rule state
    (value heads x key dim x value dim, kept in FP32 by fla's and transformers' kernels: `state_bytes`) plus
    the convolution cache (the last `linear_conv_kernel_dim` - 1 inputs of q/k/v, in the model dtype)."""
    n = len(linear_layers(m))
    if not n:
        return 0
    state = m.linear_num_value_heads * m.linear_key_head_dim * m.linear_value_head_dim * state_bytes
    conv_dim = 2 * m.linear_num_key_heads * m.linear_key_head_dim + m.linear_num_value_heads * m.linear_value_head_dim
    conv = conv_dim * (m.linear_conv_kernel_dim - 1) * dtype_bytes
    return n * (state + conv)


def banner_note(m, *, cuda: bool) -> str:
    """The banner's words for the GDN layers of `m` ("" for other models): how many, and which kernels run them:
    fla's (CUDA with the fla package found; not imported here) or megatron's torch path (trainer/megatron/gdn.py)."""
    n = len(linear_layers(m))
    if not n:
        return ""
    import importlib.util

    fla = cuda and importlib.util.find_spec("fla") is not None
    return f", Gated DeltaNet in {n} of {m.num_layers} layers ({'fla kernels' if fla else 'torch path, no fla'})"
