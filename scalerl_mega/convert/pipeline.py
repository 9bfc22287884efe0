"""HF <-> Megatron checkpoint conversion, streaming one tensor group at a time.

Both directions validate everything (config, every name, every shape) before the first byte is
written, write into ``<out>.partial`` and rename it to ``<out>`` only on success, so a failed
conversion leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from typing import Callable, Iterable

import torch

from scalerl_mega.convert import hf_layout, sharding, tables
from scalerl_mega.convert.dims import ArchDims, dims_from_hf_config
from scalerl_mega.convert.megatron_ckpt import FORMAT, META, MegatronShards, rank_dir
from scalerl_mega.convert.st_io import SafetensorsDir, ShardedWriter

_HF_SIDE_FILES = (".json", ".model", ".txt", ".jinja", ".tiktoken")
NON_TEXT_DIR = "hf_non_text"  # converter checkpoint: the vision tower of a conditional checkpoint, unchanged


@dataclasses.dataclass(kw_only=True)
class Summary:
    """What a conversion wrote: tensor count, bytes and a digest over every tensor's SHA-256."""

    tensors: int
    bytes: int
    digest: str
    checksums: dict[str, str]
    layout: str = hf_layout.CAUSAL
    skipped: list[str] = dataclasses.field(default_factory=list)  # what was left out of the Megatron model
    warnings: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"tensors: {self.tensors}", f"bytes: {self.bytes}", f"sha256(all tensors): {self.digest}",
                f"hf layout: {self.layout}", *(f"skipped: {x}" for x in self.skipped)]


def _summary(checksums: dict[str, str], nbytes: int, **kw) -> Summary:
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(f"{name}:{checksums[name]}\n".encode())
    return Summary(tensors=len(checksums), bytes=nbytes, digest=h.hexdigest(), checksums=checksums, **kw)


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tensor")


def _prepare_out(out: str) -> str:
    if os.path.exists(out):
        raise ValueError(f"output {out!r} already exists")
    tmp = out.rstrip("/") + ".partial"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    return tmp


def _copy_side_files(src: str, dst: str, *, skip: Iterable[str] = ()) -> None:
    os.makedirs(dst, exist_ok=True)
    for f in sorted(os.listdir(src)):
        p = os.path.join(src, f)
        if os.path.isfile(p) and f.endswith(_HF_SIDE_FILES) and f not in skip and not f.endswith(".safetensors.index.json"):
            shutil.copy2(p, os.path.join(dst, f))


def load_hf_config(hf_dir: str) -> dict:
    """The text model's HF config of a checkpoint directory: ``config.json`` itself, or its
    ``text_config`` for a multimodal ``Llama4ForConditionalGeneration`` checkpoint."""
    return hf_layout.read_layout(hf_dir).text_config


def validate_hf(src: SafetensorsDir, dims: ArchDims, layout: hf_layout.HFLayout | None = None, *,
                check_shapes: bool = True) -> list[str]:
    """Raise ValueError naming the first missing/extra tensor or shape mismatch (with both shapes).
    Returns the names of the non-text tensors (vision tower, projector) of a conditional checkpoint.
    `check_shapes=False`: names only (a reader that checks each tensor's shape as it reads it)."""
    layout = layout or hf_layout.HFLayout(hf_layout.CAUSAL, {})
    expected = [layout.hf_name(n) for n in tables.hf_names(dims)]
    present = set(src.names())
    missing = [n for n in expected if n not in present]
    if missing:
        raise ValueError(f"{src.directory}: tensor {missing[0]!r} is missing ({len(missing)} missing in total)")
    non_text = sorted(n for n in present if layout.is_non_text(n))
    extra = sorted(present - set(expected) - set(non_text))
    if extra:
        raise ValueError(f"{src.directory}: unexpected tensor {extra[0]!r} ({len(extra)} extra in total) for architecture {dims.arch!r}")
    for n in tables.hf_names(dims) if check_shapes else ():
        want, got = tables.expected_hf_shape(n, dims), src.shape(layout.hf_name(n))
        if tuple(got) != tuple(want):
            raise ValueError(f"{src.directory}: tensor {layout.hf_name(n)!r} has shape {tuple(got)}, expected {tuple(want)}")
    return non_text


def _non_text_report(src: SafetensorsDir, names: list[str]) -> list[str]:
    if not names:
        return []
    nbytes = sum(src.nbytes(n) for n in names)
    towers = sorted({n.split(".")[0] for n in names})
    return [f"{len(names)} non-text tensors ({nbytes} bytes; {', '.join(towers)}) are not part of the Megatron model"]


def validate_layout(dims: ArchDims, *, tp: int, pp: int, ep: int, etp: int) -> None:
    checks = [
        ("num_attention_heads", dims.num_heads, tp, "tp"),
        ("num_key_value_heads", dims.num_kv_heads, tp, "tp"),
        ("intermediate_size (dense)", dims.ffn_hidden_size, tp, "tp"),
        ("num_hidden_layers", dims.num_layers, pp, "pp"),
    ]
    if dims.moe_layers:
        checks += [("num_local_experts", dims.num_experts, ep, "ep"), ("intermediate_size (experts)", dims.moe_ffn_hidden_size, etp, "etp"), ("intermediate_size (shared expert)", dims.moe_ffn_hidden_size, tp, "tp")]
    elif ep != 1:
        raise ValueError(f"ep={ep} but the model has no MoE layers")
    for key, value, size, flag in checks:
        if size < 1 or value % size:
            raise ValueError(f"{key}={value} is not divisible by {flag}={size}")


def _stage_of(group: tables.Group, dims: ArchDims, pp: int) -> int:
    if group.layer is not None:
        return group.layer // (dims.num_layers // pp)
    return 0 if group.rule.scope == "model" else pp - 1


def convert_hf_to_megatron(
    *, hf_dir: str, out: str, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None,
    vocab_multiple: int = 128, expect_arch: str | None = None, progress: bool = False,
    max_shard_bytes: int = 2 << 30, dequantize_dtype: torch.dtype | None = None,
) -> Summary:
    """HF checkpoint directory -> converter Megatron checkpoint sharded for (tp, pp, ep). A blockwise FP8
    checkpoint is dequantized into `dequantize_dtype` (None: the dtype its config.json names, else bfloat16) and
    written without its `quantization_config` (``convert.fp8_io``)."""
    from scalerl_mega.convert.fp8_io import checkpoint_reader, unquantized_config

    source = hf_layout.read_layout(hf_dir)
    where = os.path.join(hf_dir, "config.json")
    layout = hf_layout.HFLayout(source.kind, unquantized_config(source.config))
    cfg = layout.text_config
    dims = dims_from_hf_config(cfg, where=where, expect_arch=expect_arch)
    etp = tp if etp is None else etp
    validate_layout(dims, tp=tp, pp=pp, ep=ep, etp=etp)
    src = checkpoint_reader(SafetensorsDir(hf_dir), source.config, where=where,
                            dtype=dequantize_dtype or _declared_dtype(cfg))
    quantized = not isinstance(src, SafetensorsDir)
    non_text = validate_hf(src, dims, layout)
    padded = dims.padded_vocab_size(vocab_multiple=vocab_multiple, tp=tp)
    groups = list(tables.iter_groups(dims))
    tmp = _prepare_out(out)
    writers: dict[tuple[int, int, int], ShardedWriter] = {}
    shapes: dict[str, list[int]] = {}
    bar = _progress(sum(len(g.mcore) for g in groups), "hf->megatron", progress)
    try:
        for group in groups:
            stage = _stage_of(group, dims, pp)
            for name, full in tables.hf_to_mcore(group, [src.get(layout.hf_name(n)) for n in group.hf], dims=dims, padded_vocab=padded):
                shapes[name] = list(full.shape)
                e = sharding.expert_index(name)
                ep_rank = 0 if e is None else sharding.expert_owner(e, num_experts=dims.num_experts, ep=ep)
                size = tp if e is None else etp
                for t in range(size):
                    w = _rank_writer(writers, (t, stage, ep_rank), tmp=tmp, max_shard_bytes=max_shard_bytes)
                    w.add(name, sharding.tp_shard(name, full, rank=t, size=size, dims=dims))
                del full
                if bar:
                    bar.update(1)
        checksums, nbytes = _finish_writers(writers)
        if non_text:  # carried unchanged, so that a conditional-layout export gives the checkpoint back
            _write_non_text(src, non_text, tmp=tmp, max_shard_bytes=max_shard_bytes)
        meta = {
            "format": FORMAT, "arch": dims.arch, "tp": tp, "pp": pp, "ep": ep, "etp": etp,
            "vocab_multiple": vocab_multiple, "padded_vocab_size": padded, "hf_config": cfg, "shapes": shapes,
            "hf_layout": layout.kind, "hf_source_config": dict(layout.config),
        }
        _write_meta_and_side_files(tmp, meta=meta, hf_dir=hf_dir, layout=layout, quantized=quantized)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar:
            bar.close()
    os.replace(tmp, out)
    return _summary(checksums, nbytes, layout=layout.kind, skipped=_non_text_report(src, non_text))


def _write_meta_and_side_files(
    tmp: str, *, meta: dict, hf_dir: str, layout: hf_layout.HFLayout, quantized: bool,
) -> None:
    """The converted checkpoint's metadata and the HF side files (tokenizer, config) kept under `hf/`."""
    with open(os.path.join(tmp, META), "w") as f:
        json.dump(meta, f, indent=1)
    _copy_side_files(hf_dir, os.path.join(tmp, "hf"))
    if quantized:  # the converted weights are not FP8: neither is the config kept beside them
        with open(os.path.join(tmp, "hf", "config.json"), "w") as f:
            json.dump(dict(layout.config), f, indent=2)


def _declared_dtype(cfg: dict) -> torch.dtype:
    """The dtype a checkpoint's config.json names (`dtype`, or `torch_dtype` before transformers 5), else bf16."""
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16


def _rank_writer(
    writers: dict[tuple[int, int, int], ShardedWriter], key: tuple[int, int, int], *, tmp: str, max_shard_bytes: int
) -> ShardedWriter:
    """The writer of the (tp, pp, ep) rank `key` under `tmp`, created (with its directory) on first use."""
    if key not in writers:
        d = os.path.join(tmp, rank_dir(*key))
        os.makedirs(d)
        writers[key] = ShardedWriter(d, max_shard_bytes=max_shard_bytes)
    return writers[key]


def _finish_writers(writers: dict[tuple[int, int, int], ShardedWriter]) -> tuple[dict[str, str], int]:
    """Close every rank's writer (in rank order); returns ({rank_dir/file: checksum}, total bytes written)."""
    checksums, nbytes = {}, 0
    for key, w in sorted(writers.items()):
        w.finish()
        checksums.update({f"{rank_dir(*key)}/{n}": c for n, c in w.checksums.items()})
        nbytes += w.total_bytes
    return checksums, nbytes


def _write_non_text(src: SafetensorsDir, non_text: list[str], *, tmp: str, max_shard_bytes: int) -> None:
    """Copy the non-text tensors (vision tower etc.) unchanged into `tmp`/NON_TEXT_DIR."""
    os.makedirs(os.path.join(tmp, NON_TEXT_DIR))
    w = ShardedWriter(os.path.join(tmp, NON_TEXT_DIR), max_shard_bytes=max_shard_bytes)
    for n in non_text:
        w.add(n, src.get(n))
    w.finish()


def validate_megatron(ck: MegatronShards) -> None:
    dims = ck.dims
    expected = tables.mcore_names(dims)
    present = set(ck.names())
    missing = [n for n in expected if n not in present]
    if missing:
        raise ValueError(f"{ck.path}: tensor {missing[0]!r} is missing ({len(missing)} missing in total)")
    extra = sorted(present - set(expected))
    if extra:
        raise ValueError(f"{ck.path}: unexpected tensor {extra[0]!r} ({len(extra)} extra in total)")
    for group in tables.iter_groups(dims):
        for name, want in zip(group.mcore, tables.expected_mcore_shapes(group, dims=dims, padded_vocab=ck.padded_vocab)):
            got = ck.full_shape(name)
            if tuple(got) != tuple(want):
                raise ValueError(f"{ck.path}: tensor {name!r} has shape {tuple(got)}, expected {tuple(want)}")


def write_hf(
    *, out: str, dims: ArchDims, hf_config: dict, named_tensors: Iterable[tuple[str, torch.Tensor]],
    layout: str = hf_layout.CAUSAL, source_config: dict | None = None, non_text: SafetensorsDir | None = None,
    side_files_from: str | None = None, max_shard_bytes: int = 2 << 30,
    on_tensor: Callable[[str], None] | None = None,
) -> Summary:
    """Stream HF text-model ``(name, tensor)`` pairs (causal-layout names) into ``out`` in
    ``layout`` (safetensors shards + index + config.json). ``hf_config`` is the text config;
    ``source_config``/``non_text`` (conditional layout) supply the vision config and tensors.
    The conditional layout always gets an index file: SGLang looks for vision weights in it."""
    config = hf_layout.output_config(layout, hf_config, source=source_config)
    target = hf_layout.layout_of_config(config)
    warnings = hf_layout.sglang_warnings(layout, hf_config, tables.hf_names(dims))
    if layout == hf_layout.CONDITIONAL and non_text is None:
        warnings.append("conditional layout without vision weights: transformers initialises the vision tower "
                        "randomly; SGLang runs it text-only")
    tmp = _prepare_out(out)
    try:
        if side_files_from:
            _copy_side_files(side_files_from, tmp, skip=("config.json",))
        writer = ShardedWriter(tmp, max_shard_bytes=max_shard_bytes)
        for name, t in named_tensors:
            writer.add(target.hf_name(name), t)
            if on_tensor:
                on_tensor(name)
        for name in non_text.names() if non_text is not None else ():
            writer.add(name, non_text.get(name))
        writer.finish(always_index=layout == hf_layout.CONDITIONAL)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, out)
    return _summary(writer.checksums, writer.total_bytes, layout=layout, warnings=warnings)
