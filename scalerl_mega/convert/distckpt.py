"""Trainer checkpoint (Megatron dist-checkpointing, any TP/PP/EP) -> Hugging Face checkpoint.

The trainer saves with ``trainer.megatron.checkpoint.save_checkpoint``: ``<root>/step_N/`` (torch_dist
files, ``model_config.json``, ``COMPLETE``) and ``<root>/latest``. Conversion runs in this single
process on CPU: a gloo world of 1 (``parallel.init_parallel`` at TP1/PP1/EP1), the model built from
the recorded ``ModelConfig``, the weights loaded by dist-checkpointing (which reshards from the
saved layout), then ``export.export_hf_weights`` streams HF-named tensors one group at a time into
the sharded safetensors writer. Peak memory: the model once plus one tensor group.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scalerl_mega.convert.pipeline import Summary, _progress, write_hf


def is_dist_checkpoint(path: str | os.PathLike) -> bool:
    """A trainer checkpoint directory (``COMPLETE`` marker) or a root holding ``latest``."""
    from scalerl_mega.trainer.megatron.checkpoint import COMPLETE, LATEST

    p = Path(path)
    return (p / LATEST).is_file() or (p / COMPLETE).is_file()


def hf_config_dict(model_cfg) -> dict[str, Any]:
    """HF ``config.json`` contents (the architecture's config class, model/archs.py) for a trainer ``ModelConfig``."""
    import torch
    import transformers

    from scalerl_mega.model.archs import arch_of
    from scalerl_mega.model.hf_export import hf_config_from_model

    arch, kwargs = hf_config_from_model(model_cfg)
    a = arch_of(arch)
    cfg = getattr(transformers, a.config_class)(**kwargs, architectures=[a.causal_lm], dtype=torch.float32)
    return json.loads(cfg.to_json_string(use_diff=False))


def convert_dist_checkpoint_to_hf(*, ckpt: str, out: str, expect_arch: str | None = None, progress: bool = False,
                                  max_shard_bytes: int = 2 << 30, layout: str = "causal") -> Summary:
    """Trainer checkpoint (``step_N`` dir, or a root whose ``latest`` names one) -> HF directory ``out``
    in HF ``layout`` (``convert.hf_layout``; a trainer checkpoint has no vision tower)."""
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.convert import hf_layout, tables
    from scalerl_mega.trainer.megatron import checkpoint, export, models, parallel
    from scalerl_mega.model.config import ParallelConfig

    step_dir = checkpoint.resolve(ckpt)
    model_cfg = checkpoint.read_model_config(step_dir)
    if expect_arch is not None and model_cfg.arch != expect_arch:
        raise ValueError(f"{step_dir / checkpoint.MODEL_CONFIG}: arch={model_cfg.arch!r}, expected {expect_arch!r}")
    if os.path.exists(out):
        raise ValueError(f"output {out!r} already exists")
    hf_config = hf_config_dict(model_cfg)  # before any process group: config errors fail fast
    hf_layout.output_config(layout, hf_config)
    if parallel.world_size_from_env() != 1:
        raise ValueError(f"WORLD_SIZE={parallel.world_size_from_env()}: the converter runs in a single process "
                         "(do not launch it with torchrun)")
    import torch.distributed as dist

    owns_group = not dist.is_initialized()
    par = ParallelConfig(tp=1, pp=1, ep=1, backend="gloo")
    parallel.init_parallel(par, model=model_cfg)
    bar = None
    try:
        model, _ = models.build_model(model_cfg, par)
        checkpoint.load_checkpoint(step_dir, chunks=[model])
        model.eval()
        dims = dims_from_model_config(model_cfg)
        bar = _progress(len(tables.hf_names(dims)), "megatron(dist)->hf", progress)
        return write_hf(out=out, dims=dims, hf_config=hf_config, named_tensors=export.export_hf_weights([model], model_cfg),
                        layout=layout, max_shard_bytes=max_shard_bytes, on_tensor=(lambda _n: bar.update(1)) if bar else None)
    finally:
        if bar:
            bar.close()
        parallel.teardown_parallel(destroy_process_group=owns_group)
