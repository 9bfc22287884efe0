"""Pure tensor layouts of the hybrid Gated DeltaNet families between Hugging Face and Megatron-Core (no I/O, no names).

Megatron's `GatedDeltaNet.in_proj` is one column-parallel projection whose output is, on every TP rank, that rank's
share of [q, k, v, z, b, a] (q/k: key heads x key dim; v and the output gate z: value heads x value dim; b and a: one
scalar per value head). Its full (TP-independent) tensor is therefore the plain concatenation of the six sections,
and a TP shard is the same slice of each section (`sections` below). Qwen3.5 stores the six as `in_proj_qkv` (q, k,
v concatenated), `in_proj_z`, `in_proj_b`, `in_proj_a`; Qwen3-Next fuses them per key head g as `in_proj_qkvz`
= [q_g, k_g, v_g, z_g] over g and `in_proj_ba` = [b_g, a_g] over g (transformers' `fix_query_key_value_ordering`),
where each key head owns r = value heads / key heads consecutive value heads.

Gated attention: HF `q_proj` yields per head [query (head_dim), gate (head_dim)]; Megatron's `linear_qkv` with
`attention_output_gate` is grouped per query group as [queries, gates, key, value] of the group.
"""

from __future__ import annotations

import torch


def gdn_sections(*, key_dim: int, value_dim: int, value_heads: int) -> list[int]:
    """Row counts of q, k, v, z, b, a in Megatron's `in_proj` (`key_dim` = key heads x key head dim, `value_dim` =
    value heads x value head dim)."""
    return [key_dim, key_dim, value_dim, value_dim, value_heads, value_heads]


def in_proj_sections(d) -> list[int]:
    """`gdn_sections` of an `ArchDims` `d`."""
    return gdn_sections(key_dim=d.linear_num_key_heads * d.linear_key_head_dim,
                        value_dim=d.linear_num_value_heads * d.linear_value_head_dim, value_heads=d.linear_num_value_heads)


def conv_sections(d) -> list[int]:
    """Rows of q, k, v in the GDN's depthwise `conv1d` weight."""
    return in_proj_sections(d)[:3]


def split_sections(full: torch.Tensor, sections: list[int]) -> list[torch.Tensor]:
    if sum(sections) != full.shape[0]:
        raise ValueError(f"tensor of {full.shape[0]} rows does not hold sections {sections}")
    return list(torch.split(full, sections, dim=0))


def shard_sections(full: torch.Tensor, sections: list[int], *, rank: int, size: int) -> torch.Tensor:
    """TP rank `rank`'s part: the `rank`-th of `size` equal slices of every section, concatenated."""
    bad = [s for s in sections if s % size]
    if bad:
        raise ValueError(f"section of {bad[0]} rows (of {sections}) is not divisible by TP={size}")
    return torch.cat([torch.chunk(p, size, 0)[rank] for p in split_sections(full, sections)], 0).contiguous()


def merge_sections(shards: list[torch.Tensor], sections: list[int]) -> torch.Tensor:
    """Inverse of `shard_sections` given every rank's shard in rank order."""
    size = len(shards)
    local = [s // size for s in sections]
    parts = [split_sections(s, local) for s in shards]
    return torch.cat([parts[r][i] for i in range(len(sections)) for r in range(size)], 0)


def split_in_proj_to_mcore(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` -> Megatron `in_proj` [q, k, v, z, b, a]."""
    return torch.cat([qkv, z, b, a], 0).contiguous()


def mcore_to_split_in_proj(in_proj: torch.Tensor, sections: list[int]) -> list[torch.Tensor]:
    q, k, v, z, b, a = split_sections(in_proj, sections)
    return [torch.cat([q, k, v], 0).contiguous(), z.contiguous(), b.contiguous(), a.contiguous()]


def fused_in_proj_to_mcore(qkvz: torch.Tensor, ba: torch.Tensor, *, key_heads: int, key_head_dim: int,
                           value_heads: int, value_head_dim: int) -> torch.Tensor:
    """Qwen3-Next's per-key-head `in_proj_qkvz` and `in_proj_ba` -> Megatron `in_proj` [q, k, v, z, b, a]."""
    r, hidden = value_heads // key_heads, qkvz.shape[-1]
    grouped = qkvz.reshape(key_heads, 2 * key_head_dim + 2 * r * value_head_dim, hidden)
    q, k, v, z = torch.split(grouped, [key_head_dim, key_head_dim, r * value_head_dim, r * value_head_dim], dim=1)
    b, a = torch.split(ba.reshape(key_heads, 2 * r, hidden), [r, r], dim=1)
    return torch.cat([t.reshape(-1, hidden) for t in (q, k, v, z, b, a)], 0).contiguous()


def mcore_to_fused_in_proj(in_proj: torch.Tensor, *, key_heads: int, key_head_dim: int, value_heads: int,
                           value_head_dim: int) -> list[torch.Tensor]:
    """Inverse of `fused_in_proj_to_mcore`: [`in_proj_qkvz`, `in_proj_ba`]."""
    hidden = in_proj.shape[-1]
    sections = gdn_sections(key_dim=key_heads * key_head_dim, value_dim=value_heads * value_head_dim,
                            value_heads=value_heads)
    q, k, v, z, b, a = (t.reshape(key_heads, -1, hidden) for t in split_sections(in_proj, sections))
    return [torch.cat([q, k, v, z], 1).reshape(-1, hidden).contiguous(), torch.cat([b, a], 1).reshape(-1, hidden).contiguous()]


def gated_qkv_to_mcore(q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_groups: int,
                       head_dim: int) -> torch.Tensor:
    """HF gated `q_proj` [nh * 2 * hd, H] (per head: query, gate), k/v [ng * hd, H] -> Megatron `linear_qkv`
    [ng * (2 * qpg + 2) * hd, H], per group [queries, gates, key, value]."""
    hidden = q_gate.shape[-1]
    heads = q_gate.shape[0] // (2 * head_dim)
    pairs = q_gate.reshape(heads, 2, head_dim, hidden)
    q = pairs[:, 0].reshape(num_groups, -1, hidden)
    gate = pairs[:, 1].reshape(num_groups, -1, hidden)
    return torch.cat([q, gate, k.reshape(num_groups, head_dim, hidden), v.reshape(num_groups, head_dim, hidden)],
                     1).reshape(-1, hidden).contiguous()


def mcore_to_gated_qkv(qkv: torch.Tensor, *, num_groups: int, head_dim: int, heads_per_group: int) -> list[torch.Tensor]:
    """Inverse of `gated_qkv_to_mcore`: [q_proj (query and gate per head), k_proj, v_proj]."""
    hidden = qkv.shape[-1]
    grouped = qkv.reshape(num_groups, (2 * heads_per_group + 2) * head_dim, hidden)
    q, gate, k, v = torch.split(grouped, [heads_per_group * head_dim] * 2 + [head_dim] * 2, dim=1)
    heads = num_groups * heads_per_group
    q_gate = torch.stack([q.reshape(heads, head_dim, hidden), gate.reshape(heads, head_dim, hidden)], 1)
    return [q_gate.reshape(-1, hidden).contiguous(), k.reshape(-1, hidden).contiguous(), v.reshape(-1, hidden).contiguous()]
