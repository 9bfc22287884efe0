"""Typed configuration for the Megatron-Core trainer: model shape, parallel layout, optimizer.

Pure dataclasses: no torch or megatron import, so configs can be validated (and Hydra can compose
them) before any process group starts. Every check raises ValueError naming the key and value.
Presets live in `conf/model/<name>.yaml` (plain YAML, read with omegaconf).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from scalerl_mega.model.archs import ARCHS as _ARCH_RECORDS
from scalerl_mega.model.archs import arch_of

ARCHS = tuple(_ARCH_RECORDS)
DISPATCHERS = ("alltoall", "allgather")
SCORE_FUNCTIONS = ("softmax", "sigmoid")
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")
PRESETS = ("tiny_dense", "tiny_moe", "tiny_qwen3", "tiny_qwen3_moe", "tiny_deepseek_v3", "llama3_8b", "scout_17b16e",
           "qwen3_0p6b", "qwen3_8b", "qwen3_30b_a3b", "qwen3_235b_a22b", "moonlight_16b_a3b", "deepseek_v3_671b",
           "tiny_qwen3_next", "tiny_qwen3_5", "tiny_qwen3_5_moe", "qwen3_next_80b_a3b")


def _conf_dir() -> Path:
    """`conf/model/` (the repository's, or the installed wheel's copy)."""
    from scalerl_mega.conf_path import conf_dir

    return conf_dir() / "model"


@dataclass(kw_only=True)
class ModelConfig:
    """Decoder-only transformer shape: Llama-3 dense, Llama-4 Scout-style MoE, Qwen3 dense, Qwen3-MoE."""

    name: str = "custom"
    arch: str = "llama"
    """"llama" (Llama-3 family), "llama4" (Llama-4: MoE + NoPE/chunked attention features), "qwen3"
    (Qwen3 dense: per-head q/k RMSNorm) or "qwen3_moe" (Qwen3-MoE); model/archs.py."""
    vocab_size: int = 256
    """Used unpadded: must be divisible by the tensor-parallel size (so exported logits are exact)."""
    hidden_size: int = 64
    ffn_hidden_size: int = 128
    """Dense MLP width (SwiGLU: gate and up each have this width)."""
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: int = 2
    """GQA key/value heads."""
    head_dim: Optional[int] = None
    """Per-head width; None means hidden_size // num_attention_heads."""
    max_position_embeddings: int = 2048
    rope_theta: float = 500000.0
    rope_scaling: bool = False
    """Llama-3.1 style frequency scaling (long context)."""
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    """Llama-3 RoPE scaling parameters (HF rope_parameters); Scout uses factor 16, low = high = 1.0."""
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_layernorm: bool = False
    """Per-head RMSNorm on q and k before RoPE (Qwen3: required; Llama: off)."""
    init_method_std: float = 0.02
    fp32_lm_head: bool = True
    """Compute the output layer and logits in FP32 (paper Sec. 3.2, "FP32 Precision for LLM logits")."""
    # --- MoE (num_experts == 0: dense) ---
    num_experts: int = 0
    moe_topk: int = 1
    moe_ffn_hidden_size: Optional[int] = None
    """Routed expert width; None means ffn_hidden_size."""
    shared_expert_ffn: int = 0
    """Shared expert width (0: none). Scout has one shared expert next to the routed ones."""
    moe_layer_freq: int = 1
    """Every Nth layer is MoE (1: all layers, 2: alternate dense/MoE starting with dense)."""
    moe_dense_layers: list[int] = field(default_factory=list)
    """0-based layers kept dense although `moe_layer_freq` selects them (HF Qwen3-MoE `mlp_only_layers`)."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before top-k, top-k weights not renormalised (HF `norm_topk_prob=False`);
    False: softmax over the top-k logits = all-expert softmax renormalised over the top-k (Qwen3-MoE's
    `norm_topk_prob=True`). Required by Megatron for top-1 softmax routing."""
    moe_router_score_function: str = "softmax"
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 1e-2
    moe_apply_probs_on_input: bool = False
    """Multiply the expert input (not output) by the router probability (Llama-4; top-1 only)."""
    # --- Llama-4 only (all off by default) ---
    no_rope_freq: int = 0
    """Every Nth layer uses no positional encoding (NoPE); 0 disables (Llama-4 uses 4)."""
    attention_chunk_size: int = 0
    """Chunked local attention window on RoPE layers; 0 disables (Llama-4 uses 8192)."""
    attn_temperature_tuning: bool = False
    """Scale NoPE-layer queries by log(floor((pos+1)/floor_scale)+1)*attn_scale+1 (Llama-4)."""
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    qk_l2_norm: bool = False
    """L2-normalise q and k on RoPE layers (Llama-4 Scout)."""
    # --- DeepSeek-V3 only (model/deepseek.py): Multi-head Latent Attention, YaRN, group-limited routing ---
    kv_lora_rank: int = 0
    """MLA's compressed KV width (0: standard attention). With MLA `head_dim` is the no-RoPE q/k head width."""
    q_lora_rank: Optional[int] = None
    """MLA's compressed query width (None: a full q projection)."""
    qk_rope_head_dim: int = 0
    """MLA's decoupled RoPE width per head (one shared RoPE key per token)."""
    v_head_dim: int = 0
    """MLA's value head width."""
    yarn_factor: float = 0.0
    """YaRN RoPE scaling factor (0: off); the five fields below are its parameters (HF `rope_parameters`)."""
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    moe_router_num_groups: int = 0
    """Expert groups for group-limited top-k (HF `n_group`; 0: no groups)."""
    moe_router_group_topk: int = 0
    """Groups kept per token (HF `topk_group`)."""
    moe_router_topk_scaling_factor: float = 1.0
    """Routed weights times this (HF `routed_scaling_factor`)."""
    moe_router_expert_bias: bool = False
    """A per-expert bias added to the sigmoid scores for the top-k choice only (HF `e_score_correction_bias`):
    a buffer, loaded and exported, frozen in RL (Megatron's aux-free update rate is 0)."""
    # --- Qwen3-Next / Qwen3.5 only (model/hybrid.py): Gated DeltaNet layers, gated attention ---
    layer_types: list[str] = field(default_factory=list)
    """Per layer "linear_attention" (GDN) or "full_attention"; empty: from `full_attention_interval`."""
    full_attention_interval: int = 4
    """Layer i is full attention when (i + 1) % this == 0 (HF's default when `layer_types` is absent)."""
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    partial_rotary_factor: float = 1.0
    """Share of each head's dims that RoPE rotates (the first ones; Qwen3-Next 0.25)."""
    attention_output_gate: bool = False
    """Full attention's output times sigmoid(gate), the gate a second query-sized projection."""
    moe_shared_expert_gate: bool = False
    """The shared expert's output times sigmoid(h . w_gate) (HF `shared_expert_gate`)."""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_channels(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_hidden_size

    def llama4_features(self) -> list[str]:
        """Names of the Llama-4-only features that are switched on."""
        on = []
        if self.no_rope_freq:
            on.append(f"no_rope_freq={self.no_rope_freq}")
        if self.attention_chunk_size:
            on.append(f"attention_chunk_size={self.attention_chunk_size}")
        if self.attn_temperature_tuning:
            on.append("attn_temperature_tuning=True")
        if self.qk_l2_norm:
            on.append("qk_l2_norm=True")
        return on

    def is_moe_layer(self, layer: int) -> bool:
        """Layer `layer` (0-based) is MoE: every `moe_layer_freq`-th layer, the last of each period, unless
        listed in `moe_dense_layers`."""
        return self.is_moe and (layer + 1) % self.moe_layer_freq == 0 and layer not in self.moe_dense_layers

    def validate(self) -> "ModelConfig":
        where = f"model '{self.name}'"
        _choice(where, "arch", self.arch, ARCHS)
        arch = arch_of(self.arch, where=where)
        if bool(self.qk_layernorm) != arch.qk_layernorm:
            raise ValueError(f"{where}: qk_layernorm={self.qk_layernorm} but arch={self.arch!r} ({arch.family}) "
                             f"{'has' if arch.qk_layernorm else 'has no'} per-head q/k RMSNorm; set model.qk_layernorm="
                             f"{str(arch.qk_layernorm).lower()}")
        bad = [i for i in self.moe_dense_layers if not isinstance(i, int) or not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"{where}: moe_dense_layers={list(self.moe_dense_layers)} names {bad[0]!r}, not a layer "
                             f"in 0..{self.num_layers - 1}")
        for key in ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads",
                    "num_query_groups", "max_position_embeddings", "moe_layer_freq"):
            _positive(where, key, getattr(self, key))
        if self.head_dim is not None:
            _positive(where, "head_dim", self.head_dim)
        elif self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{where}: hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads} (set head_dim)")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"{where}: num_attention_heads={self.num_attention_heads} is not divisible by "
                             f"num_query_groups={self.num_query_groups}")
        if self.rope_theta <= 0:
            raise ValueError(f"{where}: rope_theta={self.rope_theta} must be > 0")
        if self.rope_scaling:
            from scalerl_mega.model.rope import scaling_of

            scaling_of(self).validate(where)
        if self.norm_eps <= 0:
            raise ValueError(f"{where}: norm_eps={self.norm_eps} must be > 0")
        if self.num_experts < 0:
            raise ValueError(f"{where}: num_experts={self.num_experts} must be >= 0")
        if self.is_moe:
            if not 1 <= self.moe_topk <= self.num_experts:
                raise ValueError(f"{where}: moe_topk={self.moe_topk} must be in [1, num_experts={self.num_experts}]")
            _choice(where, "moe_router_score_function", self.moe_router_score_function, SCORE_FUNCTIONS)
            _choice(where, "moe_router_load_balancing_type", self.moe_router_load_balancing_type, LOAD_BALANCING)
            if self.moe_topk == 1 and not self.moe_router_pre_softmax and self.moe_router_score_function == "softmax":
                raise ValueError(f"{where}: moe_topk=1 with moe_router_pre_softmax=False: top-1 softmax routing "
                                 "needs moe_router_pre_softmax=True (Megatron refuses it otherwise)")
            if self.moe_apply_probs_on_input and self.moe_topk != 1:
                raise ValueError(f"{where}: moe_apply_probs_on_input=True needs moe_topk=1 (got {self.moe_topk})")
            if self.shared_expert_ffn < 0:
                raise ValueError(f"{where}: shared_expert_ffn={self.shared_expert_ffn} must be >= 0")
        from scalerl_mega.model.deepseek import validate_deepseek

        validate_deepseek(self, where)
        from scalerl_mega.model.hybrid import validate_hybrid

        validate_hybrid(self, where)
        features = self.llama4_features()
        if features and self.arch != "llama4":
            raise ValueError(f"{where}: {features[0]} is a Llama-4 feature but arch={self.arch!r} "
                             "(set arch: llama4)")
        if self.no_rope_freq < 0 or self.attention_chunk_size < 0:
            raise ValueError(f"{where}: no_rope_freq={self.no_rope_freq} / attention_chunk_size="
                             f"{self.attention_chunk_size} must be >= 0")
        return self

    # --- analytic sizes (no torch) ---
    def num_params(self) -> dict[str, int]:
        """Parameter counts: `total` and `active` (per token: shared + top-k routed experts).

        Counted from the shapes: embedding V*h (+ output layer unless tied), per layer the attention
        (q: h*H*d, k/v: h*G*d each, o: H*d*h, two RMSNorm weights h) and either a SwiGLU MLP
        (3*h*f) or a MoE block (router h*E, E routed SwiGLU experts 3*h*f_e, shared 3*h*f_s), final norm h.
        """
        from scalerl_mega.model.deepseek import mla_attention_params
        from scalerl_mega.model.hybrid import gated_attention_extra_params, gdn_params, linear_layers

        h, d = self.hidden_size, self.kv_channels
        heads, groups = self.num_attention_heads, self.num_query_groups
        attn = h * heads * d + 2 * h * groups * d + heads * d * h + 2 * h + gated_attention_extra_params(self)
        if self.is_mla:
            attn = mla_attention_params(self) + 2 * h
        if self.qk_layernorm:
            attn += 2 * d
        gdn, linear = gdn_params(self) + 2 * h, linear_layers(self)
        shared = 3 * h * self.shared_expert_ffn + (h if self.moe_shared_expert_gate else 0)
        dense_mlp = 3 * h * self.ffn_hidden_size
        expert = 3 * h * self.expert_ffn
        total = active = 0
        for layer in range(self.num_layers):
            mixer = gdn if layer in linear else attn
            total += mixer
            active += mixer
            if self.is_moe_layer(layer):
                total += h * self.num_experts + self.num_experts * expert + shared
                active += h * self.num_experts + self.moe_topk * expert + shared
            else:
                total += dense_mlp
                active += dense_mlp
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2) + h
        return {"total": total + embed, "active": active + embed}


@dataclass(kw_only=True)
class ParallelConfig:
    """Parallel layout, two views of one world (Megatron-Core's dense and expert process grids).

    Dense layers: world = tp * cp * pp * dp (dp derived). Expert (MoE) layers: world = etp * ep * pp *
    edp (edp, the expert data-parallel size, derived). Expert tensor parallelism `etp` is its own
    size: Megatron would default it to `tp`, which for Scout (tp 4, ep 16 on 16 GPUs) gives
    4 * 16 = 64 > 16 and the layout cannot initialise; with ep > 1 the default here is 1 (experts
    unsplit), with ep == 1 it stays tp (`expert_tp`).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: Optional[int] = None
    """Expert tensor-parallel size (Megatron `expert_tensor_parallel_size`). None: 1 (whole experts per
    rank) when ep > 1, else tp (see `expert_tp`)."""
    cp: int = 1
    """Context-parallel size (Megatron `context_parallel_size`); counted in the dense layout."""
    sequence_parallel: Optional[bool] = None
    """None: on exactly when tp > 1 and the model is MoE (Megatron refuses MoE + TP without it);
    True/False: as given (False with MoE + TP is refused by `validate`)."""
    moe_token_dispatcher: str = "alltoall"
    micro_batch_size: int = 1
    backend: str = "auto"
    """"auto" (nccl with CUDA, gloo without), "gloo" or "nccl"."""

    def expert_tp(self) -> int:
        """Resolved `etp`. With ep == 1 Megatron-Core 0.16.1 marks expert weights as dense parameters
        (`allreduce = not (is_expert and expert_model_parallel_size > 1)`), reduced over the dense DP
        group only; experts replicated over TP (etp < tp) would then never sum the gradients of
        their different tokens, so ep == 1 needs etp == tp (the default there)."""
        if self.etp is not None:
            return self.etp
        return 1 if self.ep > 1 else self.tp

    def sequence_parallel_on(self, model: Optional[ModelConfig] = None) -> bool:
        """Resolved sequence parallelism (see `sequence_parallel`)."""
        if self.sequence_parallel is not None:
            return bool(self.sequence_parallel)
        return self.tp > 1 and model is not None and model.is_moe

    def dp(self, world_size: int) -> int:
        """Dense data-parallel size: world_size / (tp * cp * pp)."""
        return self._quotient(world_size, ("tp", "cp", "pp"))

    def edp(self, world_size: int) -> int:
        """Expert data-parallel size: world_size / (etp * ep * pp)."""
        return self._quotient(world_size, ("etp", "ep", "pp"))

    def _quotient(self, world_size: int, keys: tuple[str, ...]) -> int:
        sizes = [self.expert_tp() if k == "etp" else getattr(self, k) for k in keys]
        product = 1
        for size in sizes:
            product *= size
        if world_size % product:
            raise ValueError(f"parallel: world_size={world_size} is not divisible by {'*'.join(keys)}="
                             f"{'*'.join(map(str, sizes))}={product} "
                             f"(keys {', '.join('parallel.' + k for k in keys)})")
        return world_size // product

    def validate(self, model: Optional[ModelConfig] = None, *, world_size: Optional[int] = None) -> "ParallelConfig":
        where = "parallel"
        for key in ("tp", "pp", "ep", "cp", "micro_batch_size"):
            _positive(where, key, getattr(self, key))
        if self.etp is not None:
            _positive(where, "etp", self.etp)
        etp = self.expert_tp()
        _choice(where, "moe_token_dispatcher", self.moe_token_dispatcher, DISPATCHERS)
        _choice(where, "backend", self.backend, ("auto", "gloo", "nccl"))
        if self.sequence_parallel and self.tp == 1:
            raise ValueError(f"{where}: sequence_parallel=True needs tp > 1 (tp={self.tp})")
        if world_size is not None:
            self.dp(world_size)
            self.edp(world_size)
        if model is None:
            return self
        m = model
        if m.num_attention_heads % self.tp:
            raise ValueError(f"{where}: tp={self.tp} does not divide model.num_attention_heads={m.num_attention_heads}")
        if m.num_query_groups % self.tp:
            raise ValueError(f"{where}: tp={self.tp} does not divide model.num_query_groups={m.num_query_groups}")
        from scalerl_mega.model.deepseek import validate_mla_layout

        validate_mla_layout(m, tp=self.tp, where=where)
        from scalerl_mega.model.hybrid import validate_hybrid_layout

        validate_hybrid_layout(m, tp=self.tp, cp=self.cp, where=where)
        if m.vocab_size % self.tp:
            raise ValueError(f"{where}: tp={self.tp} does not divide model.vocab_size={m.vocab_size}")
        if m.num_layers % self.pp:
            raise ValueError(f"{where}: pp={self.pp} does not divide model.num_layers={m.num_layers}")
        if self.ep > 1 and not m.is_moe:
            raise ValueError(f"{where}: ep={self.ep} > 1 but model '{m.name}' is dense (num_experts=0)")
        if self.etp is not None and self.etp > 1 and not m.is_moe:
            raise ValueError(f"{where}: etp={self.etp} > 1 but model '{m.name}' is dense (num_experts=0)")
        if m.is_moe and self.ep == 1 and etp != self.tp:
            raise ValueError(f"{where}: etp={etp} with ep=1 and tp={self.tp}: with ep=1 Megatron reduces expert "
                             "gradients over the dense data-parallel group only, so experts replicated over TP "
                             "would never sum theirs; set parallel.etp to parallel.tp (or leave it unset) or ep > 1")
        if m.is_moe and m.num_experts % self.ep:
            raise ValueError(f"{where}: ep={self.ep} does not divide model.num_experts={m.num_experts}")
        if m.is_moe and etp > 1 and m.expert_ffn % etp:
            raise ValueError(f"{where}: etp={etp} does not divide the expert width {m.expert_ffn} "
                             "(model.moe_ffn_hidden_size)")
        if m.is_moe and self.tp > 1 and not self.sequence_parallel_on(m):
            raise ValueError(f"{where}: MoE with tp={self.tp} needs sequence_parallel=True "
                             "(Megatron refuses MoE + TP without SP in training)")
        return self


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW with linear warmup then constant LR (paper App. A.3: lr 5e-7, eps 1e-15, wd 0.01, 100 warmup)."""

    lr: float = 5e-7
    warmup_steps: int = 100
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-15
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    """Global grad-norm clip; 0 disables."""
    use_distributed_optimizer: Optional[bool] = None
    """Megatron's distributed optimizer (FP32 main params and Adam moments sharded over DP).
    None: on when the data-parallel size is > 1."""
    overlap_grad_reduce: bool = False
    """Overlap the DP gradient reduce-scatter/all-reduce with the backward pass (Megatron DDP)."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the next forward."""
    checkpoint_format: str = "dp_reshardable"
    """How checkpoints store the distributed optimizer's state: "dp_reshardable" (flat buffers, fully
    parallel, resumable under another DP size only) or "fully_reshardable" (model space, gathered on
    each DP rank 0 at save: resumable under any TP/PP/EP/DP layout). trainer/megatron/checkpoint.py."""
    seed: int = 1234

    def distributed_optimizer_on(self, dp: int) -> bool:
        """Resolved `use_distributed_optimizer` for data-parallel size `dp`."""
        return dp > 1 if self.use_distributed_optimizer is None else bool(self.use_distributed_optimizer)

    def lr_at(self, step: int) -> float:
        """LR for optimizer step `step` (0-based): lr*(step+1)/warmup_steps during warmup, then lr."""
        if self.warmup_steps <= 0 or step >= self.warmup_steps:
            return self.lr
        return self.lr * (step + 1) / self.warmup_steps

    def validate(self) -> "OptimConfig":
        where = "optim"
        if not self.lr > 0:
            raise ValueError(f"{where}.lr={self.lr} must be > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"{where}.warmup_steps={self.warmup_steps} must be >= 0")
        for key in ("adam_beta1", "adam_beta2"):
            v = getattr(self, key)
            if not 0 <= v < 1:
                raise ValueError(f"{where}.{key}={v} must be in [0, 1)")
        if not self.adam_eps > 0:
            raise ValueError(f"{where}.adam_eps={self.adam_eps} must be > 0")
        if self.weight_decay < 0 or self.clip_grad < 0:
            raise ValueError(f"{where}.weight_decay={self.weight_decay} and clip_grad={self.clip_grad} must be >= 0")
        if self.checkpoint_format not in ("dp_reshardable", "fully_reshardable"):
            raise ValueError(f"{where}.checkpoint_format={self.checkpoint_format!r} must be 'dp_reshardable' or "
                             "'fully_reshardable'")
        if self.overlap_param_gather and self.use_distributed_optimizer is False:
            raise ValueError(f"{where}.overlap_param_gather=True needs the distributed optimizer "
                             "(use_distributed_optimizer is False)")
        return self


PARAMS_DTYPES = ("float32", "bfloat16")
RECOMPUTE = ("none", "selective", "full")


@dataclass(kw_only=True)
class MegatronConfig:
    """Everything the Megatron trainer needs, validated together.

    Precision (paper Sec. 3.2; Megatron mixed precision): `params_dtype` bfloat16 gives bf16
    parameters and activations (`Float16Module`), FP32 main weights and Adam moments in the
    optimizer (`OptimizerConfig(bf16=True)`), and gradients reduced in FP32 when
    `grad_reduce_in_fp32`. `model.fp32_lm_head` keeps the output layer + log-softmax FP32 on top.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    params_dtype: str = "float32"
    """Body parameter/activation dtype: float32 | bfloat16 (Hydra: `precision.params_dtype`)."""
    grad_reduce_in_fp32: bool = True
    """Accumulate and reduce gradients in an FP32 buffer (`main_grad`) even with bf16 params."""
    recompute: str = "none"
    """Activation recompute: none | selective (core attention) | full (every layer, uniform)."""
    routing_replay: str = "none"
    """MoE rollout routing replay (`moe.routing_replay`, trainer/megatron/routing.py): none | ids |
    ids_and_weights."""
    logit_temperature: float = 1.0
    """The generator's sampling temperature (`rollout.temperature`): RL log-probs are those of
    softmax(logits / T), the distribution the samples were drawn from and whose log-probs the engine
    returns, so every importance ratio compares like with like. SFT batches always use T=1."""

    @property
    def bf16(self) -> bool:
        return self.params_dtype == "bfloat16"

    @property
    def mixed_dtype_params(self) -> bool:
        """bf16 body with an FP32 output layer (`precision=fp32_head` on bf16 params)."""
        return self.bf16 and self.model.fp32_lm_head

    def distributed_optimizer(self, dp: int) -> bool:
        """Resolved `optim.use_distributed_optimizer`: None means on when dp > 1, and also at dp 1
        for mixed-dtype params (Megatron-Core 0.16.1's non-distributed `Float16OptimizerWithFloat16Params`
        cannot checkpoint FP32 params among bf16 ones: `sharded_state_dict` maps only its float16
        groups, KeyError on the FP32 head). At dp 1 the distributed optimizer holds the same bytes."""
        if self.optim.use_distributed_optimizer is None and self.mixed_dtype_params:
            return True
        return self.optim.distributed_optimizer_on(dp)

    def validate(self, *, world_size: Optional[int] = None) -> "MegatronConfig":
        self.model.validate()
        self.parallel.validate(self.model, world_size=world_size)
        self.optim.validate()
        _choice("precision", "params_dtype", self.params_dtype, PARAMS_DTYPES)
        _choice("train", "recompute", self.recompute, RECOMPUTE)
        if not self.logit_temperature > 0:
            raise ValueError(f"rollout.temperature={self.logit_temperature!r} must be > 0 (the trainer's logit "
                             "temperature)")
        _choice("moe", "routing_replay", self.routing_replay, ("none", "ids", "ids_and_weights"))
        if self.routing_replay != "none":
            if not self.model.is_moe:
                raise ValueError(f"moe: routing_replay={self.routing_replay!r} needs an MoE model (model "
                                 f"'{self.model.name}' is dense); use moe.routing_replay=none")
            if self.recompute == "full":
                raise ValueError(f"moe: routing_replay={self.routing_replay!r} with train.recompute='full': the "
                                 "recomputed routers would need Megatron's REPLAY_BACKWARD queue; use "
                                 "train.recompute=selective or none")
            if self.parallel.cp > 1:
                raise ValueError(f"moe: routing_replay={self.routing_replay!r} with parallel.cp="
                                 f"{self.parallel.cp}: context-parallel token layouts are not mapped; use cp=1")
        if self.mixed_dtype_params and self.optim.use_distributed_optimizer is False:
            raise ValueError("optim: use_distributed_optimizer=False with bf16 params and the FP32 head "
                             "(precision.params_dtype=bfloat16, model.fp32_lm_head=True): Megatron's "
                             "non-distributed mixed-precision optimizer cannot checkpoint the FP32 head; "
                             "leave it unset (null) or true")
        return self


def _positive(where: str, key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {key}={value!r} must be a positive integer")


def _choice(where: str, key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{where}: {key}={value!r} is not one of {list(allowed)}")


def model_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> ModelConfig:
    """Build a ModelConfig from a mapping; unknown keys raise ValueError naming the key and source."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in data:
        if key not in known:
            raise ValueError(f"{source}: unknown model key {key!r}")
    return ModelConfig(**data)


def load_model_preset(name: str, *, overrides: Optional[dict[str, Any]] = None,
                      conf_dir: Optional[Path] = None) -> ModelConfig:
    """Read `conf/model/<name>.yaml` (plain YAML via omegaconf), apply overrides, validate."""
    from omegaconf import OmegaConf

    directory = Path(conf_dir) if conf_dir is not None else _conf_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise ValueError(f"model preset {name!r} not found: no file {path} (known: {known})")
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(data).__name__}")
    bases = [b for b in data.pop("defaults", []) if b != "_self_"]  # a preset on another (conf/model/demo_moe.yaml)
    for base in bases:
        data = {**dataclasses.asdict(load_model_preset(base, conf_dir=directory)), **data}
    data.setdefault("name", name)
    data.update(overrides or {})
    return model_from_dict(data, source=str(path)).validate()
