"""Fused linear + log-softmax + target gather in Triton, FP32 logits from bf16/fp32 inputs (paper Sec. 3.2).

Forward (`_kernels.logprob_fwd_kernel`): the grid is (row blocks of BLOCK_N, vocabulary splits). Each
program streams its share of the vocabulary in BLOCK_V tiles, computes each [BLOCK_N, BLOCK_V] logits tile
with tl.dot over BLOCK_H slices of H (FP32 accumulator) and keeps an online max / sum-exp and the target
logit. The splits (more programs than row blocks alone at N=4k on 132 SMs) are merged here in a fixed order:
lse = M + log sum_s s_s exp(m_s - M). [N, V] logits never exist; lse [N] is saved. The same pass keeps
z = sum exp(logit - m)(logit - m) per split, so the entropy log S - z / S (S, z merged at M) comes free.

Backward (no atomics, deterministic): rows are processed in chunks of C rows (`bwd_chunk_rows`, default: a
512 MiB [C, V] buffer). For each chunk `_kernels.dlogits_kernel` recomputes the logits tiles and writes
dL/dlogits = g * (onehot - softmax) into the buffer (in the GEMM dtype: bf16 for bf16 inputs, FP32 for FP32
inputs); then two cuBLAS GEMMs give grad_h[chunk] = dlogits @ W and grad_W += dlogits^T @ h[chunk]
(FP32 accumulator; on CUDA 16-bit operands use `torch.addmm(..., out_dtype=torch.float32)`). Every output
element is written by one program or one GEMM in a fixed order, so two runs with the same kernel
configuration are bit-identical. (The earlier design accumulated grad_W with FP32 `tl.atomic_add` from every
row block: ~1.3e11 atomics per 16k-token micro-batch at 8B, and run-to-run nondeterministic.) FLOPs: 4 GEMMs
of 2NHV (forward logits, recomputed logits, grad_h, grad_W).

Precision: FP32 operands (the trainer's FP32 head: Float16Module hands the last stage FP32 hidden states
holding bf16 values, and the head weight is FP32) take the "bf16x3" path on CUDA by default (`split_path`,
`objective/bf16_split.py`): each FP32 operand is the exact sum of three bf16 pieces, bf16-valued hidden
states (detected: `bf16_split.is_bf16_valued`) are one piece, and the kept piece products run on bf16
tensor cores with FP32 accumulation; the backward GEMMs are cuBLAS bf16 GEMMs with FP32 output. FP32
accuracy; bounds in tests/gpu/test_fused_logprob_gpu.py. Other modes: "tf32x3" (three TF32 products per
term in the kernels, FP32 cuBLAS GEMMs in the backward) and "ieee" (exact FP32 products on CUDA-core FMAs;
the default off CUDA, i.e. under the interpreter). Never plain TF32 (Triton's default for FP32 dots on
tensor-core GPUs, 10-bit input mantissas). bf16 x bf16 operands give exact products with FP32 accumulation
whatever the mode; their backward rounds dlogits to bf16 before the gradient GEMMs (like Liger's FLCE), so
bf16 gradients carry about 2^-8 relative error; logp and lse are FP32 either way.

Block sizes: on a CUDA device and with no block size given, `triton.autotune` picks from `AUTOTUNE_CONFIGS`
(4-5 configurations per operand kind, keyed on H, V and dtypes). The choice is cached per process, so
determinism holds within a process; pass block sizes to pin them across processes. Under TRITON_INTERPRET=1
(CPU testing) the inputs of tl.dot are cast to FP32 first (the interpreter's bf16 dot is wrong), fixed blocks
are used (autotune needs a driver) and no libdevice is used. `triton` is imported only inside functions.
"""

from __future__ import annotations

import torch

from scalerl_mega.objective.bf16_split import bf16_pieces, pieces_needed
from scalerl_mega.objective.fused_checks import validate_head_inputs
from scalerl_mega.objective.triton.launch import (AUTOTUNE_CONFIGS, DEFAULT_CUDA_FP32_PRECISION,  # noqa: F401
                                                  FP32_PRECISIONS, INTERPRET_BLOCKS, config_kind,
                                                  default_v_splits, interpreting, kernels, launch,
                                                  resolve_fp32_precision, sm_count)
from scalerl_mega.objective.triton.split_path import split_backward, split_forward

DEFAULT_BWD_CHUNK_BYTES = 512 * 2**20
"""Budget of the backward [C, V] dlogits buffer that sets the default chunk C (and of the bf16x3 path's piece
buffers, forward and backward)."""


def bwd_chunk_rows(N: int, V: int, itemsize: int, *, chunk_bytes: int = DEFAULT_BWD_CHUNK_BYTES) -> int:
    """Rows per backward chunk: the largest power of two (16..16384) whose [C, V] buffer fits, capped at N."""
    c = 16
    while c * 2 <= 16384 and c * 2 * V * itemsize <= chunk_bytes:
        c *= 2
    return min(c, N)


def _accumulate_wgrad(gw: torch.Tensor, d: torch.Tensor, h: torch.Tensor) -> None:
    """gw (FP32) += d^T @ h; 16-bit operands on CUDA keep an FP32 output without upcasting."""
    if d.dtype == gw.dtype:
        gw.addmm_(d.t(), h)
    else:
        torch.addmm(gw, d.t(), h, out_dtype=gw.dtype, out=gw)


def _merge(m: torch.Tensor, s: torch.Tensor, t: torch.Tensor, z: torch.Tensor, *, with_entropy: bool):
    """(lse, logp, entropy) [N] from the forward's per-split (m, s, t, z) [S, N], merged in a fixed order:
    lse = M + log sum_s s_s exp(m_s - M); entropy = log S - (1/S) sum_v exp(x_v - M)(x_v - M), each split's z
    re-centred from m to M (empty without `with_entropy`)."""
    m_max = m.amax(dim=0)
    alpha = torch.exp(m - m_max)  # 0 for a split with no vocabulary (m = -inf, s = 0)
    sum_exp = (s * alpha).sum(dim=0)
    lse = m_max + sum_exp.log()
    logp = t.sum(dim=0) - lse
    if with_entropy:
        centred = (alpha * (z + torch.where(s > 0, m - m_max, 0.0) * s)).sum(dim=0)
        entropy = sum_exp.log() - centred / sum_exp
    else:
        entropy = torch.empty(0, dtype=torch.float32, device=m.device)
    return lse, logp, entropy


def _plain_forward(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, *, blocks, v_splits: int | None,
                   precision: str, with_entropy: bool, upcast: bool):
    """Per-split (m, s, t, z) of the plain path (one operand piece each; FP32 operands when `upcast`)."""
    triton, _ = kernels()
    N, H = h.shape
    V = w.shape[0]
    v_splits = v_splits or default_v_splits(N, V, sm_count=sm_count(h.device))
    m, s, t = (torch.empty(v_splits, N, dtype=torch.float32, device=h.device) for _ in range(3))
    z = torch.empty_like(m) if with_entropy else m  # not written without WITH_ENTROPY
    launch("logprob_fwd_kernel", lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), v_splits),
           (h, h, h, w, w, w, y, m, s, t, z, N, V, H, h.stride(0), w.stride(0)), blocks=blocks, upcast=upcast,
           precision=precision, WITH_ENTROPY=bool(with_entropy), HP=1, WP=1)
    return m, s, t, z


def _plain_backward(h, w, y, lse, g, *, blocks, upcast: bool, precision: str, chunk_rows: int | None,
                    need_h: bool, need_w: bool, h_dtype):
    """(grad_h in `h_dtype`, grad_W FP32) of the plain path: dlogits chunks in the GEMM dtype, then cuBLAS."""
    triton, _ = kernels()
    N, H = h.shape
    V = w.shape[0]
    gemm_dtype = torch.float32 if upcast else h.dtype
    w_g = w if w.dtype == gemm_dtype else w.to(gemm_dtype)
    C = chunk_rows or bwd_chunk_rows(N, V, torch.finfo(gemm_dtype).bits // 8)
    d_buf = torch.empty(min(C, N), V, dtype=gemm_dtype, device=h.device)
    gh = torch.empty(N, H, dtype=h_dtype, device=h.device) if need_h else None
    gw = torch.zeros(V, H, dtype=torch.float32, device=h.device) if need_w else None
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        n = c1 - c0
        h_c, d = h[c0:c1], d_buf[:n]
        launch("dlogits_kernel", lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(V, meta["BLOCK_V"])),
               (h_c, h_c, h_c, w, w, w, y[c0:c1], lse[c0:c1], g[c0:c1], d, d, d, n, V, H, h.stride(0), w.stride(0),
                d.stride(0)),
               blocks=blocks, upcast=upcast, precision=precision, HP=1, WP=1, DP=1)
        if need_h:
            if gh.dtype == gemm_dtype:
                torch.mm(d, w_g, out=gh[c0:c1])
            else:
                gh[c0:c1] = torch.mm(d, w_g)
        if need_w:
            _accumulate_wgrad(gw, d, h_c if h_c.dtype == gemm_dtype else h_c.to(gemm_dtype))
    return gh, gw


def uses_split(hidden: torch.Tensor, weight: torch.Tensor, precision: str) -> bool:
    """The bf16x3 path applies: `precision` is "bf16x3" and an operand is FP32 (bf16 x bf16 is exact as is)."""
    return precision == "bf16x3" and torch.float32 in (hidden.dtype, weight.dtype)


class _TritonLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, blocks, v_splits, chunk_rows, precision, with_entropy, chunk_bytes):
        h, w = hidden.contiguous(), weight.contiguous()
        y = targets.contiguous().long()
        ctx.hp_n = pieces_needed(h) if uses_split(h, w, precision) else 0
        if ctx.hp_n:  # FP32 operands as bf16 pieces; the hidden states as one when bf16-valued (detected)
            m, s, t, z = split_forward(bf16_pieces(h, ctx.hp_n), w, y, blocks=blocks, v_splits=v_splits,
                                       with_entropy=with_entropy, chunk_bytes=chunk_bytes)
            ctx.upcast = interpreting()
        else:
            ctx.upcast = interpreting() or h.dtype == torch.float32 or h.dtype != w.dtype
            m, s, t, z = _plain_forward(h, w, y, blocks=blocks, v_splits=v_splits, precision=precision,
                                        with_entropy=with_entropy, upcast=ctx.upcast)
        lse, logp, entropy = _merge(m, s, t, z, with_entropy=with_entropy)
        ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(h, w, y, lse)
        ctx.blocks, ctx.chunk_rows, ctx.precision, ctx.chunk_bytes = blocks, chunk_rows, precision, chunk_bytes
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        h, w, y, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = grad_logp.float().contiguous()
        if ctx.hp_n:
            gh, gw = split_backward(bf16_pieces(h, ctx.hp_n), w, y, lse, g, blocks=ctx.blocks, need_h=need_h,
                                    need_w=need_w, chunk_bytes=ctx.chunk_bytes, max_rows=ctx.chunk_rows)
        else:
            gh, gw = _plain_backward(h, w, y, lse, g, blocks=ctx.blocks, upcast=ctx.upcast, precision=ctx.precision,
                                     chunk_rows=ctx.chunk_rows, need_h=need_h, need_w=need_w, h_dtype=ctx.dtypes[0])
        gh = gh.to(ctx.dtypes[0]) if need_h else None
        gw = gw.to(ctx.dtypes[1]) if need_w else None
        return gh, gw, None, None, None, None, None, None, None


def triton_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    block_n: int | None = None,
    block_v: int | None = None,
    block_h: int | None = None,
    v_splits: int | None = None,
    bwd_chunk_rows: int | None = None,
    fp32_precision: str | None = None,
    with_entropy: bool = False,
    chunk_bytes: int = DEFAULT_BWD_CHUNK_BYTES,
):
    """Per-token fp32 log pi(target | hidden) [N] (same contract as `fused_logprob.chunked_logprob`);
    with `with_entropy`, (logp [N], entropy [N]): the FP32 entropy of each token's softmax from the same
    forward pass (no gradient; a separately compiled kernel variant with one more accumulator: on sm_90,
    `python -m scalerl_mega.objective.triton.aot`, the bf16 configurations go from 164-252 to 168-255
    registers with no spills, and the FP32 (128, 64) configuration spills 20 bytes where the plain one does
    not).

    Block sizes must be powers of two (>= 16 for tl.dot on GPUs). If none is given: autotuned on a CUDA
    device, `INTERPRET_BLOCKS` otherwise (missing ones are filled from `INTERPRET_BLOCKS` when some are
    given). `v_splits`: vocabulary splits of the forward grid (default `default_v_splits`);
    `bwd_chunk_rows`: rows per backward chunk (default `bwd_chunk_rows(...)`, a 512 MiB buffer; with bf16x3, an
    upper bound on the rows `split_path.backward_chunks` picks). `fp32_precision`: the mode when an operand
    is FP32 (`FP32_PRECISIONS`; None: `resolve_fp32_precision`, "bf16x3" on CUDA: FP32 operands as exact
    bf16 pieces, bf16-valued hidden states detected and taken as one piece, `split_path`; with "tf32x3" /
    "ieee" the FP32 backward GEMMs follow torch's `torch.backends.cuda.matmul` setting). `chunk_bytes`: the
    bf16x3 path's budget for its piece buffers (vocabulary chunks of the split weight, dlogits pieces).
    """
    validate_head_inputs(hidden, weight, targets, 0)
    given = (block_n, block_v, block_h)
    blocks = None
    if any(b is not None for b in given) or not hidden.is_cuda or interpreting():
        blocks = tuple(b if b is not None else d for b, d in zip(given, INTERPRET_BLOCKS))
        for b in blocks:
            if b < 1 or b & (b - 1):
                raise ValueError(f"block sizes must be powers of two, got {blocks}")
    for name, v in (("v_splits", v_splits), ("bwd_chunk_rows", bwd_chunk_rows), ("chunk_bytes", chunk_bytes)):
        if v is not None and v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    fp32_precision = resolve_fp32_precision(fp32_precision, hidden)
    logp, entropy = _TritonLogProb.apply(hidden, weight, targets, blocks, v_splits, bwd_chunk_rows, fp32_precision,
                                         with_entropy, chunk_bytes)
    return (logp, entropy) if with_entropy else logp


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
    **kernel_opts,
) -> torch.Tensor:
    """CISPO loss -J (Eq. (cispo)) with the Triton log-probs: -sum w * sg(clamp(rho)) * A * logp."""
    logp = triton_logprob(hidden, weight, targets, **kernel_opts)
    coef = (weights.float() * advantages.float() * torch.exp(logp.detach() - gen_logp.float())
            .clamp(min=eps_low, max=eps_high))
    return -(coef * logp).sum()
