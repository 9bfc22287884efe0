"""Per-GPU trainer memory with LoRA (`peft=lora`, trainer/megatron/lora.py): the base model frozen, LoRA adapters
trained. Same byte accounting as `plan.trainer_memory` (Megatron mixed precision, Megatron-Core's
"Distributed Optimizer" table), applied to what is trained:

* base weights: bf16 2 B per parameter held (the FP32 head 4 B), with no gradient buffer and no optimizer state
  (DDP and the optimizer skip parameters without `requires_grad`);
* adapters (A [r, in], B [out, r] per adapted linear, split as the trainer splits them: a column-parallel linear's
  A replicated over TP and B split, a row-parallel one's A split and B replicated; routed experts whole on their
  expert-parallel rank): bf16 weights 2 B, FP32 gradient 4 B, FP32 main copy and Adam moments 12 B, the 12 B divided
  by the data-parallel size (experts: expert data-parallel) with the distributed optimizer;
* activations, CUDA context, NCCL, the head's transients and fragmentation as in full training (`plan.py`: the
  frozen base still back-propagates through every layer), plus each adapter's low-rank activation (r values per
  token, 2 B) per layer and micro-batch in flight, which the full-training count has no term for.
"""

from __future__ import annotations

from dataclasses import replace

from scalerl_mega.cluster.plan import (
    Device,
    MemoryReport,
    ModelShape,
    TrainLayout,
    runtime_bytes,
    smallest_trainer_layout,
    stage_activation_bytes,
    stage_params,
)

COLUMN = ("qkv", "fc1", "shared_fc1")
EXPERT = ("expert_fc1", "expert_fc2")


def _linears(model: ModelShape, *, dense: bool) -> list[tuple[str, int, int]]:
    """(kind, in, out) of one layer's adaptable linears (a dense or an MoE layer)."""
    h, hd = model.hidden, model.head_dim
    rows = [("qkv", h, (model.heads + 2 * model.kv_heads) * hd), ("proj", model.heads * hd, h)]
    if dense:
        return rows + [("fc1", h, 2 * model.ffn), ("fc2", model.ffn, h)]
    rows += [("expert_fc1", h, 2 * model.expert_ffn), ("expert_fc2", model.expert_ffn, h)]
    if model.shared_expert_ffn:
        rows += [("shared_fc1", h, 2 * model.shared_expert_ffn), ("shared_fc2", model.shared_expert_ffn, h)]
    return rows


def stage_adapter_params(model: ModelShape, layout: TrainLayout, stage: int, *, rank: int,
                         kinds: set[str]) -> dict[str, int]:
    """Adapter parameters one GPU of pipeline stage `stage` holds: {"body": ..., "expert": ...} (module doc)."""
    t, lps = layout.tp, model.layers // layout.pp
    moe = model.stage_moe_layers(layout.pp, stage)
    body = expert = 0
    for n_layers, dense in ((lps - moe, True), (moe, False)):
        for kind, i, o in _linears(model, dense=dense):
            if kind not in kinds:
                continue
            if kind in EXPERT:
                expert += n_layers * (model.num_experts // layout.ep) * rank * (i + o)
            elif kind in COLUMN:
                body += n_layers * rank * (i + o // t)
            else:
                body += n_layers * rank * (i // t + o)
    return {"body": body, "expert": expert}


def _adapter_activation_bytes(model: ModelShape, layout: TrainLayout, stage: int, *, rank: int, kinds: set[str]) -> int:
    """r bf16 values per token per adapted linear, per layer and micro-batch in flight (1F1B, as plan.py counts)."""
    n = layout.seq_len * layout.micro_batch
    lps = model.layers // layout.pp
    moe = model.stage_moe_layers(layout.pp, stage)
    per_mb = 0
    for n_layers, dense in ((lps - moe, True), (moe, False)):
        for kind, _, _ in _linears(model, dense=dense):
            if kind in kinds:
                tokens = n * model.top_k if kind in EXPERT else n
                per_mb += n_layers * 2 * rank * tokens
    m = layout.pp if layout.num_microbatches is None else layout.num_microbatches
    return min(layout.pp - stage, m) * per_mb


def lora_trainer_memory(model: ModelShape, layout: TrainLayout, device: Device, *, rank: int,
                        kinds: set[str]) -> MemoryReport:
    """Per-GPU trainer memory with LoRA of `rank` on `kinds` (config.peft.target_kinds), most loaded stage."""
    layout.validate(model)
    if model.mla:
        raise ValueError(f"{model.name}: LoRA on MLA models is deferred (peft.kind=lora refuses them)")
    reports = []
    for stage in sorted({0, layout.pp - 1}):
        base = stage_params(model, layout, stage)
        ad = stage_adapter_params(model, layout, stage, rank=rank, kinds=kinds)
        head_w = 4 if layout.fp32_head else 2
        opt_div, opt_div_e = (layout.dp, layout.edp) if layout.distributed_optimizer else (1, 1)
        activations = stage_activation_bytes(model, layout, stage)
        activations += _adapter_activation_bytes(model, layout, stage, rank=rank, kinds=kinds)
        components = {
            "base_weights_bf16": 2 * (base["body"] + base["expert"]) + head_w * base["head"],
            "adapter_weights": 2 * (ad["body"] + ad["expert"]),
            "adapter_grads_fp32": 4 * (ad["body"] + ad["expert"]),
            "adapter_optimizer": 12 * ad["body"] // opt_div + 12 * ad["expert"] // opt_div_e,
            "activations": activations,
        }
        components.update(runtime_bytes(model, layout, stage, activations=activations))
        notes = [f"pipeline stage {stage}: LoRA r={rank}; adapter params/GPU non-expert={ad['body']:,} "
                 f"expert={ad['expert']:,}; frozen base params/GPU {sum(base.values()):,}"]
        reports.append(MemoryReport(role="trainer (LoRA)", components=components, budget_bytes=device.budget_bytes,
                                    notes=notes))
    return max(reports, key=lambda r: r.total_bytes)


def smallest_lora_layout(model: ModelShape, device: Device, *, base: TrainLayout, rank: int, kinds: set[str],
                         gpus_per_node: int, max_gpus: int = 1024) -> TrainLayout | None:
    """Fewest whole nodes of `gpus_per_node` GPUs whose layout fits with LoRA (then lowest pp, then lowest tp, as
    `plan.smallest_trainer_layout` orders them)."""
    for world in range(gpus_per_node, max_gpus + 1, gpus_per_node):
        lay = smallest_trainer_layout(model, device, base=base, max_gpus=world, world=world,
                                      memory=lambda m, lay, d: lora_trainer_memory(m, lay, d, rank=rank, kinds=kinds))
        if lay is not None:
            return replace(lay)
    return None
