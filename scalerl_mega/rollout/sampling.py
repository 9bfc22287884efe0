"""Batched token sampling with per-sample seeds (pure torch, no I/O).

Randomness is counter-based: the uniform noise for (seed, step, token) is a hash of those three
integers (splitmix64), so a sample's draws do not depend on which other requests share its batch,
on the batch order, or on when it was admitted. Sampling is Gumbel-max over the top-p nucleus of
`logits / T`, which draws exactly from the renormalized nucleus distribution.

Log-probabilities follow SGLang's convention (`srt/layers/sampler.py`): `log_softmax(logits / T)`
over the full vocabulary, before top-p filtering. Temperature 0 means greedy decoding; its
log-probabilities are those of the unscaled logits. Logits should be FP32 (paper Sec. 3.2,
"FP32 Precision"); the log-probs are computed in whatever dtype they arrive in, then cast to fp32.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_C1 = _signed(0xBF58476D1CE4E5B9)
_C2 = _signed(0x94D049BB133111EB)
_STEP_MULT = _signed(0xD6E8FEB86659FD93)


def _lsr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer on int64 tensors (wrap-around arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ _lsr(z, 30)) * _C1
    z = (z ^ _lsr(z, 27)) * _C2
    return z ^ _lsr(z, 31)


def counter_uniform(seeds_N: torch.Tensor, steps_N: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] float64 uniforms in (0, 1), a pure function of (seed, step, token index)."""
    seeds = seeds_N.to(torch.int64).view(-1, 1)
    steps = steps_N.to(torch.int64).view(-1, 1)
    row = _mix64(_mix64(seeds) + steps * _STEP_MULT)
    idx = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device).view(1, -1)
    bits = _lsr(_mix64(row + idx * _GOLDEN), 11)  # 53 random bits
    return (bits.to(torch.float64) + 0.5) * (2.0**-53)


def top_p_mask(probs_NV: torch.Tensor, top_p_N: torch.Tensor) -> torch.Tensor:
    """Boolean [N, V]: True for tokens inside each row's top-p nucleus (always >= 1 token).

    A token is kept when the probability mass of strictly more probable tokens is below top_p.
    """
    sorted_p, order = probs_NV.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    keep_sorted = mass_before < top_p_N.view(-1, 1).to(sorted_p.dtype)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(1, order, keep_sorted)
    return keep


def sample_tokens(
    logits_NV: torch.Tensor,
    *,
    temperature_N: torch.Tensor,
    top_p_N: torch.Tensor,
    seeds_N: torch.Tensor,
    steps_N: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids [N] int64, log-probs [N] float32).

    Rows with temperature <= 0 are greedy. `steps_N` is the output index being sampled (the
    counter of the noise), `seeds_N` the per-sample seed (SGLang `sampling_seed`).
    """
    n, vocab = logits_NV.shape
    greedy = temperature_N <= 0
    t = torch.where(greedy, torch.ones_like(temperature_N), temperature_N).to(logits_NV.dtype)
    scaled = logits_NV / t.view(-1, 1)
    logp = torch.log_softmax(scaled, dim=-1)
    u = counter_uniform(seeds_N, steps_N, vocab)
    gumbel = -torch.log(-torch.log(u))
    scores = logp.to(torch.float64) + gumbel
    if bool((top_p_N < 1.0).any()):
        keep = top_p_mask(logp.exp(), top_p_N)
        scores = scores.masked_fill(~keep, float("-inf"))
    sampled = scores.argmax(dim=-1)
    tokens = torch.where(greedy.to(sampled.device), logp.argmax(dim=-1), sampled)
    token_logp = logp.gather(1, tokens.view(-1, 1)).view(-1).to(torch.float32)
    return tokens, token_logp
