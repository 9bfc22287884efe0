"""Fused linear + log-softmax + target gather in Triton, FP32 logits from bf16/fp32 inputs (paper Sec. 3.2).

Forward: one program per block of BLOCK_N rows streams the vocabulary in BLOCK_V tiles, computes each
[BLOCK_N, BLOCK_V] logits tile with tl.dot over BLOCK_H slices of H (fp32 accumulator), and keeps an online
max / sum-exp and the target logit; it writes lse [N] and logp [N]. [N, V] logits never exist.
Backward: recomputes each tile, forms d = g * (onehot - exp(logits - lse)) and accumulates
grad_hidden (rows owned by the program: plain load/add/store) and grad_weight (shared across programs:
fp32 tl.atomic_add). The CISPO path uses it with g = the detached CISPO coefficient (Eq. (cispo)).

`triton` is imported only inside functions. Under TRITON_INTERPRET=1 (CPU testing) the inputs of tl.dot are
cast to fp32 first (the interpreter's bf16 dot is wrong), and no autotuning or libdevice is used.
"""

from __future__ import annotations

import functools
import os

import torch


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _fwd(h_ptr, w_ptr, y_ptr, lse_ptr, logp_ptr, N, V, H, stride_h, stride_w,
             BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = offs_n < N
        tgt = tl.load(y_ptr + offs_n, mask=row_ok, other=0)
        m_i = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s_i = tl.zeros((BLOCK_N,), tl.float32)
        t_i = tl.zeros((BLOCK_N,), tl.float32)
        for v0 in range(0, V, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            col_ok = offs_v < V
            acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
            for k0 in range(0, H, BLOCK_H):
                offs_k = k0 + tl.arange(0, BLOCK_H)
                k_ok = offs_k < H
                a = tl.load(h_ptr + offs_n[:, None] * stride_h + offs_k[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_ptr + offs_v[:, None] * stride_w + offs_k[None, :],
                            mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc += tl.dot(a, tl.trans(b))
            acc = tl.where(col_ok[None, :], acc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(acc, 1))
            s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(acc - m_new[:, None]), 1)
            m_i = m_new
            t_i += tl.sum(tl.where(offs_v[None, :] == tgt[:, None], acc, 0.0), 1)
        lse = m_i + tl.log(s_i)
        tl.store(lse_ptr + offs_n, lse, mask=row_ok)
        tl.store(logp_ptr + offs_n, t_i - lse, mask=row_ok)

    # The logits-tile loop is repeated in _bwd on purpose: the kernels live in this closure so that triton is
    # imported lazily, and @triton.jit resolves callees from module globals, not closures.
    @triton.jit
    def _bwd(h_ptr, w_ptr, y_ptr, lse_ptr, g_ptr, gh_ptr, gw_ptr, N, V, H, stride_h, stride_w,
             BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = offs_n < N
        tgt = tl.load(y_ptr + offs_n, mask=row_ok, other=0)
        lse = tl.load(lse_ptr + offs_n, mask=row_ok, other=0.0)
        g = tl.load(g_ptr + offs_n, mask=row_ok, other=0.0)
        for v0 in range(0, V, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            col_ok = offs_v < V
            acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
            for k0 in range(0, H, BLOCK_H):
                offs_k = k0 + tl.arange(0, BLOCK_H)
                k_ok = offs_k < H
                a = tl.load(h_ptr + offs_n[:, None] * stride_h + offs_k[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_ptr + offs_v[:, None] * stride_w + offs_k[None, :],
                            mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc += tl.dot(a, tl.trans(b))
            p = tl.exp(acc - lse[:, None])
            onehot = tl.where(offs_v[None, :] == tgt[:, None], 1.0, 0.0)
            d = g[:, None] * (onehot - p)
            d = tl.where(row_ok[:, None] & col_ok[None, :], d, 0.0)
            for k0 in range(0, H, BLOCK_H):
                offs_k = k0 + tl.arange(0, BLOCK_H)
                k_ok = offs_k < H
                a = tl.load(h_ptr + offs_n[:, None] * stride_h + offs_k[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
                b = tl.load(w_ptr + offs_v[:, None] * stride_w + offs_k[None, :],
                            mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
                gh_ptrs = gh_ptr + offs_n[:, None] * H + offs_k[None, :]
                gh_mask = row_ok[:, None] & k_ok[None, :]
                gh = tl.load(gh_ptrs, mask=gh_mask, other=0.0)
                tl.store(gh_ptrs, gh + tl.dot(d, b), mask=gh_mask)
                tl.atomic_add(gw_ptr + offs_v[:, None] * H + offs_k[None, :], tl.dot(tl.trans(d), a),
                              mask=col_ok[:, None] & k_ok[None, :])

    return triton, _fwd, _bwd


def _blocks(block_n: int | None, block_v: int | None, block_h: int | None) -> tuple[int, int, int]:
    return block_n or 64, block_v or 128, block_h or 64


class _TritonLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, blocks):
        triton, fwd, _ = _kernels()
        N, H = hidden.shape
        V = weight.shape[0]
        h, w = hidden.contiguous(), weight.contiguous()
        y = targets.contiguous().long()
        lse = torch.empty(N, dtype=torch.float32, device=h.device)
        logp = torch.empty(N, dtype=torch.float32, device=h.device)
        bn, bv, bh = blocks
        upcast = _interpreting() or h.dtype == torch.float32 or w.dtype == torch.float32
        fwd[(triton.cdiv(N, bn),)](h, w, y, lse, logp, N, V, H, h.stride(0), w.stride(0),
                                   BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, UPCAST=upcast)
        ctx.save_for_backward(h, w, y, lse)
        ctx.blocks, ctx.upcast, ctx.dtypes = blocks, upcast, (hidden.dtype, weight.dtype)
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        triton, _, bwd = _kernels()
        h, w, y, lse = ctx.saved_tensors
        N, H = h.shape
        V = w.shape[0]
        gh = torch.zeros(N, H, dtype=torch.float32, device=h.device)
        gw = torch.zeros(V, H, dtype=torch.float32, device=h.device)
        bn, bv, bh = ctx.blocks
        g = grad_logp.float().contiguous()
        bwd[(triton.cdiv(N, bn),)](h, w, y, lse, g, gh, gw, N, V, H, h.stride(0), w.stride(0),
                                   BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, UPCAST=ctx.upcast)
        hd, wd = ctx.dtypes
        return gh.to(hd), gw.to(wd), None, None


def triton_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    block_n: int | None = None,
    block_v: int | None = None,
    block_h: int | None = None,
) -> torch.Tensor:
    """Per-token fp32 log pi(target | hidden) [N] (same contract as `fused_logprob.chunked_logprob`).

    Block sizes must be powers of two (>= 16 for tl.dot on GPUs).
    """
    from scalerl_mega.objective.fused_logprob import _validate

    _validate(hidden, weight, targets, 0)
    blocks = _blocks(block_n, block_v, block_h)
    for b in blocks:
        if b < 1 or b & (b - 1):
            raise ValueError(f"block sizes must be powers of two, got {blocks}")
    return _TritonLogProb.apply(hidden, weight, targets, blocks)


def triton_cispo_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    eps_high: float = 5.0,
    eps_low: float | None = None,
    **blocks: int | None,
) -> torch.Tensor:
    """CISPO loss -J (Eq. (cispo)) with the Triton log-probs: -sum w * sg(clamp(rho)) * A * logp."""
    logp = triton_logprob(hidden, weight, targets, **blocks)
    coef = (weights.float() * advantages.float() * torch.exp(logp.detach() - gen_logp.float())
            .clamp(min=eps_low, max=eps_high))
    return -(coef * logp).sum()
