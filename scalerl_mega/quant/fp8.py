"""Blockwise FP8 weights in the format of DeepSeek-V3 and Qwen3-*-FP8 checkpoints: `<linear>.weight` in
float8_e4m3fn plus `<linear>.weight_scale_inv`, one FP32 scale per 128x128 block ([ceil(out/128), ceil(in/128)]),
the weight being `weight.float() * weight_scale_inv` block by block (the scale is the dequantization multiplier,
despite its name). This is what SGLang's `--quantization fp8` block path and transformers' fine-grained FP8
loader read, so the same tensors serve a checkpoint on disk and a weight sync on the wire.

Quantization: per block, scale = amax / 448 (448 = largest finite e4m3 value), q = round_e4m3(w / scale). The
scale is snapped to a fixpoint of s -> fl32(fl32(448 s) / 448) (at most one float32 ulp away), so re-quantizing
a dequantized block gives back the same q and the same scale bit for bit: a trainer that starts from an FP8
checkpoint and syncs it unchanged sends exactly that checkpoint. An all-zero block has scale 1.

Which tensors: the 2-D linear projections inside the decoder layers (`model.layers.N...._proj.weight`, MLA's
`kv_a_proj_with_mqa`); norms, routers (`mlp.gate`, `feed_forward.router`), embeddings, the LM head and fused 3-D
expert tensors keep their precision, as in the published checkpoints and the field's FP8 senders. A Gated DeltaNet
layer's projections are those SGLang 0.5.23 serves in FP8 from the published Qwen3-Next-80B-A3B-Instruct-FP8 and
Qwen3.5-*-FP8 checkpoints: `in_proj_qkvz` (Qwen3-Next; Qwen3.5's `in_proj_qkv` and `in_proj_z`, which SGLang merges
into it) and `out_proj`. Its `in_proj_ba` (Qwen3.5: `in_proj_b`, `in_proj_a`), the per-value-head beta and decay
gates, stays in the model's dtype: SGLang builds it with the quant config too, but those checkpoints list it in
`quantization_config.modules_to_not_convert` (its 2 x value-heads rows are no whole 128-row block, none at all once
split over TP), so an FP8 checkpoint written here lists it as well (`modules_to_not_convert`); the depthwise conv1d
SGLang builds unquantized (`quant_config=None`).

Pure torch, device-agnostic (tensors stay where they are).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value."""
BLOCK = (128, 128)
"""(rows, columns) of a scale block: DeepSeek-V3's and Qwen3-FP8's `weight_block_size`."""
SCALE_SUFFIX = "_scale_inv"
"""`<name>` + this is the scale of FP8 tensor `<name>` (`...weight` -> `...weight_scale_inv`)."""
QUANTIZATIONS = ("none", "fp8")
"""`rollout.quantization` values: the generator's weight format."""

_LINEAR = re.compile(r"(^|\.)layers\.\d+\.(.*_proj(_with_mqa)?|linear_attn\.in_proj_(qkvz|qkv|z))\.weight$")
_KEPT_LINEAR = re.compile(r"(^|\.)layers\.\d+\.linear_attn\.in_proj_(ba|b|a)\.weight$")


def is_fp8_weight(name: str, shape: Iterable[int]) -> bool:
    """Whether the HF tensor `name` of `shape` travels (and is stored) in FP8: a 2-D linear projection of a
    decoder layer (module doc)."""
    return len(tuple(shape)) == 2 and bool(_LINEAR.search(name))


def modules_to_not_convert(names: Iterable[str]) -> list[str]:
    """The modules among the HF tensor `names` that an FP8 checkpoint declares unquantized although SGLang builds
    them with its FP8 config: a Gated DeltaNet layer's b/a projections (module doc), without `.weight`."""
    return [n[: -len(".weight")] for n in names if _KEPT_LINEAR.search(n)]


def scale_name(name: str) -> str:
    return name + SCALE_SUFFIX


def scale_shape(shape: Iterable[int], *, block: tuple[int, int] = BLOCK) -> tuple[int, int]:
    """[ceil(rows / block rows), ceil(cols / block cols)] of a 2-D weight's scales."""
    rows, cols = (int(s) for s in shape)
    return math.ceil(rows / block[0]), math.ceil(cols / block[1])


def _snap(scale: torch.Tensor) -> torch.Tensor:
    """The nearby fixpoint of s -> (448 s) / 448 in float32 (module doc)."""
    return (scale * FP8_MAX) / FP8_MAX


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[R, C] -> zero-padded [R/br, br, C/bc, bc] float32 view of the blocks."""
    br, bc = block
    nr, nc = scale_shape(x.shape, block=block)
    x = torch.nn.functional.pad(x.float(), (0, nc * bc - x.shape[1], 0, nr * br - x.shape[0]))
    return x.view(nr, br, nc, bc)


def quantize_blockwise(w: torch.Tensor, *, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(q float8_e4m3fn of w's shape, scale_inv float32 [ceil(R/br), ceil(C/bc)]) of a 2-D weight (module doc)."""
    if w.dim() != 2:
        raise ValueError(f"blockwise FP8 quantizes 2-D weights; got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"cannot quantize a weight of shape {tuple(w.shape)} holding inf or NaN")
    x = _blocks(w, block)
    amax = x.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, _snap(amax / FP8_MAX), torch.ones_like(amax))
    q = (x / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    rows, cols = w.shape
    return q.view(x.shape[0] * block[0], -1)[:rows, :cols].contiguous(), scale


def dequantize_blockwise(q: torch.Tensor, scale_inv: torch.Tensor, *, block: tuple[int, int] = BLOCK,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q.float() * scale_inv per block, in `dtype` (the product is formed in float32, then cast)."""
    if q.dim() != 2 or tuple(scale_inv.shape) != scale_shape(q.shape, block=block):
        raise ValueError(f"FP8 weight {tuple(q.shape)} needs scales of shape {scale_shape(q.shape, block=block)} "
                         f"for {block[0]}x{block[1]} blocks; got {tuple(scale_inv.shape)}")
    s = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return (q.float() * s[: q.shape[0], : q.shape[1]]).to(dtype)


def quantize_named(named_tensors: Iterable[tuple[str, torch.Tensor]], *, block: tuple[int, int] = BLOCK
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors with every FP8 weight (`is_fp8_weight`) replaced by its FP8 tensor followed by its scale
    (`scale_name`); the others pass unchanged. Lazy: one tensor at a time."""
    for name, t in named_tensors:
        if is_fp8_weight(name, t.shape):
            q, s = quantize_blockwise(t, block=block)
            yield name, q
            yield scale_name(name), s
        else:
            yield name, t


def quantized_shapes(name: str, shape: tuple[int, ...], *, block: tuple[int, int] = BLOCK
                     ) -> list[tuple[str, tuple[int, ...], str | None]]:
    """What `quantize_named` makes of one tensor, as (name, shape, dtype name; None = unchanged)."""
    if not is_fp8_weight(name, shape):
        return [(name, tuple(shape), None)]
    return [(name, tuple(shape), "float8_e4m3fn"), (scale_name(name), scale_shape(shape, block=block), "float32")]


def dequantize_named(named_tensors: Iterable[tuple[str, torch.Tensor]], *, block: tuple[int, int] = BLOCK,
                     dtype: torch.dtype = torch.float32) -> list[tuple[str, torch.Tensor]]:
    """The inverse of `quantize_named` over a whole update (a weight and its scale may arrive in different
    buckets): each FP8 tensor dequantized with its scale into `dtype`, the scales dropped, order kept. ValueError
    naming the tensor for an FP8 tensor without its scale, or a scale without its FP8 tensor."""
    items = list(named_tensors)
    scales = {n: t for n, t in items if n.endswith(SCALE_SUFFIX)}
    weights = {n for n, t in items if t.dtype == FP8_DTYPE}
    orphans = sorted(n for n in scales if n[: -len(SCALE_SUFFIX)] not in weights)
    if orphans:
        raise ValueError(f"FP8 scale {orphans[0]!r} came without its float8_e4m3fn weight "
                         f"{orphans[0][: -len(SCALE_SUFFIX)]!r}")
    out = []
    for name, t in items:
        if name in scales:
            continue
        if t.dtype == FP8_DTYPE:
            if scale_name(name) not in scales:
                raise ValueError(f"FP8 weight {name!r} came without its scale {scale_name(name)!r}")
            t = dequantize_blockwise(t, scales[scale_name(name)], block=block, dtype=dtype)
        out.append((name, t))
    return out


def bytes_per_param(quantization: str, *, dtype_bytes: float = 2.0, block: tuple[int, int] = BLOCK) -> float:
    """Bytes one parameter of an FP8-eligible weight (`is_fp8_weight`) costs on the wire and in the generator
    under `quantization` ("none": `dtype_bytes`, the unquantized dtype's size; "fp8": one byte plus its share of
    a float32 scale per block, 1 + 4 / (128 * 128) = 1.000244). Tensors that are never quantized (norms,
    routers, embeddings, head) keep `dtype_bytes` under either mode."""
    if quantization == "none":
        return float(dtype_bytes)
    if quantization == "fp8":
        return 1.0 + 4.0 / (block[0] * block[1])
    raise ValueError(f"quantization={quantization!r} is not one of {QUANTIZATIONS}")
