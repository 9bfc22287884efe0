"""Pure tensor layout transforms between Hugging Face and Megatron-Core weights (no I/O, no names).

Shapes: ``H`` hidden, ``F`` MLP width, ``nh`` query heads, ``ng`` key/value heads (query groups),
``qpg = nh // ng``, ``hd`` head dim, ``E`` experts, ``V`` vocab, ``P`` padded vocab.
"""

from __future__ import annotations

import torch


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_groups: int, head_dim: int) -> torch.Tensor:
    """q [nh*hd, H], k/v [ng*hd, H] -> Megatron linear_qkv [ng*(qpg+2)*hd, H], grouped per query group."""
    hidden = q.shape[-1]
    q_g = q.reshape(num_groups, -1, hidden)
    k_g = k.reshape(num_groups, head_dim, hidden)
    v_g = v.reshape(num_groups, head_dim, hidden)
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(-1, hidden).contiguous()


def split_qkv(qkv: torch.Tensor, *, num_groups: int, head_dim: int, heads_per_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_qkv``: Megatron linear_qkv -> (q [nh*hd, H], k [ng*hd, H], v [ng*hd, H])."""
    hidden = qkv.shape[-1]
    grouped = qkv.reshape(num_groups, (heads_per_group + 2) * head_dim, hidden)
    q, k, v = torch.split(grouped, [heads_per_group * head_dim, head_dim, head_dim], dim=1)
    return (
        q.reshape(-1, hidden).contiguous(),
        k.reshape(-1, hidden).contiguous(),
        v.reshape(-1, hidden).contiguous(),
    )


def _pair_to_half_index(head_dim: int) -> torch.Tensor:
    # rotate-half slot j < hd/2 takes complex-pair slot 2j; slot hd/2 + j takes 2j + 1.
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def rope_pairs_to_halves(w: torch.Tensor, *, head_dim: int) -> torch.Tensor:
    """Permute q/k projection rows per head from complex-pair RoPE order (HF Llama-4, dims (2i, 2i+1)
    rotate together) to rotate-half order (Megatron, dims (i, i + hd/2) rotate together).

    Attention scores are invariant when q and k are permuted alike, and the L2 norm and temperature
    scaling act per head vector, so the permuted Megatron model computes the same function.
    """
    idx = _pair_to_half_index(head_dim)
    rows = w.reshape(-1, head_dim, w.shape[-1])
    return rows[:, idx, :].reshape(w.shape).contiguous()


def rope_halves_to_pairs(w: torch.Tensor, *, head_dim: int) -> torch.Tensor:
    """Inverse of ``rope_pairs_to_halves``."""
    inv = torch.argsort(_pair_to_half_index(head_dim))
    rows = w.reshape(-1, head_dim, w.shape[-1])
    return rows[:, inv, :].reshape(w.shape).contiguous()


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate [F, H], up [F, H] -> Megatron SwiGLU linear_fc1 [2F, H] (first half goes through SiLU)."""
    return torch.cat([gate, up], dim=0).contiguous()


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()


def experts_gate_up_to_fc1(gate_up_EH2F: torch.Tensor) -> list[torch.Tensor]:
    """HF Llama-4 ``experts.gate_up_proj`` [E, H, 2F] (used as x @ W, gate = first F columns) ->
    E Megatron expert ``linear_fc1`` weights [2F, H]."""
    return [gate_up_EH2F[e].t().contiguous() for e in range(gate_up_EH2F.shape[0])]


def fc1_to_experts_gate_up(fc1s: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([w.t() for w in fc1s], dim=0).contiguous()


def experts_down_to_fc2(down_EFH: torch.Tensor) -> list[torch.Tensor]:
    """HF Llama-4 ``experts.down_proj`` [E, F, H] -> E Megatron expert ``linear_fc2`` weights [H, F]."""
    return [down_EFH[e].t().contiguous() for e in range(down_EFH.shape[0])]


def fc2_to_experts_down(fc2s: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([w.t() for w in fc2s], dim=0).contiguous()


def pad_vocab(w_VH: torch.Tensor, *, padded_vocab: int) -> torch.Tensor:
    """Append zero rows up to Megatron's padded vocabulary [P, H]."""
    vocab = w_VH.shape[0]
    if padded_vocab < vocab:
        raise ValueError(f"padded vocab {padded_vocab} < vocab {vocab}")
    if padded_vocab == vocab:
        return w_VH.contiguous()
    pad = torch.zeros((padded_vocab - vocab, *w_VH.shape[1:]), dtype=w_VH.dtype, device=w_VH.device)
    return torch.cat([w_VH, pad], dim=0)


def unpad_vocab(w_PH: torch.Tensor, *, vocab: int) -> torch.Tensor:
    if w_PH.shape[0] < vocab:
        raise ValueError(f"embedding has {w_PH.shape[0]} rows < vocab {vocab}")
    return w_PH[:vocab].contiguous()
