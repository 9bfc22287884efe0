"""Compile the fused log-prob kernels for a GPU target on a machine without a GPU, and report what a launch would
get: registers, spill bytes, shared memory, and which dot instructions the PTX uses.

Triton compiles to PTX and, with the `ptxas` its wheel ships, to a cubin without a driver; only launching
needs one. This checks, on CPU, what the interpreter cannot: that FP32 dots lower to FMA instructions (IEEE)
rather than TF32 tensor-core `mma`/`wgmma`, that bf16 dots use `wgmma` on sm_90, that the bf16x3 path (FP32
operands as bf16 pieces, `split_path`) lowers to bf16 `wgmma` only, 3 (6) per 16-deep step with one (three)
hidden-state pieces, and which autotune configurations spill. Launch-time specialisation is mimicked: pointers and integer arguments are marked
16-divisible, as Triton does at launch for 16-aligned tensors and multiples of 16 (N, V, H and the strides
of real shapes). Not covered: speed, and anything the driver decides at load time.

    python -m scalerl_mega.objective.triton.aot            # every AUTOTUNE_CONFIGS entry, sm_90
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
DTYPES = {
    # name: (hidden pointer, weight pointer, dlogits pointer, HP, WP, DP). The bf16x3 rows are what the
    # launcher passes for FP32 operands in that mode (objective/triton/split_path.py): bf16 pieces.
    "bf16": ("bf16", "bf16", "bf16", 1, 1, 1),
    "fp16": ("fp16", "fp16", "fp16", 1, 1, 1),
    "fp32": ("fp32", "fp32", "fp32", 1, 1, 1),
    "bf16+fp32": ("bf16", "fp32", "fp32", 1, 1, 1),
    "bf16x3 h1w3": ("bf16", "bf16", "bf16", 1, 3, 3),  # bf16-valued hidden states x FP32 weight
    "bf16x3 h3w3": ("bf16", "bf16", "bf16", 3, 3, 3),  # general FP32 hidden states x FP32 weight
}
"""`dtype` names of `compile_kernel`: the kernel's pointer types and piece counts. "bf16+fp32": bf16 hidden
states with an FP32 weight on the plain path (FP32 operands in the kernel and an FP32 dlogits buffer)."""


@dataclass(frozen=True)
class CompileReport:
    kernel: str
    dtype: str
    precision: str
    config: tuple[int, int, int, int, int]
    registers: int
    spill_bytes: int
    shared_bytes: int
    wgmma: bool
    mma_sync: bool
    tf32: bool
    fma_f32: int
    wgmma_count: int = 0


def _signature(kernel: str, dtype: str) -> dict[str, str]:
    h, w, d, *_ = DTYPES[dtype]
    ph, pw, pd = _PTR[h], _PTR[w], _PTR[d]
    pieces = {"h_ptr": ph, "h1_ptr": ph, "h2_ptr": ph, "w_ptr": pw, "w1_ptr": pw, "w2_ptr": pw}
    if kernel == "logprob_fwd_kernel":
        ptrs = {**pieces, "y_ptr": "*i64", "m_ptr": "*fp32", "s_ptr": "*fp32", "t_ptr": "*fp32", "z_ptr": "*fp32"}
        ints = ("N", "V", "H", "stride_h", "stride_w")
        flags = ("BLOCK_N", "BLOCK_V", "BLOCK_H", "UPCAST", "PRECISION", "WITH_ENTROPY", "HP", "WP")
    elif kernel == "dlogits_kernel":
        ptrs = {**pieces, "y_ptr": "*i64", "lse_ptr": "*fp32", "g_ptr": "*fp32", "d_ptr": pd, "d1_ptr": pd,
                "d2_ptr": pd}
        ints = ("N", "V", "H", "stride_h", "stride_w", "stride_d")
        flags = ("BLOCK_N", "BLOCK_V", "BLOCK_H", "UPCAST", "PRECISION", "HP", "WP", "DP")
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    return {**ptrs, **{n: "i32" for n in ints}, **{n: "constexpr" for n in flags}}


def compile_kernel(kernel: str, dtype: str, config: tuple[int, int, int, int, int], *, arch: int = 90,
                   precision: str = "ieee", fn=None, with_entropy: bool = False) -> CompileReport:
    """Compile `_kernels.<kernel>` (or `fn`, with the same signature) for sm_<arch> with `config` =
    (BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages) and operands `dtype` (a `DTYPES` name); UPCAST as the
    launcher sets it (FP32 operands), `precision` the FP32 dot mode ("ieee" or "tf32x3"), `with_entropy`
    the forward's WITH_ENTROPY."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from scalerl_mega.objective.triton import _kernels

    bn, bv, bh, warps, stages = config
    h, w, _, hp, wp, dp = DTYPES[dtype]
    sig = _signature(kernel, dtype)
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t != "constexpr"}
    constexprs = {"BLOCK_N": bn, "BLOCK_V": bv, "BLOCK_H": bh, "UPCAST": "fp32" in (h, w),
                  "PRECISION": precision, "HP": hp, "WP": wp}
    if kernel == "logprob_fwd_kernel":
        constexprs["WITH_ENTROPY"] = with_entropy
    else:
        constexprs["DP"] = dp
    src = ASTSource(fn=fn or getattr(_kernels, kernel), signature=sig, attrs=attrs, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        suffix = "a" if arch == 90 else ""
        # the same ptxas and register-allocation option Triton's own cubin step uses
        log = subprocess.run([get_ptxas(arch).path, "-v", "--regAllocOptLevel=2", f"--gpu-name=sm_{arch}{suffix}",
                              str(path), "-o", str(path.with_suffix(".cubin"))],
                             capture_output=True, text=True, check=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return CompileReport(kernel=kernel, dtype=dtype, precision=precision, config=config,
                         registers=int(regs[-1]) if regs else -1,
                         spill_bytes=int(spills[-1]) if spills else 0, shared_bytes=int(compiled.metadata.shared),
                         wgmma="wgmma" in ptx, mma_sync="mma.sync" in ptx, tf32=".tf32" in ptx,
                         fma_f32=ptx.count("fma.rn.f32"), wgmma_count=len(re.findall(r"wgmma\.mma_async", ptx)))


ROWS = (  # (dtype, precision, configuration list) of `main`'s table
    ("bf16", "ieee", "16bit"), ("fp32", "ieee", "fp32"), ("fp32", "tf32x3", "tf32x3"), ("bf16+fp32", "ieee", "fp32"),
    ("bf16+fp32", "tf32x3", "tf32x3"), ("bf16x3 h1w3", "ieee", "bf16x3"), ("bf16x3 h3w3", "ieee", "bf16x3"),
)


def main() -> int:
    from scalerl_mega.objective.triton.launch import AUTOTUNE_CONFIGS

    print(f"{'kernel':<26} {'operands':<18} {'config (BN,BV,BH,warps,stages)':<32} {'regs':>4} {'spill B':>7} "
          f"{'smem KiB':>8}  dots")
    for dtype, precision, kind in ROWS:
        for kernel, with_entropy in (("logprob_fwd_kernel", False), ("logprob_fwd_kernel", True),
                                     ("dlogits_kernel", False)):
            for config in AUTOTUNE_CONFIGS[kind]:
                r = compile_kernel(kernel, dtype, config, precision=precision, with_entropy=with_entropy)
                dots = (f"wgmma x{r.wgmma_count}" if r.wgmma else "") + (" mma.sync" if r.mma_sync else "") + \
                    (" tf32" if r.tf32 else "") + (f" fma.f32 x{r.fma_f32}" if r.fma_f32 > 16 else "")
                name = dtype if "fp32" not in DTYPES[dtype][:2] else f"{dtype}/{precision}"
                label = kernel + ("+entropy" if with_entropy else "")
                print(f"{label:<26} {name:<18} {str(config):<32} {r.registers:>4} {r.spill_bytes:>7} "
                      f"{r.shared_bytes / 1024:8.0f}  {dots.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
