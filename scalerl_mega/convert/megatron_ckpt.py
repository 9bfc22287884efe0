"""The converter's Megatron checkpoint: per-rank safetensors of Megatron-named, TP-sharded tensors.

Layout of a checkpoint directory::

    megatron_convert.json          format, arch, tp/pp/ep/etp, padded vocab, HF config, full shapes
    hf/                            HF config.json (+ generation/tokenizer files) for the way back
    mp_rank_{tp:02d}_{pp:03d}_{ep:03d}/model.safetensors

Tensor names are global table names (global layer and expert indices). A rank file holds the tensors
of its pipeline stage, TP-sharded for its TP rank; non-expert tensors are stored at EP rank 0 only,
expert ``e`` at the EP rank that owns it. Any reader can rebuild every full tensor from these files
and re-shard it for another layout (``full_tensor``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from scalerl_mega.convert import sharding
from scalerl_mega.convert.dims import ArchDims, dims_from_hf_config
from scalerl_mega.convert.st_io import SafetensorsDir

FORMAT = "scalerl-mega/megatron-shards/1"
META = "megatron_convert.json"


def rank_dir(tp: int, pp: int, ep: int) -> str:
    return f"mp_rank_{tp:02d}_{pp:03d}_{ep:03d}"


class MegatronShards:
    """Read-only view of a converter checkpoint; ``full_tensor`` merges the TP shards of one name."""

    def __init__(self, path: str, *, expect_arch: str | None = None):
        meta_path = os.path.join(path, META)
        if not os.path.isfile(meta_path):
            raise ValueError(f"{path}: not a converter checkpoint ({META} missing)")
        with open(meta_path) as f:
            self.meta: dict[str, Any] = json.load(f)
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path}: format={self.meta.get('format')!r}, expected {FORMAT!r}")
        self.path = path
        self.dims: ArchDims = dims_from_hf_config(self.meta["hf_config"], where=meta_path, expect_arch=expect_arch)
        self.tp, self.pp, self.ep, self.etp = (int(self.meta[k]) for k in ("tp", "pp", "ep", "etp"))
        self.padded_vocab = int(self.meta["padded_vocab_size"])
        self._where: dict[str, list[tuple[int, SafetensorsDir]]] = {}
        for p in range(self.pp):
            for e in range(self.ep):
                for t in range(self.tp):
                    d = os.path.join(path, rank_dir(t, p, e))
                    if not os.path.isdir(d):
                        continue
                    sd = SafetensorsDir(d)
                    for name in sd.names():
                        self._where.setdefault(name, []).append((t, sd))

    def names(self) -> list[str]:
        return list(self._where)

    def full_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.meta["shapes"][name])

    def full_tensor(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ValueError(f"{self.path}: tensor {name!r} is missing")
        parts = sorted(self._where[name], key=lambda x: x[0])
        full = sharding.tp_merge(name, [sd.get(name) for _, sd in parts], dims=self.dims)
        want = self.full_shape(name)
        if tuple(full.shape) != want:
            raise ValueError(f"{self.path}: tensor {name!r} has shape {tuple(full.shape)}, expected {want}")
        return full
