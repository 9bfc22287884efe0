"""Streaming safetensors I/O with bounded memory.

``read_tensor`` reads one tensor with a plain ``seek``/``readinto`` (no mmap, so the resident set
holds only that tensor). ``ShardedWriter`` appends tensors one at a time to a body file and writes
the header when a shard is closed, rolling to a new shard past ``max_shard_bytes``; ``finish``
renames the shards ``model-0000i-of-0000N.safetensors`` and writes the HF index. Each tensor's
SHA-256 is recorded for the checksum summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,  # blockwise FP8 checkpoints (DeepSeek-V3, Qwen3-*-FP8)
    "F8_E5M2": torch.float8_e5m2,
}
_CODES = {v: k for k, v in _DTYPES.items()}


def read_header(path: str) -> dict[str, Any]:
    """Header of a safetensors file: {name: {"dtype", "shape", "data_offsets"}} plus "__data_start__"."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    header["__data_start__"] = 8 + n
    return header


def read_tensor(path: str, header: dict[str, Any], name: str, *, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """One tensor; `rows=(lo, hi)`: only [lo:hi] of its first dimension (a contiguous byte range)."""
    info = header[name]
    start, end = info["data_offsets"]
    dtype = _DTYPES[info["dtype"]]
    shape = list(info["shape"])
    if rows is not None:
        lo, hi = rows
        if not (shape and 0 <= lo < hi <= shape[0]):
            raise ValueError(f"{path}: rows {rows} out of range for tensor {name!r} of shape {tuple(shape)}")
        row_bytes = (end - start) // shape[0]
        start, end, shape[0] = start + lo * row_bytes, start + hi * row_bytes, hi - lo
    out = torch.empty(shape, dtype=dtype)
    if end > start:
        buf = out.view(-1).view(torch.uint8) if out.dim() else out.reshape(1).view(torch.uint8)
        with open(path, "rb") as f:
            f.seek(header["__data_start__"] + start)
            got = f.readinto(memoryview(buf.numpy()))
        if got != end - start:
            raise ValueError(f"{path}: tensor {name!r} is truncated ({got} of {end - start} bytes)")
    return out


def tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().contiguous().cpu()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


class _Shard:
    def __init__(self, path: str):
        self.path = path
        self.body_path = path + ".body"
        self.body = open(self.body_path, "wb")
        self.header: dict[str, Any] = {}
        self.size = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        data = tensor_bytes(t)
        self.body.write(data)
        self.header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [self.size, self.size + len(data)]}
        self.size += len(data)

    def close(self, metadata: dict[str, str] | None = None) -> None:
        self.body.close()
        header = dict(self.header)
        header["__metadata__"] = metadata or {"format": "pt"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        with open(self.path, "wb") as out, open(self.body_path, "rb") as body:
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)
            shutil.copyfileobj(body, out, length=16 << 20)
        os.remove(self.body_path)


class ShardedWriter:
    """Write tensors into HF-style safetensors shards, streaming one tensor at a time."""

    def __init__(self, directory: str, *, max_shard_bytes: int = 2 << 30, prefix: str = "model"):
        self.directory = directory
        self.max_shard_bytes = max_shard_bytes
        self.prefix = prefix
        self.shards: list[_Shard] = []
        self.weight_map: dict[str, int] = {}
        self.checksums: dict[str, str] = {}
        self.total_bytes = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        if name in self.weight_map:
            raise ValueError(f"tensor {name!r} written twice")
        nbytes = t.numel() * t.element_size()
        if not self.shards or (self.shards[-1].size and self.shards[-1].size + nbytes > self.max_shard_bytes):
            if self.shards:
                self.shards[-1].close()
            self.shards.append(_Shard(os.path.join(self.directory, f".{self.prefix}-part{len(self.shards):05d}.safetensors")))
        self.shards[-1].add(name, t)
        self.weight_map[name] = len(self.shards) - 1
        self.checksums[name] = sha256(t)
        self.total_bytes += nbytes

    def finish(self, *, always_index: bool = False) -> list[str]:
        """Close the last shard, give shards their final names, write the index (also for a single
        shard with ``always_index``); return file names."""
        if self.shards:
            self.shards[-1].close()
        n = len(self.shards)
        if n == 1:
            names = [f"{self.prefix}.safetensors"]
        else:
            names = [f"{self.prefix}-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        for shard, final in zip(self.shards, names):
            os.replace(shard.path, os.path.join(self.directory, final))
        if n > 1 or always_index:
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": {name: names[k] for name, k in self.weight_map.items()},
            }
            with open(os.path.join(self.directory, f"{self.prefix}.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
        return names


class SafetensorsDir:
    """Tensor lookup over a directory of safetensors files (HF layout, with or without index)."""

    def __init__(self, directory: str):
        self.directory = directory
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors") and not f.startswith("."))
        if not files:
            raise ValueError(f"{directory}: no .safetensors files")
        self.headers = {f: read_header(os.path.join(directory, f)) for f in files}
        self.location: dict[str, str] = {}
        for f, h in self.headers.items():
            for name in h:
                if name != "__data_start__":
                    if name in self.location:
                        raise ValueError(f"{directory}: tensor {name!r} is in both {self.location[name]} and {f}")
                    self.location[name] = f

    def names(self) -> list[str]:
        return list(self.location)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.headers[self.location[name]][name]["shape"])

    def nbytes(self, name: str) -> int:
        start, end = self.headers[self.location[name]][name]["data_offsets"]
        return end - start

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self.headers[self.location[name]][name]["dtype"]]

    def get(self, name: str) -> torch.Tensor:
        f = self.location[name]
        return read_tensor(os.path.join(self.directory, f), self.headers[f], name)

    def file_sizes(self) -> dict[str, int]:
        return {f: os.path.getsize(os.path.join(self.directory, f)) for f in self.headers}
