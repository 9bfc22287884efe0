"""Adapter-only checkpoints (`peft=lora`): the dist-checkpoint of a LoRA run holds the adapters and their optimizer
state, not the frozen base model, which the checkpoint references instead (`base_reference`: its path and a
fingerprint, checked on resume; a random base by its seed and the layout it was drawn under,
`random_base_reference`).

Each adapter tensor is a Megatron `ShardedTensor` under its base weight's global name (global layer and expert
index, `adapters.<name>.lora_A|lora_B`), split as the live tensor is (lora.py): the column-parallel B on its rows
(a SwiGLU fc1's gate and up halves each split, Megatron's own `apply_swiglu_sharded_factory`), the row-parallel A on
its columns, the replicated ones written once; experts under their global index. So a checkpoint loads under
another TP / EP / PP / DP layout, as the full-model checkpoints do (trainer/megatron/checkpoint.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.trainer.megatron.lora import LoRAAdapter

KEY_PREFIX = "adapters."


def has_adapters(chunks: list) -> bool:
    from scalerl_mega.trainer.megatron.global_names import unwrap
    from scalerl_mega.trainer.megatron.lora import adapted_modules

    return any(True for gpt in unwrap(chunks) for _ in adapted_modules(gpt))


def _tensors(chunks: list) -> list[tuple[str, LoRAAdapter, str]]:
    """(global key stem, adapter, local module name) of every adapter on this rank."""
    from scalerl_mega.trainer.megatron.global_names import unwrap
    from scalerl_mega.trainer.megatron.lora import ADAPTER, adapted_modules, global_weight_name

    out = []
    for gpt in unwrap(chunks):
        n_exp = _num_experts(gpt)
        for local, module in adapted_modules(gpt):
            out.append((KEY_PREFIX + global_weight_name(gpt, local, num_experts=n_exp), getattr(module, ADAPTER), local))
    return out


def _num_experts(gpt) -> int:
    return int(getattr(gpt.config, "num_moe_experts", None) or 0)


def adapter_sharded_state_dict(chunks: list) -> dict[str, object]:
    """The adapters of this rank as a Megatron sharded state dict (module docstring); its tensors are the live
    parameters, so the optimizer's sharded state maps onto them."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    dp = ps.get_data_parallel_rank(with_context_parallel=True)
    edp = ps.get_expert_data_parallel_rank() if any(a.layout.expert for _, a, _ in _tensors(chunks)) else 0
    sd: dict[str, object] = {}
    for stem, adapter, _ in _tensors(chunks):
        lay = adapter.layout
        a_key, b_key = f"{stem}.lora_A", f"{stem}.lora_B"
        if lay.tp == 1:
            rep = (0, 0, edp if lay.expert else dp)
            sd[a_key] = ShardedTensor.from_rank_offsets(a_key, adapter.lora_A, replica_id=rep)
            sd[b_key] = ShardedTensor.from_rank_offsets(b_key, adapter.lora_B, replica_id=rep)
        elif lay.column:
            sd[a_key] = ShardedTensor.from_rank_offsets(a_key, adapter.lora_A, replica_id=(0, lay.tp_rank, dp))
            b = ShardedTensor.from_rank_offsets(b_key, adapter.lora_B, (0, lay.tp_rank, lay.tp), replica_id=(0, 0, dp))
            sd[b_key] = apply_swiglu_sharded_factory(b, ()) if stem.endswith("linear_fc1.weight") else b
        else:
            sd[a_key] = ShardedTensor.from_rank_offsets(a_key, adapter.lora_A, (1, lay.tp_rank, lay.tp),
                                                        replica_id=(0, 0, dp))
            sd[b_key] = ShardedTensor.from_rank_offsets(b_key, adapter.lora_B, replica_id=(0, lay.tp_rank, dp))
    return sd


def load_adapter_state(chunks: list, loaded: dict[str, torch.Tensor]) -> None:
    """Copy a loaded adapter state dict (`adapter_sharded_state_dict`'s keys, tensors) into the adapters; a key
    missing from it is an error naming the key (a checkpoint of other targets or another rank)."""
    for stem, adapter, _ in _tensors(chunks):
        for part in ("lora_A", "lora_B"):
            key = f"{stem}.{part}"
            if key not in loaded:
                raise ValueError(f"adapter checkpoint has no tensor {key!r} (saved with other peft.targets?)")
            param = getattr(adapter, part)
            value = loaded[key]
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"adapter checkpoint tensor {key!r} has shape {tuple(value.shape)}, the adapter "
                                 f"{tuple(param.shape)} (saved with another peft.rank?)")
            with torch.no_grad():
                param.copy_(value)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def base_reference(path: str, *, seed: int, model_name: str) -> dict[str, object]:
    """What an adapter checkpoint's frozen base is: `init_from_hf`'s directory and a fingerprint of it (SHA-256 over
    its JSON files' bytes and each weight file's name and size: cheap at any size, and it changes when the
    checkpoint is replaced or re-exported), or, for a randomly initialised base, the seed and model it is drawn
    from."""
    if not path:
        return {"path": "", "seed": int(seed), "model": str(model_name)}
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.iterdir() if p.is_file()):
        if f.suffix == ".json":
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        elif f.name.endswith(_WEIGHT_SUFFIXES):
            h.update(f"{f.name}\0{os.path.getsize(f)}\0".encode())
    return {"path": str(root.resolve()), "sha256": h.hexdigest()}


def random_base_reference(*, seed: int, model_name: str, pp: int, ep: int, moe: bool) -> dict[str, object]:
    """What a randomly initialised base is: the seed and model it is drawn from and, where they are not 1, the
    pipeline-parallel size and (MoE) expert-parallel size it was drawn under. Megatron's CPU initialisation draws
    each rank's own layers and local experts from one seeded stream, so a pipeline stage's first layer, the experts
    of expert-parallel rank 1 and every weight drawn after them differ with those sizes (not with TP, whose full
    weights are drawn on every rank and then split): adapters resumed under another pp / ep would meet another
    base."""
    ref: dict[str, object] = {"path": "", "seed": int(seed), "model": str(model_name)}
    drawn = drawn_under(pp=pp, ep=ep, moe=moe)
    if drawn:
        ref["drawn_under"] = drawn
    return ref


def drawn_under(*, pp: int, ep: int, moe: bool) -> dict[str, int]:
    """The layout sizes a random base's draw depends on (`random_base_reference`): pp and, for MoE, ep, where > 1."""
    return {k: int(v) for k, v in (("pp", pp), ("ep", ep if moe else 1)) if int(v) > 1}


def check_base(saved: dict[str, object] | None, current: dict[str, object], *, where: str) -> None:
    """Refuse to resume adapters onto another base than they were trained on (naming both)."""
    if not saved:
        raise ValueError(f"{where}: an adapter checkpoint without its base reference (peft_base)")
    if saved.get("sha256", saved) != current.get("sha256", current):
        raise ValueError(f"{where}: its adapters were trained on the base {saved}, this run's base is {current} "
                         "(init_from_hf / seed / model / the pp and ep a random base is drawn under): resume "
                         "with the same base model")
