"""Argument checks shared by the LM-head log-prob paths (`objective.fused_logprob` and its Triton backend
`objective.triton.fused_logprob`), so neither imports the other for them."""

from __future__ import annotations

import torch


def validate_head_inputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_start: int) -> None:
    """Raise ValueError unless hidden is a non-empty [N, H], weight a [V, H], targets an int64/int32 [N] and
    `vocab_start` (the first vocabulary row of this shard) >= 0."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, H={hidden.shape[1]}], got shape {tuple(weight.shape)}")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets must be [N={hidden.shape[0]}], got shape {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        raise ValueError("hidden is empty: empty batch")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64/int32, got {targets.dtype}")
    if vocab_start < 0:
        raise ValueError(f"vocab_start={vocab_start} must be >= 0")
