"""A LoRA run's adapter-only trainer checkpoint (`peft=lora`, trainer/megatron/lora_ckpt.py) -> a PEFT adapter
directory (`--peft-out`, loadable by `peft.PeftModel.from_pretrained` and SGLang's `/load_lora_adapter`) and/or a
merged HF checkpoint (`--merge-lora`: the base with `W + (alpha / r) B A` folded in).

In this one process on CPU, as `convert.distckpt` does for full checkpoints: a world of 1, the model built from the
recorded `ModelConfig`, the base loaded from the HF checkpoint the adapters reference (its fingerprint checked:
`lora_ckpt.base_reference`) or drawn again from the recorded seed, the adapters loaded (resharded from the saved
layout) on top.
"""

from __future__ import annotations

import os
from pathlib import Path

from scalerl_mega.convert.pipeline import Summary, write_hf


def peft_state(step_dir: Path) -> dict[str, object] | None:
    """The `peft` record of a trainer checkpoint (its adapter settings and base reference), None for a full one."""
    from scalerl_mega.trainer.megatron import checkpoint

    return (checkpoint._load_common(step_dir).get("extra_state") or {}).get("peft")


def _load_base(model, model_cfg, base: dict[str, object], *, base_dir: str | None, where: str) -> None:
    from scalerl_mega.convert.load import load_hf_checkpoint
    from scalerl_mega.trainer.megatron.lora_ckpt import base_reference, check_base

    path = base_dir or base.get("path", "")
    if not path:
        return  # a random base: drawn again from the seed the model was built with
    if not os.path.isdir(path):
        raise ValueError(f"{where}: its base model {path!r} is not a directory (pass --base DIR if it moved)")
    check_base(base, base_reference(path, seed=0, model_name=model_cfg.name), where=where)
    load_hf_checkpoint([model], path)


def convert_lora_checkpoint(*, ckpt: str, peft_out: str | None = None, merged_out: str | None = None,
                            base_dir: str | None = None, max_shard_bytes: int = 2 << 30) -> dict[str, object]:
    """Write the adapter (`peft_out`) and/or the merged model (`merged_out`) of the LoRA checkpoint `ckpt` (a `step_N`
    directory or a root). Returns what was written ({"peft": {...}, "merged": Summary})."""
    from scalerl_mega.config.peft import PeftConfig
    from scalerl_mega.convert.distckpt import hf_config_dict
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.model.peft_files import write_peft_adapter
    from scalerl_mega.trainer.megatron import checkpoint, export, lora, lora_export, models, parallel
    from scalerl_mega.trainer.megatron.lora_ckpt import drawn_under

    step_dir = checkpoint.resolve(ckpt)
    state = peft_state(step_dir)
    if state is None:
        raise ValueError(f"checkpoint {step_dir}: not a LoRA checkpoint (trained with peft=none); --peft-out and "
                         "--merge-lora need one")
    for out in (peft_out, merged_out):
        if out is not None and os.path.exists(out):
            raise ValueError(f"output {out!r} already exists")
    model_cfg = checkpoint.read_model_config(step_dir)
    peft, base = PeftConfig(**state["config"]), dict(state["base"])
    layout = checkpoint._load_common(step_dir).get("layout") or {}
    drawn = drawn_under(pp=int(layout.get("pp", 1)), ep=int(layout.get("ep", 1)), moe=model_cfg.is_moe)
    if not base.get("path") and not base_dir and drawn:
        raise ValueError(f"checkpoint {step_dir}: a random base trained under {drawn} (each pipeline stage's layers and "
                         "each expert-parallel rank's experts are drawn from one seeded stream: "
                         "lora_ckpt.random_base_reference) cannot be drawn again here; pass --base DIR")
    hf_config = hf_config_dict(model_cfg) if merged_out else None
    par = ParallelConfig(tp=1, pp=1, ep=1, backend="gloo")
    parallel.init_parallel(par, model=model_cfg, seed=int(base.get("seed", 1234)))
    try:
        model, _ = models.build_model(model_cfg, par)
        lora.inject_lora(model, peft, num_experts=model_cfg.num_experts, seed=0)  # values come from the checkpoint
        _load_base(model, model_cfg, base, base_dir=base_dir, where=f"checkpoint {step_dir}")
        checkpoint.load_checkpoint(step_dir, chunks=[model])
        model.eval()
        written: dict[str, object] = {}
        if peft_out is not None:
            config, named = lora_export.export_peft_adapter([model], model_cfg, peft, base_model=base.get("path", ""))
            write_peft_adapter(peft_out, config, named)
            written["peft"] = {"tensors": len(named), "bytes": sum(t.numel() * t.element_size() for _, t in named)}
        if merged_out is not None:
            lora.merge_adapters(model)
            written["merged"] = write_hf(out=merged_out, dims=dims_from_model_config(model_cfg), hf_config=hf_config,
                                         named_tensors=export.export_hf_weights([model], model_cfg),
                                         max_shard_bytes=max_shard_bytes)
        return written
    finally:
        parallel.teardown_parallel()


__all__ = ["Summary", "convert_lora_checkpoint", "peft_state"]
