"""The supported decoder architectures: one record each for everything that differs between them
outside the tensor tables (convert/tables.py holds the names and layouts, conf/model/ the presets).

Adding an architecture (docs/extending.md): a record here, its rule table in `convert.tables.TABLES`
(built from the shared attention/MLP rule pieces there), the config.json fields it adds in
`convert.dims` (`_ARCH_FIELDS`), and presets under conf/model/ with their published config.json
in tests/data/hf_configs/. Pure data: no torch, transformers or megatron import.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arch:
    name: str
    """`ModelConfig.arch` / `ArchDims.arch`."""
    model_type: str
    """`model_type` of the text model's Hugging Face config.json."""
    causal_lm: str
    """transformers causal-LM class (config.json `architectures`; the local engine's model)."""
    config_class: str
    """transformers config class (the local engine builds it from `model.hf_export` kwargs)."""
    moe: str
    """"never" (dense only), "optional" (dense and MoE layers) or "always" (at least one MoE layer)."""
    qk_layernorm: bool
    """A per-head RMSNorm on q and k before RoPE (Qwen3; Megatron `qk_layernorm`)."""
    router: str | None = None
    """Path of the MoE router inside an HF decoder layer (the engine records routes there)."""
    family: str
    """Human name used in messages."""


ARCHS: dict[str, Arch] = {
    a.name: a for a in (
        Arch(name="llama", model_type="llama", causal_lm="LlamaForCausalLM", config_class="LlamaConfig",
             moe="never", qk_layernorm=False, family="Llama-3"),
        Arch(name="llama4", model_type="llama4_text", causal_lm="Llama4ForCausalLM", config_class="Llama4TextConfig",
             moe="optional", qk_layernorm=False, router="feed_forward.router", family="Llama-4"),
        Arch(name="qwen3", model_type="qwen3", causal_lm="Qwen3ForCausalLM", config_class="Qwen3Config",
             moe="never", qk_layernorm=True, family="Qwen3"),
        Arch(name="qwen3_moe", model_type="qwen3_moe", causal_lm="Qwen3MoeForCausalLM",
             config_class="Qwen3MoeConfig", moe="always", qk_layernorm=True, router="mlp.gate", family="Qwen3-MoE"),
        Arch(name="deepseek_v3", model_type="deepseek_v3", causal_lm="DeepseekV3ForCausalLM",
             config_class="DeepseekV3Config", moe="always", qk_layernorm=False, router="mlp.gate",
             family="DeepSeek-V3"),
        Arch(name="qwen3_next", model_type="qwen3_next", causal_lm="Qwen3NextForCausalLM", config_class="Qwen3NextConfig",
             moe="always", qk_layernorm=True, router="mlp.gate", family="Qwen3-Next"),
        Arch(name="qwen3_5", model_type="qwen3_5_text", causal_lm="Qwen3_5ForCausalLM", config_class="Qwen3_5TextConfig",
             moe="never", qk_layernorm=True, family="Qwen3.5"),
        Arch(name="qwen3_5_moe", model_type="qwen3_5_moe_text", causal_lm="Qwen3_5MoeForCausalLM",
             config_class="Qwen3_5MoeTextConfig", moe="always", qk_layernorm=True, router="mlp.gate", family="Qwen3.5-MoE"),
    )
}
ARCH_BY_MODEL_TYPE: dict[str, str] = {a.model_type: a.name for a in ARCHS.values()}


def arch_of(name: str, *, where: str = "model") -> Arch:
    """The record of `name`; ValueError naming the known ones otherwise."""
    if name not in ARCHS:
        raise ValueError(f"{where}: arch={name!r} is not one of {list(ARCHS)}")
    return ARCHS[name]


def arch_of_model_type(model_type: str, *, where: str = "config.json") -> Arch:
    if model_type not in ARCH_BY_MODEL_TYPE:
        raise ValueError(f"{where}: model_type={model_type!r} is not supported; expected one of "
                         f"{sorted(ARCH_BY_MODEL_TYPE)}")
    return ARCHS[ARCH_BY_MODEL_TYPE[model_type]]

