"""The trainer's LoRA adapters (trainer/megatron/lora.py) as a PEFT 0.21 adapter: `adapter_config.json`'s content
and the tensors of `adapter_model.safetensors`, gathered from every TP/EP/PP rank onto global rank 0.

Names are PEFT's: `base_model.model.<HF module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r], the HF
module from the conversion tables (convert/tables.py). A fused Megatron linear becomes its HF projections: each
gets the shared A and its rows of B, regrouped exactly as the weight's rows are (q/k/v per query group and, for
Llama-4, RoPE pairs; gate/up halves), so HF + PEFT computes the trainer's function exactly. Routed experts are
exported per expert (`mlp.experts.<e>.gate_proj`, ...: the layout of the HF checkpoint files and of SGLang's
per-expert LoRA; transformers 5 holds experts as fused 3-D parameters, which PEFT adapts only through
`target_parameters`, so HF + PEFT does not load expert adapters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config.peft import PeftConfig

HF_SHORT = {"qkv": ("q_proj", "k_proj", "v_proj"), "proj": ("o_proj",), "fc1": ("gate_proj", "up_proj"),
            "fc2": ("down_proj",)}
"""The HF projections of each adapted Megatron linear (the fused ones split)."""


def peft_adapter_config(peft: PeftConfig, *, kinds: set[str], base_model: str = "") -> dict[str, object]:
    """The content of PEFT's `adapter_config.json` for adapters on `kinds` (config.peft.target_kinds)."""
    short = sorted({s for k in kinds for s in HF_SHORT[k.split("_")[-1]]})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(peft.rank), "lora_alpha": float(peft.alpha),
            "lora_dropout": float(peft.dropout), "target_modules": short, "bias": "none", "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "base_model_name_or_path": base_model or None}


def _gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    import torch.distributed as dist

    if group is None or dist.get_world_size(group=group) == 1:
        return [t.detach()]
    t = t.detach().contiguous()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(out, t, group=group)
    return out


def _full(adapter, weight_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of one adapter unsharded (collective over the tensor-parallel group when the base is split)."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import sharding

    lay = adapter.layout
    if lay.tp == 1:
        return adapter.lora_A.detach().clone(), adapter.lora_B.detach().clone()
    group = ps.get_tensor_model_parallel_group()
    if lay.column:  # B sharded like the weight (row blocks; gate/up halves for fc1)
        return adapter.lora_A.detach().clone(), sharding.tp_merge(weight_name, _gather(adapter.lora_B, group))
    return torch.cat(_gather(adapter.lora_A, group), dim=1), adapter.lora_B.detach().clone()


def _hf_pairs(group, a: torch.Tensor, b: torch.Tensor, *, dims) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(HF module, A, B) of one adapted linear given its table group (`convert.tables.Group`)."""
    modules = [n[: -len(".weight")] for n in group.hf]
    bs = [t for _, t in _rows_to_hf(group, b, dims=dims)]
    return [(m, a.clone(), bb) for m, bb in zip(modules, bs, strict=True)]  # own copies: one tensor per PEFT key


def _rows_to_hf(group, b: torch.Tensor, *, dims) -> list[tuple[str, torch.Tensor]]:
    """B's rows regrouped as the weight's rows are (the group's own `to_hf`: q/k/v split, RoPE pair order)."""
    return list(zip(group.hf, group.to_hf([b], dims, dims.vocab_size), strict=True))


def _expert_pairs(kind: str, layer: int, expert: int, a: torch.Tensor, b: torch.Tensor, *,
                  prefix: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    base = f"model.layers.{layer}.{prefix}experts.{expert}."
    if kind == "expert_fc1":
        gate, up = torch.chunk(b, 2, dim=0)
        return [(base + "gate_proj", a.clone(), gate.contiguous()), (base + "up_proj", a.clone(), up.contiguous())]
    return [(base + "down_proj", a, b)]


def _stage_adapters(chunks: list, model_cfg) -> Iterator[tuple[str, torch.Tensor]]:
    """This pipeline stage's PEFT-named adapter tensors, yielded on its emitting rank (collective gathers on all)."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import sharding, tables
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.trainer.megatron.export import is_emitting_rank
    from scalerl_mega.trainer.megatron.global_names import unwrap
    from scalerl_mega.trainer.megatron.lora import ADAPTER, adapted_modules, global_weight_name, module_kind

    dims = dims_from_model_config(model_cfg)
    emit = is_emitting_rank()
    prefix = "feed_forward." if model_cfg.arch == "llama4" else "mlp."
    groups = {g.mcore[0]: g for g in tables.iter_groups(dims) if not g.rule.fused_experts}
    for gpt in unwrap(chunks):
        for local, module in adapted_modules(gpt):
            kind, adapter = module_kind(local), getattr(module, ADAPTER)
            name = global_weight_name(gpt, local, num_experts=model_cfg.num_experts)
            a, b = _full(adapter, name)
            if adapter.layout.expert:  # expert j of every EP rank: global expert r * n_local + j
                n_local = model_cfg.num_experts // ps.get_expert_model_parallel_world_size()
                local_e = sharding.expert_index(name) - ps.get_expert_model_parallel_rank() * n_local
                layer, group = int(name.split(".")[2]), ps.get_expert_model_parallel_group()
                pairs = [p for r, (ar, br) in enumerate(zip(_gather(a, group), _gather(b, group)))
                         for p in _expert_pairs(kind, layer, r * n_local + local_e, ar, br, prefix=prefix)]
            else:
                pairs = _hf_pairs(groups[name], a, b, dims=dims)
            if emit:
                for module_name, aa, bb in pairs:
                    yield f"base_model.model.{module_name}.lora_A.weight", aa.contiguous()
                    yield f"base_model.model.{module_name}.lora_B.weight", bb.contiguous()


def export_peft_adapter(chunks: list, model_cfg, peft: PeftConfig, *, dtype: torch.dtype | None = None,
                        base_model: str = "") -> tuple[dict[str, object], list[tuple[str, torch.Tensor]]]:
    """(adapter_config, [(PEFT name, tensor), ...]) of the whole model on global rank 0, an empty list on the other
    ranks; every rank must call it (TP/EP gathers, pipeline stages relayed to rank 0). `dtype`: cast of the tensors
    (None keeps the parameters')."""
    from scalerl_mega.config.peft import target_kinds
    from scalerl_mega.trainer.megatron.export import relay_to_rank0

    import torch.distributed as dist

    named = [(n, t if dtype is None else t.to(dtype)) for n, t in relay_to_rank0(_stage_adapters(chunks, model_cfg))]
    if dist.is_initialized() and dist.get_rank() != 0:
        named = []
    kinds = _present_kinds(model_cfg, target_kinds(list(peft.targets)))
    return peft_adapter_config(peft, kinds=kinds, base_model=base_model), named


def _present_kinds(model_cfg, kinds: set[str]) -> set[str]:
    """The selected kinds the model has (experts only on an MoE model, the shared expert only where it exists)."""
    from scalerl_mega.model.lora_shapes import adapted_linears

    return {k for k, *_ in adapted_linears(model_cfg, kinds)}
