"""How each Megatron tensor is split over tensor/expert/pipeline parallel ranks (pure functions).

Global names (see ``tables``) use global layer and expert indices. ``to_global_name`` /
``to_local_name`` translate the names of a live local-spec ``GPTModel`` on one rank
(``decoder.layers.{local}.mlp.experts.local_experts.{local_e}.linear_fc1.weight``) and the
TransformerEngine spellings (fused ``layer_norm_weight``, grouped ``weight{e}``).
"""

from __future__ import annotations

import re

import torch

REPLICATED, DIM0, DIM1, GLU, SECTIONS = "replicated", "dim0", "dim1", "glu", "sections"

_TP_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(word_embeddings|output_layer)\.weight$"), DIM0),  # vocab-parallel
    (re.compile(r"linear_qkv\.weight$"), DIM0),  # column-parallel; query groups split evenly
    (re.compile(r"linear_(q|q_down|q_up|kv_down|kv_up)_proj\.weight$"), DIM0),  # MLA (local spec: column-parallel)
    (re.compile(r"linear_fc1\.weight\d*$"), GLU),  # column-parallel, gate and up halves split alike
    (re.compile(r"(linear_proj|linear_fc2)\.weight\d*$"), DIM1),  # row-parallel
    # Gated DeltaNet (convert/gdn_layout.py): in_proj [q, k, v, z, b, a] and conv1d [q, k, v] split per section
    (re.compile(r"self_attention\.(in_proj|conv1d)\.weight$"), SECTIONS),
    (re.compile(r"self_attention\.(A_log|dt_bias)$"), DIM0),
    (re.compile(r"self_attention\.out_proj\.weight$"), DIM1),
)

_EXPERT = re.compile(r"^(?P<pre>decoder\.layers\.\d+\.mlp\.experts\.)(?P<fc>linear_fc[12])\.weight(?P<e>\d+)$")
_LAYER = re.compile(r"^decoder\.layers\.(?P<l>\d+)\.(?P<rest>.*)$")
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(?P<e>\d+)\.(?P<fc>linear_fc[12])\.weight$")
_GROUPED_EXPERT = re.compile(r"^mlp\.experts\.(?P<fc>linear_fc[12])\.weight(?P<e>\d+)$")
_TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def tp_kind(name: str) -> str:
    for pattern, kind in _TP_RULES:
        if pattern.search(name):
            return kind
    return REPLICATED


def expert_index(name: str) -> int | None:
    m = _EXPERT.match(name)
    return int(m.group("e")) if m else None


def _sections(name: str, dims) -> list[int]:
    """Row sections of a GDN tensor (``dims``: the model's ``ArchDims``, which fixes them)."""
    if dims is None:
        raise ValueError(f"{name}: a Gated DeltaNet tensor is split per section; pass dims=")
    from scalerl_mega.convert.gdn_layout import conv_sections, in_proj_sections

    return in_proj_sections(dims) if ".in_proj." in name else conv_sections(dims)


def tp_shard(name: str, full: torch.Tensor, *, rank: int, size: int, dims=None) -> torch.Tensor:
    """The part of a full Megatron tensor held by TP rank ``rank`` of ``size`` (``dims``: needed for the
    Gated DeltaNet tensors split per section)."""
    kind = tp_kind(name)
    if size == 1 or kind == REPLICATED:
        return full
    if kind == SECTIONS:
        from scalerl_mega.convert.gdn_layout import shard_sections

        return shard_sections(full, _sections(name, dims), rank=rank, size=size)
    if kind == GLU:
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, size, 0)[rank], torch.chunk(up, size, 0)[rank]], 0).contiguous()
    dim = 0 if kind == DIM0 else 1
    if full.shape[dim] % size:
        raise ValueError(f"{name}: dim {dim} of shape {tuple(full.shape)} is not divisible by TP={size}")
    return torch.chunk(full, size, dim)[rank].contiguous()


def tp_merge(name: str, shards: list[torch.Tensor], *, dims=None) -> torch.Tensor:
    """Inverse of ``tp_shard`` given every rank's shard in rank order."""
    kind = tp_kind(name)
    if len(shards) == 1 or kind == REPLICATED:
        return shards[0]
    if kind == SECTIONS:
        from scalerl_mega.convert.gdn_layout import merge_sections

        return merge_sections(shards, _sections(name, dims))
    if kind == GLU:
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return torch.cat(shards, 0 if kind == DIM0 else 1)


def to_global_name(local: str, *, layer_offset: int, expert_offset: int) -> str:
    """Name of a live model parameter -> global table name."""
    m = _LAYER.match(local)
    if not m:
        return local
    layer = int(m.group("l")) + layer_offset
    rest = _TE_ALIASES.get(m.group("rest"), m.group("rest"))
    e = _LOCAL_EXPERT.match(rest) or _GROUPED_EXPERT.match(rest)
    if e:
        rest = f"mlp.experts.{e.group('fc')}.weight{int(e.group('e')) + expert_offset}"
    return f"decoder.layers.{layer}.{rest}"


def stage_layers(num_layers: int, *, pp: int, stage: int) -> range:
    """Layers of pipeline stage ``stage`` under an even split (Megatron's default without
    uneven-first/last settings)."""
    if num_layers % pp:
        raise ValueError(f"num_layers={num_layers} is not divisible by pipeline parallel size {pp}")
    n = num_layers // pp
    return range(stage * n, (stage + 1) * n)


def expert_owner(expert: int, *, num_experts: int, ep: int) -> int:
    if num_experts % ep:
        raise ValueError(f"num_experts={num_experts} is not divisible by expert parallel size {ep}")
    return expert // (num_experts // ep)
