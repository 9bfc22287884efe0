"""Load converted weights into a live, TP/PP/EP-sharded Megatron ``GPTModel`` on this rank.

Every rank reads only the full tensors of its own parameters (one at a time), re-pads the
vocabulary to the model's size and copies its TP/EP shard. Works for any checkpoint layout.

From an HF checkpoint (`init_from_hf`, ``load_hf_checkpoint``) a rank opens only the safetensors shards
that hold its tensors (names are located by ``model.safetensors.index.json``; a shard's header is read
on first use), and of a fused expert tensor (Llama-4 ``experts.gate_up_proj`` [E, H, 2F]) it reads only
the rows of its own experts (a contiguous byte range), so an EP-16 rank reads 1/16 of the experts; of
per-expert tensors (Qwen3-MoE ``mlp.experts.{e}.gate_proj.weight``) it opens only its own experts'.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Iterable

import torch

from scalerl_mega.convert import layout, sharding, tables
from scalerl_mega.convert.dims import ArchDims
from scalerl_mega.trainer.megatron.global_names import global_params, unwrap

log = logging.getLogger(__name__)


def _tp(is_expert: bool) -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    if is_expert:
        return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def load_full_tensors(model, *, dims: ArchDims, full_tensor: Callable[[str], torch.Tensor]) -> list[str]:
    """Copy ``full_tensor(global_name)`` (unsharded, any vocab padding) into this rank's parameters.
    Returns the global names loaded; raises ValueError naming a tensor whose shard shape differs."""
    loaded = []
    for gpt in unwrap(model):
        for name, param in global_params(gpt, dims).items():
            source = name
            if name == "output_layer.weight" and dims.tie_word_embeddings:
                source = "embedding.word_embeddings.weight"  # last-stage copy of tied embeddings
            full = full_tensor(source)
            rank, size = _tp(sharding.expert_index(name) is not None)
            if name.endswith(("word_embeddings.weight", "output_layer.weight")):
                full = layout.pad_vocab(layout.unpad_vocab(full, vocab=dims.vocab_size), padded_vocab=param.shape[0] * size)
            shard = sharding.tp_shard(name, full, rank=rank, size=size, dims=dims)
            if tuple(shard.shape) != tuple(param.shape):
                raise ValueError(f"tensor {name!r}: checkpoint shard has shape {tuple(shard.shape)}, model parameter has {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(shard)
            loaded.append(name)
    return loaded


def load_megatron_checkpoint(model, ckpt_dir: str, *, dims: ArchDims | None = None) -> list[str]:
    """Load a converter checkpoint (``tools/convert_hf_to_megatron.py`` output, any layout)."""
    from scalerl_mega.convert.megatron_ckpt import MegatronShards

    ck = MegatronShards(ckpt_dir, expect_arch=dims.arch if dims else None)
    if dims is not None and dims != ck.dims:
        diff = [f.name for f in ck.dims.__dataclass_fields__.values() if getattr(ck.dims, f.name) != getattr(dims, f.name)]
        raise ValueError(f"{ckpt_dir}: checkpoint config differs from the model in {diff[0]!r}: "
                         f"{getattr(ck.dims, diff[0])!r} (checkpoint) vs {getattr(dims, diff[0])!r} (model)")
    return load_full_tensors(model, dims=ck.dims, full_tensor=ck.full_tensor)


class HFShardReader:
    """Lazy reader of an HF safetensors directory: `opened` lists the shard files whose header was read
    (in order), `bytes_read` the tensor bytes read."""

    INDEX = "model.safetensors.index.json"

    def __init__(self, directory: str):
        from scalerl_mega.convert.st_io import read_header

        self.directory = directory
        self.headers: dict[str, dict] = {}
        self.opened: list[str] = []
        self.bytes_read = 0
        index = os.path.join(directory, self.INDEX)
        if os.path.isfile(index):
            with open(index) as f:
                self.location: dict[str, str] = dict(json.load(f)["weight_map"])
            return
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors") and not f.startswith("."))
        if not files:
            raise ValueError(f"{directory}: no .safetensors files")
        self.location = {}
        for f in files:  # no index: every header has to be read to find the names
            header = self._header(f, read_header)
            for name in header:
                if name != "__data_start__":
                    if name in self.location:
                        raise ValueError(f"{directory}: tensor {name!r} is in both {self.location[name]} and {f}")
                    self.location[name] = f

    def _header(self, file: str, read_header=None) -> dict:
        if file not in self.headers:
            if read_header is None:
                from scalerl_mega.convert.st_io import read_header
            path = os.path.join(self.directory, file)
            if not os.path.isfile(path):
                raise ValueError(f"{self.directory}: {file} (named by {self.INDEX}) does not exist")
            self.headers[file] = read_header(path)
            self.opened.append(file)
        return self.headers[file]

    def names(self) -> list[str]:
        return list(self.location)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header(self.location[name])[name]["shape"])

    def get(self, name: str, *, rows: tuple[int, int] | None = None) -> torch.Tensor:
        from scalerl_mega.convert.st_io import read_tensor

        file = self.location[name]
        t = read_tensor(os.path.join(self.directory, file), self._header(file), name, rows=rows)
        self.bytes_read += t.numel() * t.element_size()
        return t


def hf_tensor_source(src: HFShardReader, hf, dims: ArchDims, *, wanted: Iterable[str]) -> Callable[[str], torch.Tensor]:
    """`full_tensor(global Megatron name)` over an HF checkpoint for a rank that needs the tensors `wanted`:
    reads each HF tensor's shape-checked data once per group (the last two groups are kept), and of a
    fused expert tensor only the rows of the wanted experts."""
    wanted = set(wanted)
    by_name = {n: g for g in tables.iter_groups(dims) for n in g.mcore}
    recent: list[tuple[tables.Group, dict[str, torch.Tensor]]] = []  # the last two groups only

    def read(hf_text_name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        name = hf.hf_name(hf_text_name)
        want, got = tables.expected_hf_shape(hf_text_name, dims), src.shape(name)
        if tuple(got) != tuple(want):
            raise ValueError(f"{src.directory}: tensor {name!r} has shape {tuple(got)}, expected {tuple(want)}")
        return src.get(name, rows=rows)

    def full_tensor(name: str) -> torch.Tensor:
        group = by_name[name]
        for g, tensors in recent:
            if g is group:
                return tensors[name]
        local = [e for e, n in enumerate(group.mcore) if n in wanted or n == name]
        if group.rule.fused_experts and local:  # fused experts [E, ...] in one HF tensor: this rank's rows
            lo, hi = min(local), max(local) + 1
            part = group.to_mcore([read(group.hf[0], rows=(lo, hi))], dims, dims.vocab_size)
            converted = dict(zip(group.mcore[lo:hi], part, strict=True))
        else:
            converted = dict(tables.hf_to_mcore(group, [read(n) for n in group.hf], dims=dims,
                                                padded_vocab=dims.vocab_size))
        recent.append((group, converted))
        del recent[:-2]  # experts interleave fc1/fc2 groups; bounded memory
        return converted[name]

    return full_tensor


def load_hf_checkpoint(model, hf_dir: str, *, dims: ArchDims | None = None) -> list[str]:
    """Load an HF checkpoint directly (each rank converts only the groups it needs). Either layout
    (``convert.hf_layout``): of a multimodal ``Llama4ForConditionalGeneration`` checkpoint the text
    model under ``language_model.`` is loaded and the vision tower is logged and skipped. A blockwise FP8
    checkpoint (``quantization_config``: DeepSeek-V3, Qwen3-*-FP8) is dequantized in FP32 as it is read and lands
    in the parameters' dtype (``convert.fp8_io``)."""
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.fp8_io import checkpoint_reader
    from scalerl_mega.convert.hf_layout import read_layout
    from scalerl_mega.convert.pipeline import validate_hf

    hf = read_layout(hf_dir)
    hf_dims = dims_from_hf_config(hf.text_config, where=f"{hf_dir}/config.json")
    if dims is not None and dims != hf_dims:
        raise ValueError(f"{hf_dir}: HF config does not match the model ({hf_dims} vs {dims})")
    src = checkpoint_reader(HFShardReader(hf_dir), hf.config, where=f"{hf_dir}/config.json", dtype=torch.float32)
    non_text = validate_hf(src, hf_dims, hf, check_shapes=False)  # names; shapes as each tensor is read
    if non_text:
        log.info("%s: %s checkpoint; skipping its %d tensors outside the decoder (vision tower, projector, or "
                 "DeepSeek-V3 multi-token-prediction layers)", hf_dir,
                 hf.kind, len(non_text))
    wanted = {n for gpt in unwrap(model) for n in global_params(gpt, hf_dims)}
    loaded = load_full_tensors(model, dims=hf_dims, full_tensor=hf_tensor_source(src, hf, hf_dims, wanted=wanted))
    log.info("%s: read %d of %d shard files, %.2f GB of tensors", hf_dir, len(src.opened),
             len(set(src.location.values())), src.bytes_read / 1e9)
    return loaded
