"""The "bf16x3" path of the Triton head: FP32 operands as exact bf16 pieces on tensor cores (objective/bf16_split.py).

Forward (`split_forward`): the weight is split chunk by chunk over the vocabulary ([WP, Vc, H] bf16, within
`chunk_bytes`), and `_kernels.logprob_fwd_kernel` runs on each chunk with HP hidden pieces (1 when the
hidden states are bf16-valued, detected by the caller; else 3) and WP weight pieces (3 for an FP32 weight, 1
for bf16), accumulating the kept piece products in FP32 (`logits_tile`). Each chunk's vocabulary splits
write their own (m, s, t, z) rows, merged by the caller like the plain path's splits.

Backward (`split_backward`): vocabulary chunks outer, row chunks inner. `_kernels.dlogits_kernel` recomputes
the logits and writes the FP32 dlogits as three bf16 pieces (DP=3, exact); then cuBLAS bf16 GEMMs with FP32
accumulation (`bf16_split.split_matmul_acc`): grad_h[rows] += d @ W[chunk] (3 x WP pieces, kept pairs: 6
products for an FP32 weight) and grad_W[chunk] += d^T @ h[rows] (3 x HP pieces: 3 products for bf16-valued
hidden states). Every element is written by one program or one GEMM sequence in a fixed order: deterministic.
Memory: the piece buffers stay within `chunk_bytes` (plus the FP32 grad_W and grad_h the caller returns).
FLOPs at 2NHV per product GEMM: bf16-valued hidden and an FP32 weight 3 (forward) + 3 (recompute) + 6
(grad_h) + 3 (grad_W) = 15, all on bf16 tensor cores; the naive FP32 path does 3 on FP32 units.
"""

from __future__ import annotations

import torch

from scalerl_mega.objective.bf16_split import bf16_pieces, split_matmul_acc
from scalerl_mega.objective.triton.launch import cdiv, default_v_splits, interpreting, kernels, launch, sm_count

MIN_VOCAB_CHUNK = 128


def _pow2_floor(x: float) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def _vocab_floor(x: float) -> int:
    """x rounded down to a multiple of MIN_VOCAB_CHUNK (0 below it)."""
    return int(x // MIN_VOCAB_CHUNK) * MIN_VOCAB_CHUNK


def _balanced(V: int, vc: int) -> int:
    """The chunk size <= vc (a multiple of MIN_VOCAB_CHUNK) that splits V into as few, as equal chunks."""
    if vc >= V:
        return V
    n = cdiv(V, vc)
    return cdiv(cdiv(V, n), MIN_VOCAB_CHUNK) * MIN_VOCAB_CHUNK


def weight_bytes_per_element(wp: int) -> int:
    """Bytes per weight element of its split: three bf16 pieces plus the FP32 residual while splitting
    (`bf16_pieces`); none for a bf16 weight (one piece: the weight itself)."""
    return 10 if wp == 3 else 0


def forward_vocab_chunk(V: int, H: int, *, wp: int, chunk_bytes: int) -> int:
    """Vocabulary rows per forward chunk: the split weight rows within `chunk_bytes` (a multiple of
    MIN_VOCAB_CHUNK, at least one), or V when all of it fits."""
    per_row = weight_bytes_per_element(wp) * H
    if per_row == 0:
        return V
    return _balanced(V, max(MIN_VOCAB_CHUNK, _vocab_floor(chunk_bytes / per_row)))


def backward_chunks(N: int, V: int, H: int, *, wp: int, chunk_bytes: int) -> tuple[int, int]:
    """(rows C, vocabulary Vc) per backward chunk: the dlogits pieces [3, C, Vc] (bf16) and the split weight
    rows [Vc, H] within `chunk_bytes`; all N rows per chunk when that leaves >= MIN_VOCAB_CHUNK vocabulary
    rows, else fewer rows (a power of two >= 16)."""
    w_row = weight_bytes_per_element(wp) * H
    vc = _vocab_floor(chunk_bytes / (6 * N + w_row))
    if vc >= MIN_VOCAB_CHUNK:
        return N, _balanced(V, vc)
    vc = min(MIN_VOCAB_CHUNK, V)
    rows = max(16, _pow2_floor(max(chunk_bytes - w_row * vc, 0) / (6 * vc)))
    return min(rows, N), vc


def _three(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pointer arguments for a kernel's (x, x1, x2): unused slots repeat the first piece."""
    return [pieces[i] if i < len(pieces) else pieces[0] for i in range(3)]


def split_forward(hp: list[torch.Tensor], weight: torch.Tensor, y: torch.Tensor, *, blocks, v_splits: int | None,
                  with_entropy: bool, chunk_bytes: int):
    """Per-split (m, s, t, z) [S, N] of the logits h @ W^T (h = sum of the bf16 pieces `hp`, [N, H] each),
    over vocabulary chunks of the FP32 (or bf16) `weight` split into pieces; z is m when not `with_entropy`."""
    triton, _ = kernels()
    N, H = hp[0].shape
    V = weight.shape[0]
    wp = 1 if weight.dtype == torch.bfloat16 else 3
    vc = forward_vocab_chunk(V, H, wp=wp, chunk_bytes=chunk_bytes)
    splits = v_splits or default_v_splits(N, vc, sm_count=sm_count(weight.device))
    n_chunks = cdiv(V, vc)
    m, s, t = (torch.empty(n_chunks * splits, N, dtype=torch.float32, device=weight.device) for _ in range(3))
    z = torch.empty_like(m) if with_entropy else m
    upcast = interpreting()
    for c in range(n_chunks):
        v0, v1 = c * vc, min((c + 1) * vc, V)
        w_pieces = bf16_pieces(weight[v0:v1], wp)
        rows = slice(c * splits, (c + 1) * splits)
        launch("logprob_fwd_kernel", lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), splits),
               (*_three(hp), *_three(w_pieces), y - v0, m[rows], s[rows], t[rows], z[rows], N, v1 - v0, H,
                hp[0].stride(0), w_pieces[0].stride(0)),
               blocks=blocks, upcast=upcast, precision="bf16x3", WITH_ENTROPY=bool(with_entropy), HP=len(hp),
               WP=wp)
    return m, s, t, z


def split_backward(hp: list[torch.Tensor], weight: torch.Tensor, y: torch.Tensor, lse: torch.Tensor,
                   g: torch.Tensor, *, blocks, need_h: bool, need_w: bool, chunk_bytes: int,
                   max_rows: int | None = None):
    """(grad_h FP32 [N, H] or None, grad_W FP32 [V, H] or None) of sum_t g_t logp_t (see module doc);
    `max_rows` caps the rows per chunk."""
    triton, _ = kernels()
    N, H = hp[0].shape
    V = weight.shape[0]
    dev = weight.device
    wp = 1 if weight.dtype == torch.bfloat16 else 3
    rows, vc = backward_chunks(N, V, H, wp=wp, chunk_bytes=chunk_bytes)
    rows = min(rows, max_rows or rows)
    gh = torch.zeros(N, H, dtype=torch.float32, device=dev) if need_h else None
    gw = torch.empty(V, H, dtype=torch.float32, device=dev) if need_w else None
    d_buf = torch.empty(3, rows, vc, dtype=torch.bfloat16, device=dev)
    upcast = interpreting()
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        w_pieces = bf16_pieces(weight[v0:v1], wp)
        y_local = y - v0
        for r0 in range(0, N, rows):
            r1 = min(r0 + rows, N)
            n = r1 - r0
            d = [d_buf[i, :n, : v1 - v0] for i in range(3)]
            h_rows = [p[r0:r1] for p in hp]
            launch("dlogits_kernel",
                   lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(v1 - v0, meta["BLOCK_V"])),
                   (*_three(h_rows), *_three(w_pieces), y_local[r0:r1], lse[r0:r1], g[r0:r1], *d, n, v1 - v0, H,
                    hp[0].stride(0), w_pieces[0].stride(0), d_buf.stride(1)),
                   blocks=blocks, upcast=upcast, precision="bf16x3", HP=len(hp), WP=wp, DP=3)
            if need_h:
                split_matmul_acc(gh[r0:r1], d, w_pieces, accumulate=True)
            if need_w:
                split_matmul_acc(gw[v0:v1], [x.t() for x in d], h_rows, accumulate=r0 > 0)
    return gh, gw
