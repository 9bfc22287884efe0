"""The trainer's side of a multi-sender weight sync (the plan: weight_sync/plan.py).

`sender_plan` is what every group carries (pure, from the model dimensions and dtypes); `my_sender`
says which group (if any) this rank sends over; `export_own` streams this rank's share: the stage's
emitting rank yields its stage's dense tensors (and fused experts, and pool 0's experts); an
expert pool's first rank yields the pool's experts after the expert-TP gather (pools of one rank
need no expert-parallel gather at all). Every rank of the stage must exhaust `export_own` (the
gathers are collective), as with `export.export_hf_weights`. Nothing here is architecture-specific:
which tensors are per-expert comes from the conversion tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from scalerl_mega.weight_sync.plan import Sender, SenderLayout


@dataclass
class ExportMemory:
    """Bytes of gathered tensors resident at once on this rank during the export (its peak)."""

    peak_bytes: int = 0


def resolved_plan(model_cfg, *, dtype, params_dtype: str) -> list:
    """`export.export_plan` with every dtype filled in (a kept dtype is the parameter's own: FP32 for
    the LM head under `fp32_lm_head`, else `params_dtype`): buckets need byte sizes up front."""
    from scalerl_mega.trainer.megatron.export import export_plan, is_head_weight
    from scalerl_mega.weight_sync import TensorSpec

    tied = bool(getattr(model_cfg, "tie_embeddings", False))
    head = "float32" if getattr(model_cfg, "fp32_lm_head", False) else params_dtype
    return [s if s.dtype is not None else
            TensorSpec(s.name, s.shape, head if is_head_weight(s.name, tied=tied) else params_dtype)
            for s in export_plan(model_cfg, dtype=dtype)]


def sender_plan(model_cfg, layout: SenderLayout, *, dtype, params_dtype: str) -> dict[str, list]:
    """Group name -> its sender's planned tensors, in the order `export_own` yields them."""
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.weight_sync.plan import sender_specs
    from scalerl_mega.trainer.megatron.export import quantized_plan, split_quantization

    spec, quantization = split_quantization(dtype)
    plans = sender_specs(dims_from_model_config(model_cfg), layout,
                         resolved_plan(model_cfg, dtype=spec, params_dtype=params_dtype))
    return {g: quantized_plan(p) for g, p in plans.items()} if quantization == "fp8" else plans


def my_sender(layout: SenderLayout) -> Sender | None:
    """This rank's group, or None (Megatron's parallel state must match `layout`)."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.trainer.megatron.export import is_emitting_rank

    pp, ep = ps.get_pipeline_model_parallel_world_size(), ps.get_expert_model_parallel_world_size()
    if (pp, ep) != (layout.pp, layout.ep):
        raise ValueError(f"weight sync layout pp={layout.pp} ep={layout.ep} does not match the trainer's pp={pp} ep={ep}")
    ep_rank = ps.get_expert_model_parallel_rank()
    expert_emit = ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
    emitting = is_emitting_rank()
    if emitting and not (ep_rank == 0 and expert_emit):
        raise ValueError(f"trainer rank {torch.distributed.get_rank()}: the stage's emitting rank is expert-parallel "
                         f"rank {ep_rank}, not 0; the multi-sender sync needs Megatron's default rank order")
    sends = layout.sends(stage=ps.get_pipeline_model_parallel_rank(), ep_rank=ep_rank, emitting=emitting,
                         expert_emitting=expert_emit)
    return sends[0] if sends else None


def export_own(model, model_cfg, layout: SenderLayout, *, dtype=None,
               memory: ExportMemory | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's share of the weight push (module doc); empty on ranks that only take part in gathers."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import tables
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.trainer.megatron.export import _batches, _gather_full, hf_emitter
    from scalerl_mega.trainer.megatron.global_names import global_params, unwrap

    dims = dims_from_model_config(model_cfg)
    out = hf_emitter(dtype, model_cfg)
    me = my_sender(layout)
    memory = memory if memory is not None else ExportMemory()

    for gpt in unwrap(model):
        params = global_params(gpt, dims)
        layers = sorted({int(n.split(".")[2]) for n in params if n.startswith("decoder.layers.")})
        groups = tables.iter_groups(dims, layers=layers, first_stage="embedding.word_embeddings.weight" in params,
                                    last_stage="decoder.final_layernorm.weight" in params)
        for batch in _batches(groups):
            names = [n for g in batch for n in g.mcore]
            if batch[0].rule.per_expert:
                full = _gather_pool_experts(names, params, dims=dims, layout=layout)
                emit = me is not None and me.pool == layout.pool_of(ps.get_expert_model_parallel_rank())
            else:
                full = _gather_full(names, params, dims=dims)
                emit = me is not None and me.pool == 0
            memory.peak_bytes = max(memory.peak_bytes, sum(t.numel() * t.element_size() for t in full.values()))
            if emit:
                for group in batch:
                    if all(n in full for n in group.mcore):
                        for name, t in tables.mcore_to_hf(group, [full[n] for n in group.mcore], dims=dims,
                                                          padded_vocab=dims.vocab_size):
                            yield from out(name, t)
            del full


def _gather_pool_experts(names: list[str], params: dict, *, dims, layout: SenderLayout) -> dict[str, torch.Tensor]:
    """This rank's experts of `names` after the expert-TP gather, plus (pools of several expert-parallel
    ranks) its pool members' experts, gathered one local expert at a time over the expert-parallel group."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import sharding
    from scalerl_mega.trainer.megatron.export import _all_gather

    ep, ep_rank = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()
    n_local = dims.num_experts // ep
    pool = layout.pool_of(ep_rank)
    local = [n for n in names if n in params]
    full: dict[str, torch.Tensor] = {}
    for kind in sorted({n.rsplit("weight", 1)[0] for n in local}):
        mine = sorted((n for n in local if n.startswith(kind + "weight")), key=sharding.expert_index)
        for j, name in enumerate(mine):
            merged = sharding.tp_merge(name, _all_gather(params[name].data, ps.get_expert_tensor_parallel_group()))
            if layout.pool_size == 1:
                full[name] = merged.detach().clone()
                continue
            for r, t in enumerate(_all_gather(merged, ps.get_expert_model_parallel_group())):
                if layout.pool_of(r) == pool:
                    full[f"{kind}weight{r * n_local + j}"] = t.detach().clone()
    return full
