"""A trainer rank's Megatron parameters under the conversion tables' global names (convert/sharding.py):
used by the weight export to the generators and by the checkpoint loaders of convert/."""

from __future__ import annotations

import torch

from scalerl_mega.convert import sharding
from scalerl_mega.convert.dims import ArchDims
from scalerl_mega.trainer.megatron.models import unwrap_gpt


ADAPTER = "lora"
"""Attribute (child module) name of a LoRA adapter on an adapted linear (trainer/megatron/lora.py)."""


def is_adapter_param(name: str) -> bool:
    """A parameter name (local or global) of a LoRA adapter: not a model weight."""
    return f".{ADAPTER}.lora_" in name


def unwrap(model):
    """GPTModel chunks from a model, a DDP-wrapped model or a list of them."""
    return [unwrap_gpt(m) for m in (model if isinstance(model, (list, tuple)) else [model])]


def rank_offsets(gpt, *, num_experts: int) -> tuple[int, int]:
    """(global index of this chunk's first layer, global index of this rank's first expert)."""
    from megatron.core import parallel_state as ps

    layers = gpt.decoder.layers
    layer_offset = layers[0].layer_number - 1 if len(layers) else 0
    ep = ps.get_expert_model_parallel_world_size() if num_experts else 1
    expert_offset = ps.get_expert_model_parallel_rank() * (num_experts // ep) if num_experts else 0
    return layer_offset, expert_offset


def global_params(gpt, dims: ArchDims) -> dict[str, torch.nn.Parameter]:
    """This rank's parameters under their global table names (deterministic, model order), and the routers'
    score-correction biases (DeepSeek-V3 `router.expert_bias`, a buffer: loaded and exported like a weight).
    LoRA adapters (`peft=lora`) are not model weights: left out (trainer/megatron/lora_export.py exports them)."""
    layer_offset, expert_offset = rank_offsets(gpt, num_experts=dims.num_experts)
    tensors = [(n, p) for n, p in gpt.named_parameters() if not is_adapter_param(n)]
    tensors += [(n, b) for n, b in gpt.named_buffers() if n.endswith(".router.expert_bias") and b is not None]
    return {sharding.to_global_name(n, layer_offset=layer_offset, expert_offset=expert_offset): p for n, p in tensors}
