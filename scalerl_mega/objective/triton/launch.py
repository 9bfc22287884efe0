"""Launching the `_kernels` JIT functions: autotune configurations per operand kind, the FP32 dot modes, the
forward's vocabulary splits. `triton` is imported only inside functions (`kernels()`)."""

from __future__ import annotations

import functools
import os

AUTOTUNE_CONFIGS = {
    # (BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages). BLOCK_H is fixed within a list so that the
    # K-accumulation order does not depend on the choice. Compiled for sm_90 on CPU (`python -m
    # scalerl_mega.objective.triton.aot`): 16-bit, bf16x3 and tf32x3 configs use wgmma; configs that do not
    # fit are pruned by the autotuner.
    "16bit": (  # bf16/fp16 operands: wgmma tensor-core dots
        (128, 128, 64, 8, 3),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 3),
        (128, 128, 64, 8, 2),
    ),
    "bf16x3": (  # FP32 operands as exact bf16 pieces (objective/bf16_split.py): 3 or 6 wgmma dots per slice
        (128, 128, 64, 8, 2),
        (128, 128, 64, 8, 3),
        (128, 64, 64, 4, 3),
        (64, 128, 64, 4, 3),
        (64, 64, 64, 4, 3),
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
FP32_PRECISIONS = ("bf16x3", "tf32x3", "ieee")
"""Modes for FP32 operands: "bf16x3" (each FP32 operand as three exact bf16 pieces, bf16-valued hidden states
as one, detected: `objective.bf16_split`; wgmma dots, FP32 accuracy; the default on CUDA), "tf32x3" (tensor
cores, 3 TF32 products per term in the kernel, FP32 cuBLAS GEMMs in the backward) or "ieee" (exact FP32
products on CUDA-core FMAs; the default off CUDA). Never plain TF32."""
DEFAULT_CUDA_FP32_PRECISION = "bf16x3"
INTERPRET_BLOCKS = (32, 64, 32)
"""Fixed (BLOCK_N, BLOCK_V, BLOCK_H) when no block size is given and no GPU autotuning is possible."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_fp32_precision(precision: str | None, hidden) -> str:
    """`precision` if given, else `DEFAULT_CUDA_FP32_PRECISION` for CUDA inputs outside the interpreter and
    "ieee" otherwise. ValueError naming `fp32_precision` for an unknown mode."""
    if precision is None:
        precision = DEFAULT_CUDA_FP32_PRECISION if hidden.is_cuda and not interpreting() else "ieee"
    if precision not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision={precision!r} is not one of {list(FP32_PRECISIONS)}")
    return precision


@functools.cache
def kernels():
    import triton

    from scalerl_mega.objective.triton import _kernels as k

    return triton, k


def config_kind(upcast: bool, precision: str, *, pieces: bool = False) -> str:
    """The AUTOTUNE_CONFIGS list for FP32 operands (`upcast`) in `precision`, for bf16 pieces (`pieces`: the
    bf16x3 path's kernels, split_path.py), or for 16-bit operands."""
    if pieces:
        return "bf16x3"
    if not upcast:
        return "16bit"
    return precision if precision == "tf32x3" else "fp32"


@functools.cache
def _tuned(name: str, kind: str):
    """`_kernels.<name>` under `triton.autotune` over AUTOTUNE_CONFIGS[kind] (GPU only)."""
    triton, k = kernels()
    configs = [triton.Config(dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh), num_warps=w, num_stages=s)
               for bn, bv, bh, w, s in AUTOTUNE_CONFIGS[kind]]
    kernel = getattr(k, name)
    # tuned per shape and per compiled variant (the entropy variant and the piece counts change registers)
    flags = [f for f in ("WITH_ENTROPY", "HP", "WP", "DP") if f in kernel.arg_names]
    return triton.autotune(configs=configs, key=["H", "V", *flags])(kernel)


def launch(name: str, grid, args: tuple, *, blocks: tuple[int, int, int] | None, upcast: bool,
           precision: str, **constexprs) -> None:
    """Launch `_kernels.<name>`: autotuned when `blocks` is None, else with these (BLOCK_N, BLOCK_V, BLOCK_H).

    `grid(meta) -> tuple` receives the block sizes (as Triton's autotuner passes them); `constexprs`: the
    kernel's other compile-time flags (WITH_ENTROPY, HP, WP, DP). The configuration list (`config_kind`)
    follows the operands: bf16 pieces (any of HP, WP, DP > 1), FP32 (`upcast`, by `precision`) or 16-bit;
    the kernels' PRECISION is "ieee" unless FP32 operands run in tf32x3."""
    _, k = kernels()
    dot_precision = precision if upcast and precision == "tf32x3" else "ieee"
    flags = dict(UPCAST=upcast, PRECISION=dot_precision, **constexprs)
    if blocks is None:
        pieces = constexprs.get("HP", 1) > 1 or constexprs.get("WP", 1) > 1 or constexprs.get("DP", 1) > 1
        _tuned(name, config_kind(upcast, precision, pieces=pieces))[grid](*args, **flags)
        return
    meta = dict(BLOCK_N=blocks[0], BLOCK_V=blocks[1], BLOCK_H=blocks[2])
    getattr(k, name)[grid(meta)](*args, **meta, **flags)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_v_splits(N: int, V: int, *, sm_count: int | None) -> int:
    """Vocabulary splits of the forward grid: about 2 programs per SM (row blocks of 128 assumed), each
    split at least 4096 vocabulary entries; 1 without a GPU (the interpreter runs programs serially)."""
    if not sm_count:
        return 1
    return max(1, min(cdiv(2 * sm_count, cdiv(N, 128)), cdiv(V, 4096)))


def sm_count(device) -> int | None:
    """Streaming multiprocessors of a CUDA `device`, None elsewhere (or under the interpreter)."""
    import torch

    if device.type != "cuda" or interpreting():
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count
