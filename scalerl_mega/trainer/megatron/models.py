"""Build Megatron-Core `GPTModel`s (Llama-style dense, Scout-style MoE) from a ModelConfig.

Local (non-TE) layer spec when TransformerEngine is absent (CPU), TE spec when it is importable.
Llama: RMSNorm, SwiGLU, RoPE, GQA, no biases. MoE: routed experts (top-k, SequentialMLP) plus an
optional shared expert. Llama-4-only attention features (NoPE layers, chunked attention,
temperature tuning, QK L2 norm) come from `llama4.llama4_layer_spec`, imported lazily.
The output layer computes logits in FP32 (paper Sec. 3.2, "FP32 Precision for LLM logits").
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from scalerl_mega.model.config import ModelConfig, ParallelConfig
from scalerl_mega.model.hybrid import is_hybrid

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from megatron.core.models.gpt import GPTModel


def te_available() -> bool:
    """True when TransformerEngine imports. Not installed: False. Installed but broken (its CUDA libraries
    missing: OSError, or an ImportError from inside the package): False, with a warning naming the error, so
    a GPU run that silently falls back to the local spec says why."""
    try:
        import transformer_engine  # noqa: F401
    except (ImportError, OSError) as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "transformer_engine"):
            logging.getLogger(__name__).warning("TransformerEngine does not import (%s): local layer spec", exc)
        return False
    return True


def recompute_kwargs(recompute: str) -> dict[str, Any]:
    """`train.recompute` -> Megatron TransformerConfig fields.

    selective: recompute core attention (softmax(QK^T)V, the s^2 terms; Korthikanti et al. 2022);
    full: recompute every layer from its input (`uniform`, one layer per checkpoint).
    """
    if recompute == "none":
        return {}
    if recompute == "selective":
        return dict(recompute_granularity="selective", recompute_modules=["core_attn"])
    if recompute == "full":
        return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    raise ValueError(f"train: recompute={recompute!r} is not one of ['none', 'selective', 'full']")


def transformer_config(model: ModelConfig, parallel: ParallelConfig, *, params_dtype: str = "float32",
                       recompute: str = "none"):
    """The Megatron `TransformerConfig` for this model and layout.

    `params_dtype` "bfloat16" sets `bf16=True` and bf16 `params_dtype`/`pipeline_dtype` (Megatron mixed
    precision; the model is then wrapped in `Float16Module`, see `wrap.py`); "float32" keeps FP32.
    """
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    from scalerl_mega.trainer.megatron.llama4 import no_rope_pattern

    on_cpu = not torch.cuda.is_available()
    bf16 = params_dtype == "bfloat16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    moe: dict[str, Any] = {}
    if model.is_moe:
        pattern = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
        freq: Any = 1 if all(pattern) else pattern  # Megatron's list form: 1 = MoE layer
        moe = dict(
            num_moe_experts=model.num_experts,
            moe_router_topk=model.moe_topk,
            moe_ffn_hidden_size=model.expert_ffn,
            moe_shared_expert_intermediate_size=model.shared_expert_ffn or None,
            moe_layer_freq=freq,
            moe_router_pre_softmax=model.moe_router_pre_softmax,
            moe_router_score_function=model.moe_router_score_function,
            moe_router_load_balancing_type=model.moe_router_load_balancing_type,
            moe_aux_loss_coeff=model.moe_aux_loss_coeff if model.moe_router_load_balancing_type != "none" else 0.0,
            moe_apply_probs_on_input=model.moe_apply_probs_on_input,
            moe_token_dispatcher_type=parallel.moe_token_dispatcher,
            moe_grouped_gemm=False,
            moe_router_dtype="fp32",
            # a RouterReplay per router (inactive until routing.RouteTracker sets an action), so
            # moe.routing_replay can replay the generator's routes (Megatron-Core 0.16.1 router_replay.py)
            moe_enable_routing_replay=True,
            moe_shared_expert_gate=model.moe_shared_expert_gate,  # Qwen3-Next / Qwen3.5: sigmoid-gated shared expert
        )
    fields = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        normalization="RMSNorm",
        layernorm_epsilon=model.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model.init_method_std,
        qk_layernorm=model.qk_layernorm,
        qk_l2_norm=bool(model.qk_l2_norm),  # megatron-core >= 0.19 refuses the spec's L2Norm without it
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        expert_model_parallel_size=parallel.ep,
        expert_tensor_parallel_size=parallel.expert_tp(),
        context_parallel_size=parallel.cp,
        sequence_parallel=parallel.sequence_parallel_on(model),
        bf16=bf16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=on_cpu,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        batch_p2p_sync=not on_cpu,  # the sync is torch.cuda.synchronize(); gloo p2p is synchronous
        no_rope_freq=no_rope_pattern(model) if model.arch == "llama4" else None,
        **recompute_kwargs(recompute),
        **moe,
    )
    return _config_for_arch(model, fields, TransformerConfig)


def _config_for_arch(model: ModelConfig, fields: dict[str, Any], config_class: type):
    """DeepSeek-V3: `MLATransformerConfig` with MLA's fields (its q_lora / kv_lora RMSNorms are the local spec's q/k
    norms under MLA) and the group-limited, bias-corrected router's (trainer/megatron/mla.py)."""
    if model.arch == "deepseek_v3":
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        from scalerl_mega.trainer.megatron.mla import mla_config_kwargs, router_kwargs

        config_class = MLATransformerConfig
        fields.update(mla_config_kwargs(model), qk_layernorm=True, **router_kwargs(model))
    if is_hybrid(model.arch):
        from scalerl_mega.trainer.megatron.gdn import config_kwargs

        fields.update(config_kwargs(model))
    return config_class(**fields)


def layer_spec(model: ModelConfig, tcfg, *, use_te: bool):
    """Transformer block/layer spec. Llama-4 features -> `llama4.llama4_layer_spec` (lazy import); the Gated
    DeltaNet hybrids -> zero-centred norms and `gdn.with_gdn_layers` (always local)."""
    if is_hybrid(model.arch):
        from megatron.core.models.gpt import gpt_layer_specs

        from scalerl_mega.trainer.megatron import gdn

        block = gpt_layer_specs.get_gpt_decoder_block_spec(tcfg, use_transformer_engine=False, normalization="RMSNorm")
        return gdn.with_gdn_layers(replace_in_spec(block, gpt_layer_specs.LNImpl, gdn.zero_centered_rms_norm()), model, tcfg)
    if model.arch == "llama4" and model.llama4_features():
        try:
            from scalerl_mega.trainer.megatron import llama4
        except ImportError as exc:
            raise NotImplementedError(
                f"model '{model.name}': Llama-4 feature {model.llama4_features()[0]} needs "
                "scalerl_mega.trainer.megatron.llama4.llama4_layer_spec, which is not available "
                f"({exc})") from exc
        spec = llama4.llama4_layer_spec(model, use_te)
    else:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        spec = get_gpt_decoder_block_spec(tcfg, use_transformer_engine=use_te, normalization="RMSNorm")
    if model.is_mla:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        from megatron.core.transformer.multi_latent_attention import MLASelfAttention

        from scalerl_mega.trainer.megatron.mla import build_fixes, mla_core_attention, mla_without_q_lora

        build_fixes(use_te)
        spec = replace_in_spec(spec, DotProductAttention, mla_core_attention())
        if not model.q_lora_rank:
            spec = replace_in_spec(spec, MLASelfAttention, mla_without_q_lora())
    if not use_te:
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        from scalerl_mega.trainer.megatron.cpu_compat import SequenceParallelTorchNorm

        spec = replace_in_spec(spec, WrappedTorchNorm, SequenceParallelTorchNorm)
    return spec


def replace_in_spec(spec: Any, old: type, new: type) -> Any:
    """Return a copy of a (nested) ModuleSpec / submodules dataclass with class `old` -> `new`."""
    if spec is old:
        return new
    if isinstance(spec, (list, tuple)):
        return type(spec)(replace_in_spec(s, old, new) for s in spec)
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: replace_in_spec(getattr(spec, f.name), old, new)
                   for f in dataclasses.fields(spec) if f.init}
        return dataclasses.replace(spec, **changes)
    return spec


def build_model(model: ModelConfig, parallel: ParallelConfig, *, use_te: bool | None = None,
                params_dtype: str = "float32", recompute: str = "none", on_meta: bool = False):
    """One `GPTModel` chunk for this pipeline stage (Megatron parallel state must be initialised).

    `on_meta`: the caller builds on the meta device (dry_run.py): no size limit, no `.cuda()`.
    Returns (model, transformer_config).
    """
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from scalerl_mega.model.rope import apply_rope_scaling

    model.validate()
    if use_te is None:
        use_te = te_available() and not is_hybrid(model.arch)  # the GDN hybrids have a local spec only
    if not torch.cuda.is_available() and not on_meta and model.num_params()["total"] > 5e9:
        raise ValueError(f"model '{model.name}': {model.num_params()['total'] / 1e9:.1f}B parameters is "
                         "built only on GPU (no CUDA here)")
    tcfg = transformer_config(model, parallel, params_dtype=params_dtype, recompute=recompute)
    spec = layer_spec(model, tcfg, use_te=use_te)
    gpt = GPTModel(
        config=tcfg,
        transformer_layer_spec=spec,
        vocab_size=model.vocab_size,
        max_sequence_length=model.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=model.tie_embeddings,
        position_embedding_type="none" if model.is_mla else "rope",  # MLA applies its own (YaRN) RoPE
        rotary_base=int(model.rope_theta),
        rotary_percent=float(model.partial_rotary_factor),  # Qwen3-Next / Qwen3.5 rotate the first quarter
        rope_scaling=False,  # Megatron fixes 3 of the 4 Llama-3 parameters; rope.apply_rope_scaling has all
    )
    apply_rope_scaling(gpt, model)
    if model.moe_router_expert_bias:
        from scalerl_mega.trainer.megatron.mla import freeze_expert_bias

        freeze_expert_bias(gpt)
    if torch.cuda.is_available() and not on_meta:
        gpt.cuda(torch.cuda.current_device())
    if model.fp32_lm_head:
        ensure_fp32_lm_head(gpt)
    return gpt, tcfg


def head_dtype(gpt):
    """dtype the logits come out in, which the log-softmax then runs in: float32 under `ensure_fp32_lm_head`
    (also with tied embeddings, whose shared weight is a bf16 body parameter that the hook upcasts), else the
    output layer's (the shared embedding's when tied): `bf16_head` with bf16 params gives bfloat16."""
    if not getattr(gpt, "post_process", False):
        return None
    layer = getattr(gpt, "output_layer", None)
    if getattr(layer, "_scalerl_fp32", False):
        import torch

        return torch.float32
    weight = getattr(layer, "weight", None) if layer is not None else None
    if weight is None and getattr(gpt, "share_embeddings_and_output_weights", False):
        weight = gpt.shared_embedding_or_output_weight()
    return None if weight is None else weight.dtype


def ensure_fp32_lm_head(gpt) -> None:
    """Keep the output layer in FP32 and feed it FP32 hidden states, so logits are FP32 even when
    the rest of the model runs in 16 bit (paper Sec. 3.2). A no-op for an all-FP32 model. Call it again
    after a `Float16Module` wrap (which casts every module to bf16): the layer goes back to FP32, the
    hook is registered once. Tied embeddings: the head's weight is the word embedding, a body parameter
    (on the last pipeline stage, Megatron's copy of it, kept equal to the first stage's and checkpointed
    under its key), so it keeps the body's dtype and the hook upcasts it: the logits are FP32 all the same."""
    import torch

    layer = getattr(gpt, "output_layer", None)
    if layer is None:
        return
    if not getattr(gpt, "share_embeddings_and_output_weights", False):
        layer.float()
    if getattr(layer, "_scalerl_fp32", False):
        return

    def upcast(module, args, kwargs):
        if args and torch.is_tensor(args[0]) and args[0].dtype != torch.float32:
            args = (args[0].float(), *args[1:])
        weight = kwargs.get("weight")
        if torch.is_tensor(weight) and weight.dtype != torch.float32:
            kwargs["weight"] = weight.float()
        return args, kwargs

    layer.register_forward_pre_hook(upcast, with_kwargs=True)
    layer._scalerl_fp32 = True


def unwrap_gpt(model: torch.nn.Module) -> GPTModel:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
