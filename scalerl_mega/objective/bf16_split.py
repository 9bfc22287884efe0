"""FP32-accurate products on bf16 tensor cores: an FP32 tensor as the exact sum of three bf16 pieces.

An FP32 value x (24-bit significand) splits exactly into x = x0 + x1 + x2 with bf16 pieces (8-bit
significands): x0 = bf16(x), x1 = bf16(x - x0), x2 = x - x0 - x1 (exactly a bf16; every residual is exact
in FP32). The product of two bf16 values is exact in FP32, so with FP32 accumulation

    a @ b = sum_{i, j} a_i @ b_j,     a_i @ b_j of relative size 2^(-8 (i + j)),

and keeping the pairs with i + j <= 2 leaves an error below 2^-24 relative per product: FP32 accuracy. A
bf16-valued operand (the trainer's head input: Megatron's Float16Module upcasts the bf16 decoder output to
FP32, so its values are bf16) is one piece, and then the three kept products are *exact*: h @ W^T =
h @ W0^T + h @ W1^T + h @ W2^T up to FP32 accumulation. General FP32 x FP32 takes six products
(0,0 0,1 1,0 0,2 2,0 1,1), bf16-valued x FP32 three, bf16 x bf16 one.

This module is the torch side of the scheme (pure tensor code, no Triton): the split, the exact test for
bf16-valued tensors, and `split_matmul_acc`, the GEMMs of the Triton head's backward (cuBLAS bf16 GEMMs with
an FP32 output on CUDA; on CPU, which has no such GEMM, the pieces are upcast: the same exact products).
`split_matmul` is a reference of the scheme in torch (tests compare the kernels with it and with float64).
Below about 2^-110 the lowest pieces underflow bf16's subnormals (as FP32 would a little later).
"""

from __future__ import annotations

import sys

import torch

PIECES = (1, 3)
"""Pieces per operand: 1 (bf16, or FP32 holding bf16 values) or 3 (general FP32)."""


def bf16_pieces(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    """x (FP32 or bf16) as `n` bf16 tensors whose sum is x: n=1 needs bf16 values (`is_bf16_valued`),
    n=3 is exact for any finite FP32 x (x0 is clamped to bf16's largest finite value, so FP32 values above it
    do not round to inf; the residual then holds the rest). Transient memory: one FP32 residual of x's size.
    ValueError for another n or dtype."""
    if n not in PIECES:
        raise ValueError(f"bf16_pieces: n={n} must be one of {PIECES}")
    if x.dtype == torch.bfloat16:
        return [x] if n == 1 else [x, torch.zeros_like(x), torch.zeros_like(x)]
    if x.dtype != torch.float32:
        raise ValueError(f"bf16_pieces: dtype {x.dtype} is not float32 or bfloat16")
    if n == 1:
        return [x.to(torch.bfloat16)]
    big = torch.finfo(torch.bfloat16).max
    r = torch.clamp(x, -big, big)
    x0 = r.to(torch.bfloat16)
    torch.sub(x, x0, out=r)  # exact: x0 holds x's leading bits
    x1 = r.to(torch.bfloat16)
    r.sub_(x1)
    return [x0, x1, r.to(torch.bfloat16)]


def is_bf16_valued(x: torch.Tensor) -> bool:
    """True when every element of x is exactly a bf16 value: x is bf16, or FP32 whose low 16 bits are
    zero (bf16 is FP32's upper half). One read of x, no temporary; one host sync on a GPU."""
    if x.dtype == torch.bfloat16:
        return True
    if x.dtype != torch.float32:
        return False
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        return bool(torch.equal(x, x.to(torch.bfloat16).float()))
    low = x.contiguous().view(torch.int16)[..., 0::2]  # little-endian: the low half of each word comes first
    return not bool(low.any())


def pieces_needed(x: torch.Tensor) -> int:
    """1 when x is bf16-valued (detected, `is_bf16_valued`), else 3."""
    return 1 if is_bf16_valued(x) else 3


def split_pairs(na: int, nb: int) -> list[tuple[int, int]]:
    """The (i, j) piece products kept for operands of `na` and `nb` pieces (i + j <= 2), smallest first
    (the order `split_matmul_acc` accumulates in; the kernels also go smallest first)."""
    pairs = [(i, j) for i in range(na) for j in range(nb) if i + j <= 2]
    return sorted(pairs, key=lambda p: (-(p[0] + p[1]), -p[1]))


def mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool) -> None:
    """out (FP32) = / += a @ b for bf16 a, b: exact products, FP32 accumulation. CUDA: one cuBLAS GEMM with
    an FP32 output (`out_dtype`); CPU (no bf16 x bf16 -> FP32 GEMM): on FP32 copies, the same products."""
    if a.is_cuda:  # beta=0: out's old contents are ignored (NaN included)
        torch.addmm(out, a, b, out_dtype=torch.float32, beta=1 if accumulate else 0, out=out)
        return
    if accumulate:
        out.addmm_(a.float(), b.float())
    else:
        torch.mm(a.float(), b.float(), out=out)


def split_matmul_acc(out: torch.Tensor, a_pieces: list[torch.Tensor], b_pieces: list[torch.Tensor], *,
                     accumulate: bool) -> None:
    """out (FP32) = / += (sum_i a_i) @ (sum_j b_j) over the kept pairs (`split_pairs`), each an exact-product
    GEMM with FP32 accumulation, in a fixed order (deterministic)."""
    for k, (i, j) in enumerate(split_pairs(len(a_pieces), len(b_pieces))):
        mm_into(out, a_pieces[i], b_pieces[j], accumulate=accumulate or k > 0)


def split_matmul(a: torch.Tensor, b: torch.Tensor, *, a_pieces: int | None = None,
                 b_pieces: int | None = None) -> torch.Tensor:
    """FP32 a @ b through the bf16 split (reference of the scheme): pieces per operand detected
    (`pieces_needed`) unless given."""
    na = pieces_needed(a) if a_pieces is None else a_pieces
    nb = pieces_needed(b) if b_pieces is None else b_pieces
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    split_matmul_acc(out, bf16_pieces(a, na), bf16_pieces(b, nb), accumulate=False)
    return out
