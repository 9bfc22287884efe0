"""Stream Hugging-Face-named full tensors out of a TP/PP/EP-sharded Megatron ``GPTModel``.

``export_hf_weights(model, model_cfg)`` walks this pipeline stage's tensor groups in the fixed
table order (``convert.tables.iter_groups``). For each group every rank of the stage takes part in
the gathers (TP shards over the tensor-parallel group, expert TP shards over the expert-TP group,
experts over the expert-parallel group); the group is then converted to HF names/layouts and
yielded by one rank per stage only (tensor-parallel rank 0, data-parallel rank 0), and dropped
before the next group, so at most one group (e.g. one layer's fused expert tensor) is resident.
Ranks that do not emit must still exhaust the iterator (the gathers are collective).

Tensors stay on the training device (no host copy: NCCL sends device tensors) and are cast to the
generator's dtype (``dtype``, e.g. bf16) once gathered, the LM head included unless the spec says
``+fp32_head`` (``weight_dtypes``). ``export_to_rank0`` is the weight push of a
multi-rank job: global rank 0 (the controller, the only rank in the weight-sync group) yields its own
stage's tensors, then receives every later pipeline stage's from that stage's emitting rank by
point-to-point send/recv over the default group, one tensor at a time (a header object, then the
tensor), so the push is one stream from one sender: one weight-update session per push.
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


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A private copy of a gathered tensor on its device."""
    return t.detach().clone()


def is_head_weight(hf_name: str, *, tied: bool) -> bool:
    """The HF tensor that is the LM head: `lm_head.weight`, or the token embedding when tied."""
    return hf_name.endswith("lm_head.weight") or (tied and hf_name.endswith("embed_tokens.weight"))


FP32_HEAD = "+fp32_head"
"""Suffix of a weight dtype spec ("bfloat16+fp32_head"): the LM head keeps its own (FP32) dtype."""
FP8_SYNC = "+fp8"
"""Last suffix of a weight dtype spec ("bfloat16+fp8", "float32+fp32_head+fp8"): after the cast, every linear
projection travels as blockwise FP8 with its scale (`quant.fp8.quantize_named`, `rollout.quantization=fp8`);
norms, routers, embeddings and the head keep the cast dtype (the FP32 head stays FP32)."""


def split_quantization(spec: torch.dtype | str | None) -> tuple[torch.dtype | str | None, str]:
    """(the dtype spec without its quantization suffix, "fp8" or "none")."""
    if isinstance(spec, str) and spec.endswith(FP8_SYNC):
        return spec[: -len(FP8_SYNC)], "fp8"
    return spec, "none"


def hf_emitter(dtype: torch.dtype | str | None, model_cfg):
    """`emit(hf_name, tensor)` -> the (name, tensor) pairs a weight push sends for one converted tensor: cast per
    `weight_dtypes`, then quantized to FP8 with its scale where the spec says "+fp8" (`FP8_SYNC`). The one place
    where a push's tensors take their wire format, for the single and the per-stage senders alike."""
    from scalerl_mega.quant.fp8 import quantize_named

    spec, quantization = split_quantization(dtype)
    body_dtype, head_dtype = weight_dtypes(spec, model_cfg)
    tied = bool(getattr(model_cfg, "tie_embeddings", False))

    def emit(name: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        to = head_dtype if is_head_weight(name, tied=tied) else body_dtype
        t = t if to is None or t.dtype == to else t.to(to)
        if quantization == "fp8":
            yield from quantize_named([(name, t)])
        else:
            yield name, t

    return emit


def weight_dtypes(spec: torch.dtype | str | None, model_cfg) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(body dtype, head dtype) of a weight push; None keeps the parameter's own dtype.

    ``spec``: None (every parameter's own dtype); a dtype or its name (every tensor, the LM head
    included: what an SGLang server holds, since it rounds a pushed head to its serving dtype on
    load and `--enable-fp32-lm-head` only upcasts that rounded weight and the hidden state at compute,
    sglang 0.5.23 layers/logits_processor.py; an FP32 push would cost 2x the head's bytes for
    nothing); or "<dtype>+fp32_head" (the head, i.e. the token embedding when tied, keeps its own
    dtype when ``model_cfg.fp32_lm_head``: the local engine keeps an FP32 copy of the pushed head,
    rollout/core.py, so paper Sec. 3.2's FP32 head sees the trainer's weights unrounded there).
    """
    if spec is None or isinstance(spec, torch.dtype):
        return spec, spec
    name, keep = str(spec), False
    if name.endswith(FP32_HEAD):
        name, keep = name[: -len(FP32_HEAD)], bool(getattr(model_cfg, "fp32_lm_head", False))
    body = _as_dtype(name)
    return body, (None if keep else body)


def export_hf_weights(model, model_cfg, *, dtype: torch.dtype | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for this pipeline stage on its emitting rank (see module doc).

    ``model``: a GPTModel, DDP-wrapped model or list of chunks; ``model_cfg``: the trainer
    ``ModelConfig`` (or a ``convert.dims.ArchDims``); ``dtype``: cast of the yielded tensors, a spec of
    ``weight_dtypes`` (None keeps the parameters' dtypes; "<dtype>+fp32_head" keeps an FP32 LM head FP32),
    ending in "+fp8" for an FP8 push (`hf_emitter`).
    """
    from scalerl_mega.convert import tables
    from scalerl_mega.trainer.megatron.global_names import global_params, unwrap
    from scalerl_mega.convert.model_config import dims_from_model_config

    dims = dims_from_model_config(model_cfg)
    out = hf_emitter(dtype, model_cfg)
    emit = is_emitting_rank()
    for gpt in unwrap(model):
        params = global_params(gpt, dims)
        layers = sorted({int(n.split(".")[2]) for n in params if n.startswith("decoder.layers.")})
        groups = tables.iter_groups(
            dims, layers=layers,
            first_stage="embedding.word_embeddings.weight" in params,
            last_stage="decoder.final_layernorm.weight" in params,
        )
        for batch in _batches(groups):
            full = _gather_full([n for g in batch for n in g.mcore], params, dims=dims)
            if emit:
                for group in batch:
                    for name, t in tables.mcore_to_hf(group, [full[n] for n in group.mcore], dims=dims,
                                                      padded_vocab=dims.vocab_size):
                        yield from out(name, t)
            del full


def _batches(groups):
    """Table groups in order, the per-expert groups of one (layer, rule) together (Qwen3-MoE: one
    layer's experts are gathered in one pass over the expert-parallel ranks, as a fused rule's are)."""
    batch: list = []
    for g in groups:
        if batch and not (g.rule.per_expert and batch[-1].rule is g.rule and batch[-1].layer == g.layer):
            yield batch
            batch = []
        batch.append(g)
    if batch:
        yield batch


def _gather_full(names: list[str], params: dict, *, dims) -> dict[str, torch.Tensor]:
    """Full (unsharded) tensors of the global Megatron `names` on every rank of this stage (collective):
    TP shards over the tensor-parallel group; experts over the expert-TP, then expert-parallel group."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.convert import sharding

    full: dict[str, torch.Tensor] = {}
    experts = [n for n in names if sharding.expert_index(n) is not None]
    for name in names:
        if name in experts:
            continue
        shards = (_all_gather(params[name].data, ps.get_tensor_model_parallel_group())
                  if sharding.tp_kind(name) != sharding.REPLICATED else [params[name].data])
        full[name] = _owned(sharding.tp_merge(name, shards, dims=dims))
    if experts:
        # every EP rank holds E/ep consecutive experts; gather local expert j (per tensor kind) from all of them
        ep = ps.get_expert_model_parallel_world_size()
        n_local = dims.num_experts // ep
        local = [n for n in experts if n in params]
        kinds = sorted({n.rsplit("weight", 1)[0] for n in local})
        for kind in kinds:
            mine = sorted((n for n in local if n.startswith(kind + "weight")), key=sharding.expert_index)
            for j, name in enumerate(mine):
                merged = sharding.tp_merge(name, _all_gather(params[name].data, ps.get_expert_tensor_parallel_group()))
                for r, t in enumerate(_all_gather(merged, ps.get_expert_model_parallel_group())):
                    full[f"{kind}weight{r * n_local + j}"] = _owned(t)
    return full


def export_plan(model_cfg, *, dtype: torch.dtype | str | None = None) -> list:
    """What `export_to_rank0` will yield, without gathering anything: a `weight_sync.TensorSpec` per HF
    tensor (name, full shape from the model dimensions, dtype after the cast; None where the
    parameter's own dtype is kept). A receiver checks it against its model before the first bucket."""
    from scalerl_mega.convert import tables
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.weight_sync import TensorSpec, dtype_name

    dims = dims_from_model_config(model_cfg)
    spec, quantization = split_quantization(dtype)
    body_dtype, head_dtype = weight_dtypes(spec, model_cfg)
    tied = bool(getattr(model_cfg, "tie_embeddings", False))

    def spec_dtype(name: str) -> str | None:
        to = head_dtype if is_head_weight(name, tied=tied) else body_dtype
        return None if to is None else dtype_name(to)

    plan = [TensorSpec(n, tables.expected_hf_shape(n, dims), spec_dtype(n)) for n in tables.hf_names(dims)]
    return quantized_plan(plan) if quantization == "fp8" else plan


def quantized_plan(plan: list) -> list:
    """Planned tensors (`weight_sync.TensorSpec`) as an FP8 push sends them: each FP8 weight with its dtype, followed
    by its scale (`quant.fp8.quantized_shapes`), in the order `hf_emitter` yields them."""
    from scalerl_mega.quant.fp8 import quantized_shapes
    from scalerl_mega.weight_sync import TensorSpec

    return [TensorSpec(n, shape, dt or s.dtype) for s in plan for n, shape, dt in quantized_shapes(s.name, s.shape)]


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    from scalerl_mega.weight_sync import dtype_from_name

    return dtype_from_name(str(dtype))


def export_to_rank0(model, model_cfg, *, dtype: torch.dtype | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole model's HF tensors on global rank 0 (see module doc); every rank must exhaust it.

    Rank 0 yields its stage's groups, then stage 1's, 2's, ... as relayed by their emitting ranks
    (tensor-, data- and context-parallel rank 0 of the stage: the members of rank 0's pipeline group).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from scalerl_mega.weight_sync import wire_tensors

    local = export_hf_weights(model, model_cfg, dtype=dtype)
    pp = ps.get_pipeline_model_parallel_world_size()
    if pp == 1 or not dist.is_initialized():
        yield from local
        return
    rank = dist.get_rank()
    if rank == 0:
        yield from local
        stage_ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
        device = _p2p_device()
        for src in stage_ranks[1:]:
            while True:
                header = [None]
                dist.recv_object_list(header, src=src, device=device)
                if header[0] is None:
                    break
                name, shape, dtype_name = header[0]
                t = torch.empty(shape, dtype=_as_dtype(dtype_name), device=device)
                dist.recv(wire_tensors([t], None)[0], src=src)  # float8 (an FP8 push) as bytes on gloo
                yield name, t
        return
    if not is_emitting_rank():
        for _ in local:  # collective gathers inside this stage
            pass
        return
    device = _p2p_device()
    for name, t in local:  # a later stage's emitting rank: relay to rank 0
        dist.send_object_list([(name, tuple(t.shape), str(t.dtype).replace("torch.", ""))], dst=0, device=device)
        dist.send(wire_tensors([t.contiguous()], None)[0], dst=0)
    dist.send_object_list([None], dst=0, device=device)


def _p2p_device() -> torch.device:
    """Where the default group's point-to-point objects live: the current CUDA device under NCCL."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
