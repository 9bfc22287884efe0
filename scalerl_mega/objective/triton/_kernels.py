"""Triton JIT code for the fused FP32 LM-head log-probs (imported only by `fused_logprob._kernels()`).

This module imports `triton` at the top: import it only where Triton is wanted (it is never imported by
`scalerl_mega.objective.triton` itself). Callees of @triton.jit functions are resolved from module globals,
which is why the kernels and their helpers live at module level here.

- `block_index(idx, BLOCK)`: the int64 indices idx*BLOCK + [0, BLOCK). Every row / vocab / hidden index
  goes through it, so that row*stride never overflows int32 (N*H or V*H >= 2^31, e.g. V=256k, H=8192).
  `tile_offsets` forms the 2-D element offsets rows*stride + cols from such indices. Both assert (at compile
  time) that the result is int64; tests run them under TRITON_INTERPRET=1 at values beyond 2^31.
- `logits_tile`: one [BLOCK_N, BLOCK_V] FP32 tile of h @ W^T over BLOCK_H slices of H. FP32 operands
  (FP32 inputs, or any input under the interpreter, whose bf16 dot is wrong) use `input_precision=PRECISION`,
  "ieee" unless the caller asks for "tf32x3": Triton's default for FP32 dots on tensor-core GPUs is TF32
  (10-bit mantissa inputs). 16-bit operands keep the default (exact products, FP32 accumulation). HP / WP:
  1 or 3 bf16 pieces of h and W (pointers h, h1, h2 / w, w1, w2; the bf16x3 path, objective/bf16_split.py):
  the piece products of significance <= 2 are accumulated, smallest first.
- `logprob_fwd_kernel`: grid (row blocks, vocab splits). Each program streams its share of the vocabulary
  and writes, for its rows, the online max m, sum exp(logit - m) s and the target logit t (0 if the target
  is not in its share); with WITH_ENTROPY (a separate compilation, as it costs registers) also
  z = sum exp(logit - m) (logit - m), so that the entropy is log s - z / s. The caller combines the splits
  (deterministic, fixed order).
- `dlogits_kernel`: grid (row blocks, vocab blocks) of a row chunk. Each program recomputes one logits
  tile and writes dL/dlogits = g * (onehot - softmax) for the upstream gradient g = dL/dlogp, so that
  grad_h = dlogits @ W and grad_W = dlogits^T @ h are plain GEMMs on the written chunk (see
  `fused_logprob`); with DP = 3 it writes the FP32 dlogits as three exact bf16 pieces (bf16x3 path, GEMMs on
  bf16 tensor cores). No atomics anywhere: every output element is written by exactly one program.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_index(idx, BLOCK: tl.constexpr):
    """int64 indices idx * BLOCK + [0, BLOCK): idx (a program id or loop counter) is widened first."""
    out = tl.cast(idx, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.static_assert(out.dtype == tl.int64, "block_index must be int64")
    return out


@triton.jit
def tile_offsets(rows, cols, stride):
    """Element offsets rows[:, None] * stride + cols[None, :] of a row-major tile (int64)."""
    out = rows[:, None] * stride + cols[None, :]
    tl.static_assert(out.dtype == tl.int64, "tile offsets must be int64")
    return out


@triton.jit
def dot_acc(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ b^T (a [M, K], b [Nn, K]). UPCAST: FP32 operands in `PRECISION`; else 16-bit operands
    (exact products, FP32 accumulation)."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision=PRECISION)
    else:
        acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def logits_tile(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, offs_n, offs_v, row_ok, col_ok, H, stride_h, stride_w,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr, HP: tl.constexpr, WP: tl.constexpr):
    """FP32 logits h[offs_n] @ W[offs_v]^T, [BLOCK_N, BLOCK_V]; masked rows/columns are 0.

    HP / WP (1 or 3): pieces of the hidden states (h, h1, h2) and of the weight (w, w1, w2). With 3 pieces
    an operand is the exact sum of three bf16 tensors (`bf16_split.bf16_pieces`, significance 0, 1, 2); the
    products of total significance <= 2 are accumulated, smallest first (HP=1, WP=3: h.w2, h.w1, h.w: exact
    products, FP32 accumulation). With 1 piece each, one dot per slice (the plain path)."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
    for kb in range(0, tl.cdiv(H, BLOCK_H)):
        offs_k = block_index(kb, BLOCK_H)
        k_ok = offs_k < H
        h_off = tile_offsets(offs_n, offs_k, stride_h)
        h_ok = row_ok[:, None] & k_ok[None, :]
        w_off = tile_offsets(offs_v, offs_k, stride_w)
        w_ok = col_ok[:, None] & k_ok[None, :]
        a = tl.load(h_ptr + h_off, mask=h_ok, other=0.0)
        b = tl.load(w_ptr + w_off, mask=w_ok, other=0.0)
        if WP == 3:
            b1 = tl.load(w1_ptr + w_off, mask=w_ok, other=0.0)
            b2 = tl.load(w2_ptr + w_off, mask=w_ok, other=0.0)
            acc = dot_acc(a, b2, acc, UPCAST, PRECISION)
        if HP == 3:
            a1 = tl.load(h1_ptr + h_off, mask=h_ok, other=0.0)
            a2 = tl.load(h2_ptr + h_off, mask=h_ok, other=0.0)
            acc = dot_acc(a2, b, acc, UPCAST, PRECISION)
            if WP == 3:
                acc = dot_acc(a1, b1, acc, UPCAST, PRECISION)
        if WP == 3:
            acc = dot_acc(a, b1, acc, UPCAST, PRECISION)
        if HP == 3:
            acc = dot_acc(a1, b, acc, UPCAST, PRECISION)
        acc = dot_acc(a, b, acc, UPCAST, PRECISION)
    return acc


@triton.jit
def logprob_fwd_kernel(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, y_ptr, m_ptr, s_ptr, t_ptr, z_ptr,
                       N, V, H, stride_h, stride_w,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                       UPCAST: tl.constexpr, PRECISION: tl.constexpr, WITH_ENTROPY: tl.constexpr,
                       HP: tl.constexpr, WP: tl.constexpr):
    offs_n = block_index(tl.program_id(0), BLOCK_N)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    row_ok = offs_n < N
    tgt = tl.load(y_ptr + offs_n, mask=row_ok, other=0)
    n_vblocks = tl.cdiv(V, BLOCK_V)
    per_split = tl.cdiv(n_vblocks, n_splits)
    vb_start = split * per_split
    vb_end = tl.minimum(vb_start + per_split, n_vblocks)
    m_i = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s_i = tl.zeros((BLOCK_N,), tl.float32)
    t_i = tl.zeros((BLOCK_N,), tl.float32)
    z_i = tl.zeros((BLOCK_N,), tl.float32)
    for vb in range(vb_start, vb_end):
        offs_v = block_index(vb, BLOCK_V)
        col_ok = offs_v < V
        acc = logits_tile(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, offs_n, offs_v, row_ok, col_ok, H,
                          stride_h, stride_w, BLOCK_N, BLOCK_V, BLOCK_H, UPCAST, PRECISION, HP, WP)
        acc = tl.where(col_ok[None, :], acc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(acc, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(acc - m_new[:, None])
        if WITH_ENTROPY:  # a separate compilation: the plain log-prob kernel keeps its registers
            shift = tl.where(s_i > 0, m_i - m_new, 0.0)  # m_i is -inf only while s_i == 0
            # z = sum exp(x - m) (x - m) about the running max m: re-centred on m_new as s is
            z_i = alpha * (z_i + shift * s_i) + tl.sum(tl.where(col_ok[None, :], p * (acc - m_new[:, None]), 0.0), 1)
        s_i = s_i * alpha + tl.sum(p, 1)
        m_i = m_new
        t_i += tl.sum(tl.where(offs_v[None, :] == tgt[:, None], acc, 0.0), 1)
    out = tl.cast(split, tl.int64) * N + offs_n
    tl.store(m_ptr + out, m_i, mask=row_ok)
    tl.store(s_ptr + out, s_i, mask=row_ok)
    tl.store(t_ptr + out, t_i, mask=row_ok)
    if WITH_ENTROPY:
        tl.store(z_ptr + out, z_i, mask=row_ok)


@triton.jit
def dlogits_kernel(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, y_ptr, lse_ptr, g_ptr, d_ptr, d1_ptr, d2_ptr,
                   N, V, H, stride_h, stride_w, stride_d,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr,
                   PRECISION: tl.constexpr, HP: tl.constexpr, WP: tl.constexpr, DP: tl.constexpr):
    """DP = 1: dlogits in d's dtype; DP = 3: the FP32 dlogits as three bf16 pieces d + d1 + d2 (exact)."""
    offs_n = block_index(tl.program_id(0), BLOCK_N)
    offs_v = block_index(tl.program_id(1), BLOCK_V)
    row_ok = offs_n < N
    col_ok = offs_v < V
    acc = logits_tile(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, offs_n, offs_v, row_ok, col_ok, H,
                      stride_h, stride_w, BLOCK_N, BLOCK_V, BLOCK_H, UPCAST, PRECISION, HP, WP)
    tgt = tl.load(y_ptr + offs_n, mask=row_ok, other=0)
    lse = tl.load(lse_ptr + offs_n, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + offs_n, mask=row_ok, other=0.0)
    p = tl.exp(acc - lse[:, None])
    d = g[:, None] * (tl.where(offs_v[None, :] == tgt[:, None], 1.0, 0.0) - p)
    offs = tile_offsets(offs_n, offs_v, stride_d)
    ok = row_ok[:, None] & col_ok[None, :]
    if DP == 3:
        d0 = d.to(tl.bfloat16)
        r = d - d0.to(tl.float32)
        d1 = r.to(tl.bfloat16)
        tl.store(d_ptr + offs, d0, mask=ok)
        tl.store(d1_ptr + offs, d1, mask=ok)
        tl.store(d2_ptr + offs, (r - d1.to(tl.float32)).to(tl.bfloat16), mask=ok)
    else:
        tl.store(d_ptr + offs, d.to(d_ptr.dtype.element_ty), mask=ok)
