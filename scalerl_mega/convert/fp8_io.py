"""Blockwise FP8 checkpoints (DeepSeek-V3 / Qwen3-*-FP8 format, quant/fp8.py) on disk: read dequantized, written
quantized.

`checkpoint_reader(src, config, ...)` puts a dequantizing view over a checkpoint reader (`load.HFShardReader` for
`init_from_hf`, `st_io.SafetensorsDir` for the converter) when `config.json` declares blockwise FP8: its names are
the checkpoint's without the `weight_scale_inv` tensors, and each FP8 weight is read as `weight * scale` per block
in the trainer's precision, so everything downstream (name and shape validation, the conversion tables, sharding)
sees an unquantized checkpoint. Any other `quantization_config` is refused, naming the format
(`quant.checkpoint.checkpoint_fp8_block`).

`quantize_hf_dir(directory)` rewrites an unquantized HF directory in place as a blockwise FP8 checkpoint (the
linear projections in FP8 with their scales, `quantization_config` in config.json, listing the linear modules left
unquantized that SGLang would otherwise build in FP8: quant/fp8.py): what an SGLang server started with
`--quantization fp8` loads, and how the tests make FP8 checkpoints from the tiny ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Protocol

import torch

from scalerl_mega.jsonvalue import JSON

from scalerl_mega.quant import fp8
from scalerl_mega.quant.checkpoint import checkpoint_fp8_block, fp8_quantization_config


class CheckpointReader(Protocol):
    """What the loaders read a checkpoint through (`load.HFShardReader`, `st_io.SafetensorsDir`)."""

    directory: str

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str) -> torch.Tensor: ...


class Fp8DequantReader:
    """A checkpoint reader whose blockwise-FP8 weights come out dequantized into `dtype` (module doc); other
    attributes (`opened`, `bytes_read`, `location`, ...) are the wrapped reader's."""

    def __init__(self, src: CheckpointReader, *, block: tuple[int, int], dtype: torch.dtype) -> None:
        self.src = src
        self.block = block
        self.dtype = dtype
        names = list(src.names())
        self._scales = {n for n in names if n.endswith(fp8.SCALE_SUFFIX)}
        self._names = [n for n in names if n not in self._scales]
        present = set(self._names)
        orphans = sorted(n for n in self._scales if n[: -len(fp8.SCALE_SUFFIX)] not in present)
        if orphans:
            raise ValueError(f"{src.directory}: FP8 scale {orphans[0]!r} has no weight "
                             f"{orphans[0][: -len(fp8.SCALE_SUFFIX)]!r} in the checkpoint")

    def __getattr__(self, name: str) -> object:
        return getattr(self.src, name)

    def names(self) -> list[str]:
        return list(self._names)

    def get(self, name: str, *, rows: tuple[int, int] | None = None) -> torch.Tensor:
        if fp8.scale_name(name) not in self._scales:
            t = self.src.get(name) if rows is None else self.src.get(name, rows=rows)  # type: ignore[call-arg]
            if t.dtype == fp8.FP8_DTYPE:
                raise ValueError(f"{self.src.directory}: {name!r} is float8_e4m3fn but the checkpoint has no "
                                 f"{fp8.scale_name(name)!r} for it")
            return t
        if rows is not None:
            raise ValueError(f"{self.src.directory}: {name!r} is blockwise FP8; reading a row range of it is not "
                             "supported (fused expert tensors are not FP8 in this format)")
        q = self.src.get(name)
        try:
            return fp8.dequantize_blockwise(q, self.src.get(fp8.scale_name(name)), block=self.block, dtype=self.dtype)
        except ValueError as exc:
            raise ValueError(f"{self.src.directory}: {name!r}: {exc}") from exc

    def nbytes(self, name: str) -> int:
        return int(torch.Size(self.src.shape(name)).numel()) * self.dtype.itemsize


def checkpoint_reader(src: CheckpointReader, config: Mapping[str, JSON], *, where: str,
                      dtype: torch.dtype) -> CheckpointReader:
    """`src` itself for an unquantized checkpoint, a `Fp8DequantReader` into `dtype` for blockwise FP8;
    ValueError naming `where` and the format for any other quantization."""
    block = checkpoint_fp8_block(config, where=where)
    return src if block is None else Fp8DequantReader(src, block=block, dtype=dtype)


def unquantized_config(config: Mapping[str, JSON]) -> dict[str, JSON]:
    """`config` without its `quantization_config` (a dequantized copy of the checkpoint is not FP8)."""
    out = dict(config)
    out.pop("quantization_config", None)
    text = out.get("text_config")
    if isinstance(text, Mapping):
        out["text_config"] = {k: v for k, v in text.items() if k != "quantization_config"}
    return out


def quantize_hf_dir(directory: str, *, block: tuple[int, int] = fp8.BLOCK) -> int:
    """Rewrite the HF checkpoint in `directory` as blockwise FP8 in place (module doc); returns how many weights
    became FP8. Each safetensors file is rewritten whole (tiny and test checkpoints, the SGLang launch copy)."""
    from safetensors.torch import load_file, save_file

    cfg_path = os.path.join(directory, "config.json")
    with open(cfg_path) as f:
        config = json.load(f)
    if checkpoint_fp8_block(config, where=cfg_path) is not None:
        raise ValueError(f"{cfg_path}: the checkpoint is blockwise FP8 already")
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    count, total = 0, 0
    index: dict[str, str] = {}
    kept: list[str] = []
    for file in files:
        path = os.path.join(directory, file)
        tensors = dict(fp8.quantize_named(load_file(path).items(), block=block))
        count += sum(t.dtype == fp8.FP8_DTYPE for t in tensors.values())
        kept += fp8.modules_to_not_convert(tensors)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file({n: t.contiguous() for n, t in tensors.items()}, path, metadata={"format": "pt"})
        index.update({n: file for n in tensors})
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            meta = json.load(f)
        meta["weight_map"] = index
        meta.setdefault("metadata", {})["total_size"] = total
        with open(index_path, "w") as f:
            json.dump(meta, f, indent=2)
    config["quantization_config"] = fp8_quantization_config(block, not_convert=sorted(kept))
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=2)
    return count
