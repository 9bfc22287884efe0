"""Load converted weights into a live, TP/PP/EP-sharded Megatron ``GPTModel`` on this rank.

Every rank reads only the full tensors of its own parameters (one at a time), re-pads the
vocabulary to the model's size and copies its TP/EP shard. Works for any checkpoint layout.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from scalerl_mega.convert import layout, sharding, tables
from scalerl_mega.convert.dims import ArchDims

log = logging.getLogger(__name__)


def unwrap(model):
    """GPTModel chunks from a model, a DDP-wrapped model or a list of them."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    out = []
    for m in chunks:
        while hasattr(m, "module") and not hasattr(m, "decoder"):
            m = m.module
        out.append(m)
    return out


def rank_offsets(gpt, *, num_experts: int) -> tuple[int, int]:
    """(global index of this chunk's first layer, global index of this rank's first expert)."""
    from megatron.core import parallel_state as ps

    layers = gpt.decoder.layers
    layer_offset = layers[0].layer_number - 1 if len(layers) else 0
    ep = ps.get_expert_model_parallel_world_size() if num_experts else 1
    expert_offset = ps.get_expert_model_parallel_rank() * (num_experts // ep) if num_experts else 0
    return layer_offset, expert_offset


def global_params(gpt, dims: ArchDims) -> dict[str, torch.nn.Parameter]:
    """This rank's parameters under their global table names (deterministic, model order)."""
    layer_offset, expert_offset = rank_offsets(gpt, num_experts=dims.num_experts)
    return {sharding.to_global_name(n, layer_offset=layer_offset, expert_offset=expert_offset): p for n, p in gpt.named_parameters()}


def _tp(is_expert: bool) -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    if is_expert:
        return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def load_full_tensors(model, *, dims: ArchDims, full_tensor: Callable[[str], torch.Tensor]) -> list[str]:
    """Copy ``full_tensor(global_name)`` (unsharded, any vocab padding) into this rank's parameters.
    Returns the global names loaded; raises ValueError naming a tensor whose shard shape differs."""
    loaded = []
    for gpt in unwrap(model):
        for name, param in global_params(gpt, dims).items():
            source = name
            if name == "output_layer.weight" and dims.tie_word_embeddings:
                source = "embedding.word_embeddings.weight"  # last-stage copy of tied embeddings
            full = full_tensor(source)
            rank, size = _tp(sharding.expert_index(name) is not None)
            if name.endswith(("word_embeddings.weight", "output_layer.weight")):
                full = layout.pad_vocab(layout.unpad_vocab(full, vocab=dims.vocab_size), padded_vocab=param.shape[0] * size)
            shard = sharding.tp_shard(name, full, rank=rank, size=size)
            if tuple(shard.shape) != tuple(param.shape):
                raise ValueError(f"tensor {name!r}: checkpoint shard has shape {tuple(shard.shape)}, model parameter has {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(shard)
            loaded.append(name)
    return loaded


def load_megatron_checkpoint(model, ckpt_dir: str, *, dims: ArchDims | None = None) -> list[str]:
    """Load a converter checkpoint (``tools/convert_hf_to_megatron.py`` output, any layout)."""
    from scalerl_mega.convert.megatron_ckpt import MegatronShards

    ck = MegatronShards(ckpt_dir, expect_arch=dims.arch if dims else None)
    if dims is not None and dims != ck.dims:
        diff = [f.name for f in ck.dims.__dataclass_fields__.values() if getattr(ck.dims, f.name) != getattr(dims, f.name)]
        raise ValueError(f"{ckpt_dir}: checkpoint config differs from the model in {diff[0]!r}: "
                         f"{getattr(ck.dims, diff[0])!r} (checkpoint) vs {getattr(dims, diff[0])!r} (model)")
    return load_full_tensors(model, dims=ck.dims, full_tensor=ck.full_tensor)


def load_hf_checkpoint(model, hf_dir: str, *, dims: ArchDims | None = None) -> list[str]:
    """Load an HF checkpoint directly (each rank converts only the groups it needs). Either layout
    (``convert.hf_layout``): of a multimodal ``Llama4ForConditionalGeneration`` checkpoint the text
    model under ``language_model.`` is loaded and the vision tower is logged and skipped."""
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.hf_layout import read_layout
    from scalerl_mega.convert.pipeline import validate_hf
    from scalerl_mega.convert.st_io import SafetensorsDir

    hf = read_layout(hf_dir)
    hf_dims = dims_from_hf_config(hf.text_config, where=f"{hf_dir}/config.json")
    if dims is not None and dims != hf_dims:
        raise ValueError(f"{hf_dir}: HF config does not match the model ({hf_dims} vs {dims})")
    src = SafetensorsDir(hf_dir)
    non_text = validate_hf(src, hf_dims, hf)
    if non_text:
        log.info("%s: %s checkpoint; skipping its %d non-text tensors (vision tower, projector)", hf_dir,
                 hf.kind, len(non_text))
    by_name = {n: g for g in tables.iter_groups(hf_dims) for n in g.mcore}
    recent: list[tuple[tables.Group, dict[str, torch.Tensor]]] = []  # the last two groups only

    def full_tensor(name: str) -> torch.Tensor:
        group = by_name[name]
        for g, tensors in recent:
            if g is group:
                return tensors[name]
        converted = dict(tables.hf_to_mcore(group, [src.get(hf.hf_name(n)) for n in group.hf], dims=hf_dims,
                                            padded_vocab=hf_dims.vocab_size))
        recent.append((group, converted))
        del recent[:-2]  # experts interleave fc1/fc2 groups; bounded memory
        return converted[name]

    return load_full_tensors(model, dims=hf_dims, full_tensor=full_tensor)
