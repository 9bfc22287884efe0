"""Megatron checkpoint -> HF checkpoint directory: the format is detected (a converter checkpoint, any
tp/pp/ep, converted here through `pipeline.write_hf`; or a trainer dist-checkpoint, `convert.distckpt`)."""

from __future__ import annotations

import os

from scalerl_mega.convert import hf_layout, tables
from scalerl_mega.convert.distckpt import convert_dist_checkpoint_to_hf, is_dist_checkpoint
from scalerl_mega.convert.megatron_ckpt import META, MegatronShards
from scalerl_mega.convert.pipeline import NON_TEXT_DIR, Summary, _progress, validate_megatron, write_hf
from scalerl_mega.convert.st_io import SafetensorsDir


def checkpoint_format(path: str) -> str:
    """``"converter"`` (``megatron_convert.json`` + per-rank safetensors) or ``"dist"`` (a trainer
    dist-checkpoint directory with ``COMPLETE``, or a root with ``latest``); ValueError otherwise."""
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint {path!r}: no such directory")
    if os.path.isfile(os.path.join(path, META)):
        return "converter"
    if is_dist_checkpoint(path):
        return "dist"
    steps = sorted(f for f in os.listdir(path) if f.startswith("step_"))
    hint = f" (it holds {steps[-1]!r} but no 'latest'; pass that directory)" if steps else ""
    raise ValueError(f"checkpoint {path!r}: neither a converter checkpoint ({META}) nor a trainer checkpoint "
                     f"(COMPLETE marker, or a root with a 'latest' file){hint}")


def convert_megatron_to_hf(*, ckpt: str, out: str, expect_arch: str | None = None, progress: bool = False,
                           max_shard_bytes: int = 2 << 30, layout: str = "auto") -> Summary:
    """Megatron checkpoint -> HF checkpoint directory. Either a converter checkpoint (any tp/pp/ep)
    or a trainer dist-checkpoint (``convert.distckpt``); the format is detected. ``layout``:
    ``causal`` (``Llama4ForCausalLM``/``LlamaForCausalLM``), ``conditional``
    (``Llama4ForConditionalGeneration``: ``language_model.`` names, plus the vision tower when the
    converter checkpoint carries it) or ``auto`` (the layout converted from; causal otherwise)."""
    if layout not in ("auto", *hf_layout.LAYOUTS):
        raise ValueError(f"layout={layout!r}: expected 'auto' or one of {hf_layout.LAYOUTS}")
    if checkpoint_format(ckpt) == "dist":
        return convert_dist_checkpoint_to_hf(ckpt=ckpt, out=out, expect_arch=expect_arch, progress=progress,
                                             max_shard_bytes=max_shard_bytes,
                                             layout=hf_layout.CAUSAL if layout == "auto" else layout)
    ck = MegatronShards(ckpt, expect_arch=expect_arch)
    kind = ck.meta.get("hf_layout", hf_layout.CAUSAL) if layout == "auto" else layout
    non_text_dir = os.path.join(ckpt, NON_TEXT_DIR)
    carries = hf_layout.HFLayout(kind, ck.meta["hf_config"]).carries_non_text()  # vision tower; DeepSeek MTP layers
    non_text = SafetensorsDir(non_text_dir) if carries and os.path.isdir(non_text_dir) else None
    validate_megatron(ck)
    dims = ck.dims
    groups = list(tables.iter_groups(dims))
    bar = _progress(sum(len(g.hf) for g in groups), "megatron->hf", progress)

    def named():
        for group in groups:
            yield from tables.mcore_to_hf(group, [ck.full_tensor(n) for n in group.mcore], dims=dims, padded_vocab=ck.padded_vocab)

    side = os.path.join(ckpt, "hf")
    try:
        return write_hf(
            out=out, dims=dims, hf_config=ck.meta["hf_config"], named_tensors=named(), layout=kind,
            source_config=ck.meta.get("hf_source_config"), non_text=non_text,
            side_files_from=side if os.path.isdir(side) else None, max_shard_bytes=max_shard_bytes,
            on_tensor=(lambda _n: bar.update(1)) if bar else None,
        )
    finally:
        if bar:
            bar.close()
