"""Stream Hugging-Face-named full tensors out of a TP/PP/EP-sharded Megatron ``GPTModel``.

``export_hf_weights(model, model_cfg)`` walks this pipeline stage's tensor groups in the fixed
table order (``convert.tables.iter_groups``). For each group every rank of the stage takes part in
the gathers (TP shards over the tensor-parallel group, expert TP shards over the expert-TP group,
experts over the expert-parallel group); the group is then converted to HF names/layouts and
yielded by one rank per stage only (tensor-parallel rank 0, data-parallel rank 0), and dropped
before the next group, so at most one group (e.g. one layer's fused expert tensor) is resident.
Ranks that do not emit must still exhaust the iterator (the gathers are collective).
"""

from __future__ import annotations

from typing import Iterator

import torch


def _all_gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    import torch.distributed as dist

    size = dist.get_world_size(group=group)
    if size == 1:
        return [t]
    t = t.detach().contiguous()
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t, group=group)
    return out


def is_emitting_rank() -> bool:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0


def export_hf_weights(model, model_cfg) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for this pipeline stage on its emitting rank (see module doc).

    ``model``: a GPTModel, DDP-wrapped model or list of chunks; ``model_cfg``: the trainer
    ``ModelConfig`` (or a ``convert.dims.ArchDims``).
    """
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import sharding, tables
    from scalerl_mega.convert.load import global_params, unwrap
    from scalerl_mega.convert.model_config import dims_from_model_config

    dims = dims_from_model_config(model_cfg)
    emit = is_emitting_rank()
    tp_group = ps.get_tensor_model_parallel_group()
    etp_group = ps.get_expert_tensor_parallel_group() if dims.num_experts else None
    ep_group = ps.get_expert_model_parallel_group() if dims.num_experts else None
    ep = ps.get_expert_model_parallel_world_size() if dims.num_experts else 1
    for gpt in unwrap(model):
        params = global_params(gpt, dims)
        layers = sorted({int(n.split(".")[2]) for n in params if n.startswith("decoder.layers.")})
        groups = tables.iter_groups(
            dims, layers=layers,
            first_stage="embedding.word_embeddings.weight" in params,
            last_stage="decoder.final_layernorm.weight" in params,
        )
        for group in groups:
            full: dict[str, torch.Tensor] = {}
            experts = [n for n in group.mcore if sharding.expert_index(n) is not None]
            for name in group.mcore:
                if name in experts:
                    continue
                shards = _all_gather(params[name].data, tp_group) if sharding.tp_kind(name) != sharding.REPLICATED else [params[name].data]
                full[name] = sharding.tp_merge(name, shards).detach().cpu().clone()
            if experts:
                # every EP rank holds E/ep consecutive experts; gather local expert j from all of them
                local = {sharding.expert_index(n): n for n in experts if n in params}
                n_local = dims.num_experts // ep
                base = min(local)
                for j in range(n_local):
                    mine = [n for e, n in local.items() if e == base + j][0]
                    merged = sharding.tp_merge(mine, _all_gather(params[mine].data, etp_group))
                    for r, t in enumerate(_all_gather(merged, ep_group)):
                        e = r * n_local + j
                        full[mine.rsplit("weight", 1)[0] + f"weight{e}"] = t.detach().cpu().clone()
            if emit:
                yield from tables.mcore_to_hf(group, [full[n] for n in group.mcore], dims=dims, padded_vocab=dims.vocab_size)
            del full
