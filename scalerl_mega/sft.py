"""Supervised warm start before RL (the CPU demo): next-token loss on the task's reference traces,
through the same Megatron trainer that then runs RL.

Batches (`types.SftBatch`) hold `[B, T]` right-padded prompt + target tensors; the loss mask covers
the target tokens (including EOS), and the trainer's `sft_step` trains them with masked next-token
cross-entropy. The warm start has its own learning rate and linear warmup (`sft.*`); afterwards
the optimizer state and step counter are reset, so RL starts from fresh AdamW moments.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from scalerl_mega.types import SftBatch

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer


def sft_batch(pairs: Sequence[tuple[list[int], ...]], *, pad_id: int = 0) -> SftBatch:
    """(prompt ids, target ids) pairs -> the trainer's SFT batch. Target token j sits at position
    P + j and is predicted from position P + j - 1 (same layout as batch.build_train_batch). A third element,
    the target's loss mask (0/1 per target id), leaves ids out of the loss (a multi-turn trace's environment ids,
    episodes/demonstrations.py); without it every target id is trained."""
    import torch

    if not pairs:
        raise ValueError("sft_batch: no examples")
    T = max(len(p) + len(t) for p, t, *_ in pairs)
    B = len(pairs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.int64)
    targets = torch.zeros((B, T), dtype=torch.int64)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, t, *m) in enumerate(pairs):
        if not p or not t:
            raise ValueError(f"sft_batch: example {b} has an empty prompt or target")
        P, O = len(p), len(t)
        if m and len(m[0]) != O:
            raise ValueError(f"sft_batch: example {b} has {O} target ids and a loss mask of {len(m[0])}")
        input_ids[b, : P + O] = torch.tensor([*p, *t], dtype=torch.int64)
        targets[b, P - 1 : P - 1 + O] = torch.tensor(t, dtype=torch.int64)
        mask[b, P - 1 : P - 1 + O] = torch.tensor(m[0], dtype=torch.float32) if m else 1.0
    return SftBatch(input_ids_BT=input_ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                    targets_BT=targets, loss_mask_BT=mask)


def check_sft_batch(batch_size: int, *, num_examples: int) -> None:
    """A warm-start batch draws `batch_size` distinct examples of the `num_examples`."""
    if batch_size < 1 or batch_size > num_examples:
        raise ValueError(f"sft.batch_size={batch_size} must be in [1, {num_examples}] (number of SFT examples)")


def warm_start(trainer: MegatronPolicyTrainer, examples: Sequence[tuple[list[int], ...]], *, steps: int, batch_size: int,
               lr: float, warmup_steps: int, seed: int,
               on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """`steps` optimizer steps of next-token loss on shuffled `examples` (epochs reshuffled with
    Random(seed)) with a fresh optimizer of the run's settings but (lr, warmup); afterwards a fresh optimizer of
    the run's own settings (`trainer.reset_optimizer`; the trainer's config is not modified). Returns per-step
    metrics."""
    if steps <= 0:
        return []
    check_sft_batch(batch_size, num_examples=len(examples))
    trainer.reset_optimizer(dataclasses.replace(trainer.cfg.optim, lr=lr, warmup_steps=warmup_steps))
    rng = random.Random(seed)
    order: list[int] = []
    history = []
    try:
        for s in range(steps):
            if len(order) < batch_size:
                fresh = list(range(len(examples)))
                rng.shuffle(fresh)
                order += fresh
            idx, order = order[:batch_size], order[batch_size:]
            t0 = time.monotonic()
            m = trainer.sft_step(sft_batch([examples[i] for i in idx]))
            m = {k: float(v) for k, v in m.items()}
            m["step_s"] = time.monotonic() - t0
            history.append(m)
            if on_step is not None:
                on_step(s + 1, m)
    finally:
        trainer.reset_optimizer()
    return history


def fingerprint_diff(a: dict[str, object], b: dict[str, object], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts (missing on one side counts)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += fingerprint_diff(va, vb, f"{prefix}{k}.")
        elif va != vb or (k in a) != (k in b):
            out.append(f"{prefix}{k}")
    return out
