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

Precision: FP32 operands (the trainer's FP32 head: Float16Module hands the last stage FP32 hidden states,
and the head weight is FP32) use tl.dot(input_precision="tf32x3") on a CUDA device by default (tensor
cores, three TF32 products per term, hi*hi + hi*lo + lo*hi: about FP32 accuracy, bounds in
tests/gpu/test_fused_logprob_gpu.py), or "ieee" on request (exact FP32 products on CUDA-core FMAs: several
times slower on H100, where FP32 FMA peaks near 67 TFLOP/s against ~495 for dense TF32). Never plain TF32
(Triton's default for FP32 dots on tensor-core GPUs, 10-bit input mantissas). Off CUDA (the interpreter)
the default is "ieee". bf16 operands give exact products with FP32 accumulation. The bf16 backward
rounds dlogits to bf16 before the gradient GEMMs (like Liger's FLCE), so bf16 gradients carry about 2^-8
relative error; logp and lse are FP32 either way.

Block sizes: on a CUDA device and with no block size given, `triton.autotune` picks from `AUTOTUNE_CONFIGS`
(4-5 configurations per operand kind, keyed on H, V and dtypes). The choice is cached per process, so
determinism holds within a process; pass block sizes to pin them across processes. Under TRITON_INTERPRET=1
(CPU testing) the inputs of tl.dot are cast to FP32 first (the interpreter's bf16 dot is wrong), fixed blocks
are used (autotune needs a driver) and no libdevice is used. `triton` is imported only inside functions.
"""

from __future__ import annotations

import functools
import os

import torch

from scalerl_mega.objective.fused_checks import validate_head_inputs

AUTOTUNE_CONFIGS = {
    # (BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages). BLOCK_H is fixed within a list so that the
    # K-accumulation order does not depend on the choice. Compiled for sm_90 on CPU (`python -m
    # scalerl_mega.objective.triton.aot`, Triton 3.9 and 3.6): 16-bit and tf32x3
    # configs use wgmma; none spills except three FP32-operand ones (12-28 bytes). Configs that do not fit are
    # pruned by the autotuner.
    "16bit": (  # bf16/fp16 operands: wgmma tensor-core dots
        (128, 128, 64, 8, 3),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 3),
        (128, 128, 64, 8, 2),
    ),
    "fp32": (  # IEEE FP32 (FMA) dots: more registers per element, so thinner K slices
        (128, 64, 32, 8, 3),
        (64, 128, 32, 8, 3),
        (32, 128, 32, 4, 3),
        (64, 64, 32, 4, 3),
    ),
    "tf32x3": (  # FP32 operands on tensor cores as 3 TF32 products (hi*hi + hi*lo + lo*hi)
        (128, 128, 32, 8, 3),
        (128, 64, 32, 8, 3),
        (64, 128, 32, 4, 3),
        (64, 64, 32, 4, 3),
    ),
}
FP32_PRECISIONS = ("ieee", "tf32x3")
"""FP32-operand dot modes: "ieee" (exact FP32 products, CUDA-core FMA; the default off CUDA) or "tf32x3"
(tensor cores, error near FP32's, see the GPU test; the default on CUDA); never plain TF32."""
DEFAULT_CUDA_FP32_PRECISION = "tf32x3"


def resolve_fp32_precision(precision: str | None, hidden: torch.Tensor) -> str:
    """`precision` if given, else `DEFAULT_CUDA_FP32_PRECISION` for CUDA inputs outside the interpreter and
    "ieee" otherwise. ValueError naming `fp32_precision` for an unknown mode."""
    if precision is None:
        precision = DEFAULT_CUDA_FP32_PRECISION if hidden.is_cuda and not _interpreting() else "ieee"
    if precision not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision={precision!r} is not one of {list(FP32_PRECISIONS)}")
    return precision
INTERPRET_BLOCKS = (32, 64, 32)
"""Fixed (BLOCK_N, BLOCK_V, BLOCK_H) when no block size is given and no GPU autotuning is possible."""
DEFAULT_BWD_CHUNK_BYTES = 512 * 2**20
"""Budget of the backward [C, V] dlogits buffer that sets the default chunk C."""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _kernels():
    import triton

    from scalerl_mega.objective.triton import _kernels as k

    return triton, k


def config_kind(upcast: bool, precision: str) -> str:
    """The AUTOTUNE_CONFIGS list for FP32 operands (`upcast`) in `precision`, or for 16-bit operands."""
    return precision if upcast and precision != "ieee" else ("fp32" if upcast else "16bit")


@functools.cache
def _tuned(name: str, kind: str):
    """`_kernels.<name>` under `triton.autotune` over AUTOTUNE_CONFIGS[kind] (GPU only)."""
    triton, k = _kernels()
    configs = [triton.Config(dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh), num_warps=w, num_stages=s)
               for bn, bv, bh, w, s in AUTOTUNE_CONFIGS[kind]]
    kernel = getattr(k, name)
    # tuned per shape and per compiled variant (the entropy variant has other register pressure)
    key = ["H", "V", *(["WITH_ENTROPY"] if "WITH_ENTROPY" in kernel.arg_names else [])]
    return triton.autotune(configs=configs, key=key)(kernel)


def _launch(name: str, grid, args: tuple, *, blocks: tuple[int, int, int] | None, upcast: bool,
            precision: str, **constexprs) -> None:
    """Launch `_kernels.<name>`: autotuned when `blocks` is None, else with these (BLOCK_N, BLOCK_V, BLOCK_H).

    `grid(meta) -> tuple` receives the block sizes (as Triton's autotuner passes them); `constexprs`: the
    kernel's other compile-time flags (e.g. WITH_ENTROPY)."""
    _, k = _kernels()
    flags = dict(UPCAST=upcast, PRECISION=precision, **constexprs)
    if blocks is None:
        _tuned(name, config_kind(upcast, precision))[grid](*args, **flags)
        return
    meta = dict(BLOCK_N=blocks[0], BLOCK_V=blocks[1], BLOCK_H=blocks[2])
    getattr(k, name)[grid(meta)](*args, **meta, **flags)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_v_splits(N: int, V: int, *, sm_count: int | None) -> int:
    """Vocabulary splits of the forward grid: about 2 programs per SM (row blocks of 128 assumed), each
    split at least 4096 vocabulary entries; 1 without a GPU (the interpreter runs programs serially)."""
    if not sm_count:
        return 1
    return max(1, min(_cdiv(2 * sm_count, _cdiv(N, 128)), _cdiv(V, 4096)))


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


class _TritonLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, blocks, v_splits, chunk_rows, precision, with_entropy):
        triton, _ = _kernels()
        N, H = hidden.shape
        V = weight.shape[0]
        h, w = hidden.contiguous(), weight.contiguous()
        y = targets.contiguous().long()
        upcast = _interpreting() or h.dtype == torch.float32 or h.dtype != w.dtype
        if v_splits is None:
            sms = torch.cuda.get_device_properties(h.device).multi_processor_count if h.is_cuda else None
            v_splits = default_v_splits(N, V, sm_count=sms)
        m, s, t = (torch.empty(v_splits, N, dtype=torch.float32, device=h.device) for _ in range(3))
        z = torch.empty_like(m) if with_entropy else m  # not written without WITH_ENTROPY
        _launch("logprob_fwd_kernel", lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), v_splits),
                (h, w, y, m, s, t, z, N, V, H, h.stride(0), w.stride(0)), blocks=blocks, upcast=upcast,
                precision=precision, WITH_ENTROPY=bool(with_entropy))
        m_max = m.amax(dim=0)
        alpha = torch.exp(m - m_max)  # 0 for a split with no vocabulary (m = -inf, s = 0)
        sum_exp = (s * alpha).sum(dim=0)
        lse = m_max + sum_exp.log()
        logp = t.sum(dim=0) - lse
        if with_entropy:  # log S - (1/S) sum_v exp(x_v - M)(x_v - M), each split's z re-centred from m to M
            centred = (alpha * (z + torch.where(s > 0, m - m_max, 0.0) * s)).sum(dim=0)
            entropy = sum_exp.log() - centred / sum_exp
        else:
            entropy = torch.empty(0, dtype=torch.float32, device=h.device)
        ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(h, w, y, lse)
        ctx.blocks, ctx.upcast, ctx.chunk_rows, ctx.precision = blocks, upcast, chunk_rows, precision
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        triton, _ = _kernels()
        h, w, y, lse = ctx.saved_tensors
        N, H = h.shape
        V = w.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gemm_dtype = torch.float32 if ctx.upcast else h.dtype
        w_g = w if w.dtype == gemm_dtype else w.to(gemm_dtype)
        C = ctx.chunk_rows or bwd_chunk_rows(N, V, torch.finfo(gemm_dtype).bits // 8)
        d_buf = torch.empty(min(C, N), V, dtype=gemm_dtype, device=h.device)
        g = grad_logp.float().contiguous()
        gh = torch.empty(N, H, dtype=ctx.dtypes[0], device=h.device) if need_h else None
        gw = torch.zeros(V, H, dtype=torch.float32, device=h.device) if need_w else None
        for c0 in range(0, N, C):
            c1 = min(c0 + C, N)
            n = c1 - c0
            h_c, d = h[c0:c1], d_buf[:n]
            _launch("dlogits_kernel", lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(V, meta["BLOCK_V"])),
                    (h_c, w, y[c0:c1], lse[c0:c1], g[c0:c1], d, n, V, H, h.stride(0), w.stride(0), d.stride(0)),
                    blocks=ctx.blocks, upcast=ctx.upcast, precision=ctx.precision)
            if need_h:
                if gh.dtype == gemm_dtype:
                    torch.mm(d, w_g, out=gh[c0:c1])
                else:
                    gh[c0:c1] = torch.mm(d, w_g)
            if need_w:
                _accumulate_wgrad(gw, d, h_c if h_c.dtype == gemm_dtype else h_c.to(gemm_dtype))
        return gh, (gw.to(ctx.dtypes[1]) if need_w else None), None, None, None, None, None, None


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
    `bwd_chunk_rows`: rows per backward chunk (default `bwd_chunk_rows(...)`, a 512 MiB buffer).
    `fp32_precision`: dot mode when an operand is FP32 (`FP32_PRECISIONS`; None: `resolve_fp32_precision`,
    "tf32x3" on CUDA; the FP32 backward GEMMs follow torch's `torch.backends.cuda.matmul` setting instead).
    """
    validate_head_inputs(hidden, weight, targets, 0)
    given = (block_n, block_v, block_h)
    blocks = None
    if any(b is not None for b in given) or not hidden.is_cuda or _interpreting():
        blocks = tuple(b if b is not None else d for b, d in zip(given, INTERPRET_BLOCKS))
        for b in blocks:
            if b < 1 or b & (b - 1):
                raise ValueError(f"block sizes must be powers of two, got {blocks}")
    for name, v in (("v_splits", v_splits), ("bwd_chunk_rows", bwd_chunk_rows)):
        if v is not None and v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    fp32_precision = resolve_fp32_precision(fp32_precision, hidden)
    logp, entropy = _TritonLogProb.apply(hidden, weight, targets, blocks, v_splits, bwd_chunk_rows, fp32_precision,
                                         with_entropy)
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
