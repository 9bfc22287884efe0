"""Checkpoint tensor names <-> the parameters of a transformers model (the local engine's, on load).

Weights travel under the names of the published checkpoints, which is what SGLang's loaders and the
converters read and write. transformers 5 fuses some of them on load: a Qwen3-MoE layer's routed experts
are one `mlp.experts.gate_up_proj` [E, 2F, H] (gate rows first) and one `mlp.experts.down_proj`
[E, H, F] parameter, while the checkpoint has `mlp.experts.{e}.gate_proj.weight` [F, H],
`...up_proj.weight` [F, H] and `...down_proj.weight` [H, F] per expert. `checkpoint_target` resolves a
checkpoint name to the parameter, or the view of a fused parameter, it loads into;
`checkpoint_manifest` lists the checkpoint names and shapes of a model as transformers itself writes
them (`save_pretrained`'s reverse conversion), so a weight update is checked against the checkpoint
format before anything is sent. `moe_layers` finds the MoE routers (where the engine records routes).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.weight_sync import WeightManifest

_EXPERT = re.compile(r"^(?P<pre>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def checkpoint_target(params: Mapping[str, "torch.Tensor"], name: str) -> "torch.Tensor | None":
    """The tensor checkpoint tensor `name` loads into: `params[name]`, or for a per-expert name the slice
    of the fused expert parameter (`gate` = first half of `gate_up_proj[e]`, `up` = second half,
    `down` = `down_proj[e]`); None when the model has neither."""
    if name in params:
        return params[name]
    m = _EXPERT.match(name)
    if m is None:
        return None
    fused = params.get(f"{m['pre']}.{'down_proj' if m['proj'] == 'down' else 'gate_up_proj'}")
    e = int(m["e"])
    if fused is None or fused.dim() != 3 or e >= fused.shape[0]:
        return None
    w = fused[e]
    if m["proj"] == "down":
        return w
    half = w.shape[0] // 2
    return w[:half] if m["proj"] == "gate" else w[half:]


def checkpoint_manifest(model: "torch.nn.Module", *, source: str) -> "WeightManifest":
    """The checkpoint names and shapes of `model` (a meta-device model is enough): its parameters as
    transformers' `save_pretrained` writes them (`revert_weight_conversion`, transformers >= 5), tied
    parameters as aliases of the name they share storage with."""
    import torch

    from scalerl_mega.weight_sync import TensorSpec, WeightManifest

    module = WeightManifest.of_module(model, source=source)
    state = {n: torch.empty(s.shape, device="meta") for n, s in module.specs.items()}
    reverted = _revert(model, state)
    if reverted is None or set(reverted) == set(state):
        return module
    return WeightManifest([TensorSpec(n, tuple(t.shape)) for n, t in reverted.items()], aliases=module.aliases,
                          source=f"{source}, checkpoint names")


def _revert(model: Any, state: dict) -> dict | None:
    """transformers' reverse weight conversion of `state`, or None where transformers has none (< 5)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # pragma: no cover - transformers 4: module names are the checkpoint names
        return None
    return dict(revert_weight_conversion(model, state))


def moe_layers(model: "torch.nn.Module") -> list[tuple[int, "torch.nn.Module"]]:
    """(layer index, router module) of the MoE layers of an HF causal LM, in layer order: the module at
    the architecture's router path (model/archs.py; HF Llama-4 `feed_forward.router`, Qwen3-MoE
    `mlp.gate`) of the layers that have one; [] if dense."""
    from scalerl_mega.model.archs import ARCH_BY_MODEL_TYPE, ARCHS

    arch = ARCH_BY_MODEL_TYPE.get(getattr(getattr(model, "config", None), "model_type", None))
    paths = [ARCHS[arch].router] if arch else [a.router for a in ARCHS.values()]  # unknown: any known path
    layers = getattr(getattr(model, "model", model), "layers", [])
    out = []
    for i, layer in enumerate(layers):
        for path in filter(None, paths):
            router = layer
            for part in path.split("."):
                router = getattr(router, part, None)
            if router is not None and hasattr(router, "top_k"):
                out.append((i, router))
                break
    return out


def moe_routers(model: "torch.nn.Module") -> list["torch.nn.Module"]:
    """The MoE router modules of an HF causal LM in layer order (`moe_layers`)."""
    return [router for _, router in moe_layers(model)]


ROUTER_BIAS = "e_score_correction_bias"
"""DeepSeek-V3's per-expert routing bias: a buffer in transformers (`DeepseekV3TopkRouter`), a weight of the
checkpoint (and a parameter in SGLang's `MoEGate`)."""


def expose_router_biases(model: "torch.nn.Module") -> "torch.nn.Module":
    """Turn each router's `e_score_correction_bias` buffer into a parameter without gradient (same tensor), so that
    the engine's manifest, weight loading and digests, which follow `named_parameters`, carry it like any other
    checkpoint tensor: the trainer pushes its (frozen) values and the engine routes with them."""
    import torch

    for module in model.modules():
        bias = module._buffers.get(ROUTER_BIAS) if hasattr(module, "_buffers") else None
        if bias is not None:
            del module._buffers[ROUTER_BIAS]
            module.register_parameter(ROUTER_BIAS, torch.nn.Parameter(bias, requires_grad=False))
    return model
