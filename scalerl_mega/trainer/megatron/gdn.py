"""Megatron-Core models of the hybrid Gated DeltaNet families (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) in a local spec.

megatron-core ships `GatedDeltaNet` (0.16.1: `ssm/gated_delta_net.py`; 0.19.2: `ssm/gated_delta_net/{common,gdn}.py`)
but its stock specs are TransformerEngine-only and the layer refuses to build without the `fla` package
(flash-linear-attention), whose Triton kernels do not run on CPU. This module owns what the project needs instead:

- `with_gdn_layers`: the local GPT block with the GDN layers' self-attention slot holding `GatedDeltaNet`
  (in_proj a `ColumnParallelLinear` after the layer's own input norm, out_norm `gated_rms_norm()`, out_proj a
  `RowParallelLinear`), the other layers gated full attention (`attention_output_gate`), and every other RMSNorm
  zero-centred (`zero_centered_rms_norm()`: `(1 + w) * x / rms(x)`, as transformers' Qwen3NextRMSNorm).
- `kernels()`: "fla" (fla's chunked kernels) on CUDA with fla installed, else "torch": megatron's own
  `torch_chunk_gated_delta_rule` and `F.conv1d`, selected by `deterministic_mode=True` (`config_kwargs`), and
  `install_torch_fallback()` gives megatron's GDN module a torch `l2norm` and lets it build without fla. That
  patches megatron's module attributes only: nothing named `fla` is put in `sys.modules`, so transformers' own
  import-time probe for fla (its GDN models pick their kernels then) never sees a stand-in, whatever the import order.

fla is an optional GPU dependency (the `gdn` extra); nothing here imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.model.config import ModelConfig


def kernels(*, cuda: bool | None = None) -> str:
    """"fla" on CUDA with the fla package installed (found, not imported), else "torch" (the banner's words)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return "fla" if cuda and importlib.util.find_spec("fla") is not None else "torch"


def _gdn_module():
    """The megatron module whose globals hold `HAVE_FLA` and `l2norm` (0.19: `gated_delta_net.common`)."""
    try:
        return importlib.import_module("megatron.core.ssm.gated_delta_net.common")
    except ModuleNotFoundError:
        return importlib.import_module("megatron.core.ssm.gated_delta_net")


def torch_l2norm(x, dim: int = -1, eps: float = 1e-6):
    """fla's `l2norm` in torch: x / sqrt(sum(x^2) + eps) (transformers' `l2norm` in modeling_qwen3_5.py)."""
    import torch

    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def install_torch_fallback() -> None:
    """Let megatron's GDN layer build and run on the torch path (module docstring); a no-op under "fla"."""
    if kernels() == "fla":
        return
    mod = _gdn_module()
    mod.l2norm = torch_l2norm
    mod.HAVE_FLA = True


def config_kwargs(model: "ModelConfig") -> dict[str, Any]:
    """TransformerConfig fields of a hybrid model: the GDN widths, the gated attention, the gated shared expert;
    `deterministic_mode` selects megatron's torch GDN kernels (only the embedding lookup changes besides: an
    indexed gather instead of `F.embedding`, the same values).

    `hetereogenous_dist_checkpoint` (megatron's spelling) keys each layer's checkpoint tensors by its global layer
    number (`decoder.layers.{i}.*`) instead of stacking every layer's tensor along a leading layer axis: only some
    layers are GDN, so a stacked `self_attention.dt_bias` would cover some of the axis's rows and dist-checkpointing
    refuses the save. Megatron sets the same for its own hybrids, whose layer pattern (`linear_attention_freq`)
    this local spec does not use."""
    return dict(linear_conv_kernel_dim=model.linear_conv_kernel_dim, linear_key_head_dim=model.linear_key_head_dim,
                linear_value_head_dim=model.linear_value_head_dim, linear_num_key_heads=model.linear_num_key_heads,
                linear_num_value_heads=model.linear_num_value_heads, attention_output_gate=True,
                deterministic_mode=kernels() == "torch", hetereogenous_dist_checkpoint=True)


@functools.lru_cache(maxsize=None)
def zero_centered_rms_norm() -> type:
    """RMSNorm with a zero-centred scale: `(1 + w) * x / sqrt(mean(x^2) + eps)` computed in FP32 and cast back
    (transformers' Qwen3NextRMSNorm / Qwen3_5RMSNorm; the stored `w` starts at 0 and converts unchanged). The
    weight is tagged `sequence_parallel` like the project's other local norms (cpu_compat.SequenceParallelTorchNorm)."""
    import torch

    class ZeroCenteredRMSNorm(torch.nn.Module):
        def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
            self.weight.sequence_parallel = bool(config.sequence_parallel)

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (1.0 + self.weight.float())).type_as(x)

    return ZeroCenteredRMSNorm


@functools.lru_cache(maxsize=None)
def gated_rms_norm() -> type:
    """The GDN output norm (before the silu(z) gate, which megatron applies): a plain RMSNorm over each value head,
    `w * (x / rms(x))` (transformers' Qwen3_5RMSNormGated). Each TP rank normalises its own value heads with the
    one replicated weight, so the weight's gradient is the sum over TP ranks: the weight passes through
    `copy_to_tensor_model_parallel_region` (identity forward, all-reduce backward)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

    class GatedRMSNorm(torch.nn.Module):
        def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))

        def forward(self, x):
            w = self.weight
            if ps.get_tensor_model_parallel_world_size() > 1:
                w = copy_to_tensor_model_parallel_region(w)
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return w * h.to(x.dtype)

    return GatedRMSNorm


def gdn_layer_spec():
    """`GatedDeltaNet` in the local spec (its input norm is the layer's `input_layernorm`)."""
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec

    return ModuleSpec(module=GatedDeltaNet, submodules=GatedDeltaNetSubmodules(
        in_proj=ColumnParallelLinear, out_norm=gated_rms_norm(), out_proj=RowParallelLinear))


def with_gdn_layers(block, model: "ModelConfig", tcfg):
    """This pipeline stage's local block spec `block` (zero-centred norms already in place: models.layer_spec) with
    `GatedDeltaNet` in the self-attention slot of the GDN layers; the others keep their gated attention."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from scalerl_mega.model.hybrid import linear_layers

    install_torch_fallback()
    offset, linear, gdn = get_transformer_layer_offset(tcfg), set(linear_layers(model)), gdn_layer_spec()
    specs = [dataclasses.replace(s, submodules=dataclasses.replace(s.submodules, self_attention=gdn))
             if offset + j in linear else s for j, s in enumerate(block.layer_specs)]
    return dataclasses.replace(block, layer_specs=specs)
