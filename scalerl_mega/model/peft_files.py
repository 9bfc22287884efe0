"""A PEFT adapter directory (PEFT 0.21's `adapter_config.json` + `adapter_model.safetensors`, the files
`peft.PeftModel.from_pretrained` and SGLang's `/load_lora_adapter` read), written from and read into
`(adapter_config, [(name, tensor), ...])` as `trainer.export_adapter()` returns it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def write_peft_adapter(directory: str | os.PathLike, adapter_config: dict[str, object], named: list[tuple[str, torch.Tensor]]) -> Path:
    """Write the two files into `directory` (created; existing files of the same names are replaced). Tensors are
    written contiguous on the CPU (a file, not a hot path)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named}
    if len(tensors) != len(named):
        raise ValueError(f"{out}: adapter tensor names repeat ({len(named)} tensors, {len(tensors)} names)")
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
    return out


def read_peft_adapter(directory: str | os.PathLike) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """(adapter_config, {name: tensor}) of a PEFT adapter directory."""
    from safetensors.torch import load_file

    d = Path(directory)
    for f in (CONFIG, WEIGHTS):
        if not (d / f).is_file():
            raise ValueError(f"{d}: not a PEFT adapter directory (no {f})")
    return json.loads((d / CONFIG).read_text()), load_file(str(d / WEIGHTS))
