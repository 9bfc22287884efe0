"""The LoRA adapters of a model, counted from its shape (pure): which linears `peft.targets` adapt, their full
(unsharded) input and output widths, and the adapters' parameter count `r (in + out)` per linear (Hu et al. 2021:
A is [r, in], B is [out, r]). The planner sizes the trainer from it and the trainer reports adapter bytes from it;
tests compare it with the parameters `trainer/megatron/lora.inject_lora` really creates.
"""

from __future__ import annotations

from scalerl_mega.model.config import ModelConfig


def adapted_linears(model: ModelConfig, kinds: set[str]) -> list[tuple[str, int, int, int]]:
    """(kind, in, out, how many in the model) for each adapted linear kind of a `ModelConfig`, `kinds` the
    module kinds the targets select (`config.peft.target_kinds`)."""
    hidden, heads, groups, hd = model.hidden_size, model.num_attention_heads, model.num_query_groups, model.kv_channels
    moe_layers = sum(1 for i in range(model.num_layers) if model.is_moe_layer(i))
    dense_layers = model.num_layers - moe_layers
    rows = [
        ("qkv", hidden, (heads + 2 * groups) * hd, model.num_layers),
        ("proj", heads * hd, hidden, model.num_layers),
        ("fc1", hidden, 2 * model.ffn_hidden_size, dense_layers),
        ("fc2", model.ffn_hidden_size, hidden, dense_layers),
        ("expert_fc1", hidden, 2 * model.expert_ffn, moe_layers * model.num_experts),
        ("expert_fc2", model.expert_ffn, hidden, moe_layers * model.num_experts),
        ("shared_fc1", hidden, 2 * model.shared_expert_ffn, moe_layers if model.shared_expert_ffn else 0),
        ("shared_fc2", model.shared_expert_ffn, hidden, moe_layers if model.shared_expert_ffn else 0),
    ]
    return [r for r in rows if r[0] in kinds and r[3] > 0]


def lora_numel(model: ModelConfig, *, rank: int, kinds: set[str]) -> int:
    """Parameters of all adapters: sum over adapted linears of r (in + out)."""
    return sum(rank * (i + o) * n for _, i, o, n in adapted_linears(model, kinds))


SPLITS = {"qkv": 3, "fc1": 2, "expert_fc1": 2, "shared_fc1": 2}
"""HF projections a fused Megatron linear exports to (q/k/v; gate/up): each carries the shared A."""


def peft_export_numel(model: ModelConfig, *, rank: int, kinds: set[str]) -> int:
    """Elements of the PEFT export of all adapters: B's rows once, A once per HF projection (`SPLITS`)."""
    return sum(rank * (i * SPLITS.get(k, 1) + o) * n for k, i, o, n in adapted_linears(model, kinds))


def lora_expert_numel(model: ModelConfig, *, rank: int, kinds: set[str]) -> int:
    """The routed experts' share of `lora_numel` (split over expert-parallel ranks, not data-parallel ones)."""
    return lora_numel(model, rank=rank, kinds=kinds & {"expert_fc1", "expert_fc2"})
