"""LoRA adapters on Megatron-Core's tensor-parallel linears (Hu et al. 2021, "LoRA: Low-Rank Adaptation"), for
`peft.kind=lora` (config/peft.py).

An adapted linear computes `y = W x + (alpha / r) B A dropout(x)` with `A` [r, in] and `B` [out, r]; `B` starts at
zero, so until the first step the model is the base model bit for bit (`W x + 0`). The adapter is a child module
`lora` of the linear (parameters `<linear>.lora.lora_A`, `<linear>.lora.lora_B`) whose output a forward hook adds to
the linear's: the linear itself, its parameter names and every path that reads them (HF export, conversion,
loading `init_from_hf`) are unchanged. `inject_lora` runs before the DDP / optimizer wrap and freezes every base
parameter, so Megatron's DDP builds no gradient buffer for them and its optimizer keeps no state for them
(both skip parameters without `requires_grad`).

Tensor parallelism (the result equals an unsharded LoRA; the same algebra as the base layers):
- column-parallel base (`linear_qkv`, `linear_fc1`: W sharded on its output): A replicated, B sharded on the
  output like W. The low-rank activation `A x` is identical on every rank; its gradient is summed over the
  tensor-parallel ranks (each holds a slice of B): `copy_to_tensor_model_parallel_region`, or with sequence
  parallelism the all-gather of `A x` over the sequence, whose backward is that sum's reduce-scatter (A's
  gradient is then a per-sequence-shard partial sum, reduced by Megatron like a norm weight's).
- row-parallel base (`linear_proj`, `linear_fc2`: W sharded on its input): A sharded on the input like W, B
  replicated. `A x` is a partial sum, all-reduced (or reduce-scattered over the sequence with sequence
  parallelism, B's gradient then reduced like a norm weight's).
- routed experts (SequentialMLP, expert tensor parallelism 1, experts split over expert-parallel ranks): each local
  expert's linears get their own adapter, plain LoRA on the tokens dispatched to it; the adapters live with their
  expert (reduced over the expert data-parallel group, like the expert's weights).

Fused linears: Megatron fuses q/k/v into `linear_qkv` and gate/up into `linear_fc1`. One adapter on a fused linear
has one A shared by the fused projections and one B whose rows are the fused rows: in Hugging Face/PEFT terms, each
of q_proj/k_proj/v_proj (gate_proj/up_proj) gets that same A and its own slice of B's rows (regrouped as the
weight's rows are). That is exactly the same function, so the PEFT export (lora_export.py) is exact; it is not the
same family as three independent PEFT adapters (whose A differ), which this trainer does not train.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from scalerl_mega.trainer.megatron.global_names import ADAPTER

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config.peft import PeftConfig

_COLUMN = frozenset({"qkv", "fc1", "expert_fc1", "shared_fc1"})
_EXPERT_KINDS = frozenset({"expert_fc1", "expert_fc2"})
_KIND = (
    (re.compile(r"self_attention\.linear_qkv$"), "qkv"),
    (re.compile(r"self_attention\.linear_proj$"), "proj"),
    (re.compile(r"mlp\.experts\.local_experts\.\d+\.linear_fc1$"), "expert_fc1"),
    (re.compile(r"mlp\.experts\.local_experts\.\d+\.linear_fc2$"), "expert_fc2"),
    (re.compile(r"mlp\.shared_experts\.linear_fc1$"), "shared_fc1"),
    (re.compile(r"mlp\.shared_experts\.linear_fc2$"), "shared_fc2"),
    (re.compile(r"^decoder\.layers\.\d+\.mlp\.linear_fc1$"), "fc1"),
    (re.compile(r"^decoder\.layers\.\d+\.mlp\.linear_fc2$"), "fc2"),
)


def module_kind(name: str) -> str | None:
    """The `config.peft.TARGET_KINDS` kind of a GPTModel submodule name, or None for a module LoRA never adapts."""
    if not name.startswith("decoder.layers."):
        return None
    for pattern, kind in _KIND:
        if pattern.search(name):
            return kind
    return None


@dataclass(frozen=True)
class Layout:
    """How one adapter is split over ranks, read from its base linear."""

    column: bool
    """Column-parallel base (A replicated, B sharded on the output) or row-parallel (A sharded on the input)."""
    tp: int
    """Ranks the base linear is split over (1 for routed experts: expert tensor parallelism 1)."""
    tp_rank: int
    sequence_parallel: bool
    expert: bool


class LoRAAdapter(torch.nn.Module):
    """`(alpha / r) B A dropout(x)` for one linear (module docstring); `lora_A` [r, in_local], `lora_B` [out_local, r]."""

    def __init__(self, *, layout: Layout, in_local: int, out_local: int, rank: int, alpha: float, dropout: float,
                 a_full: torch.Tensor, like: torch.Tensor) -> None:
        super().__init__()
        self.layout = layout
        self.rank = int(rank)
        self.scale = float(alpha) / float(rank)
        a = a_full if layout.column or layout.tp == 1 else torch.chunk(a_full, layout.tp, dim=1)[layout.tp_rank]
        if tuple(a.shape) != (rank, in_local):
            raise ValueError(f"LoRA A shape {tuple(a.shape)} != {(rank, in_local)}")
        self.lora_A = torch.nn.Parameter(a.to(device=like.device, dtype=like.dtype).contiguous())
        self.lora_B = torch.nn.Parameter(torch.zeros(out_local, rank, device=like.device, dtype=like.dtype))
        self.dropout = torch.nn.Dropout(float(dropout)) if dropout else torch.nn.Identity()
        _mark_parallel(self, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import mappings

        lay = self.layout
        a = torch.nn.functional.linear(self.dropout(x), self.lora_A)
        if lay.tp > 1:
            group = ps.get_tensor_model_parallel_group()
            if lay.column and lay.sequence_parallel:
                a = mappings.gather_from_sequence_parallel_region(a, tensor_parallel_output_grad=True, group=group)
            elif lay.column:
                a = mappings.copy_to_tensor_model_parallel_region(a, group=group)
            elif lay.sequence_parallel:
                a = mappings.reduce_scatter_to_sequence_parallel_region(a, group=group)
            else:
                a = mappings.reduce_from_tensor_model_parallel_region(a, group=group)
        return torch.nn.functional.linear(a, self.lora_B) * self.scale


def _mark_parallel(adapter: LoRAAdapter, layout: Layout) -> None:
    """Megatron's parameter attributes: which tensors are split over TP (grad-norm counting, checkpoint), which are
    sequence-parallel partial sums (reduced over TP by `finalize_model_grads`), which are expert parameters
    (`allreduce=False`: reduced over the expert data-parallel group)."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    sharded, replicated = ((adapter.lora_B, adapter.lora_A) if layout.column else (adapter.lora_A, adapter.lora_B))
    dim = 0 if layout.column else 1
    set_tensor_model_parallel_attributes(sharded, True, dim, 1)
    if layout.expert:  # whole experts per rank: both count like the expert's own weight
        set_tensor_model_parallel_attributes(replicated, True, 0, 1)
    if layout.sequence_parallel and layout.tp > 1:
        replicated.sequence_parallel = True
    for p in (adapter.lora_A, adapter.lora_B):
        p.allreduce = not layout.expert


def _full_a(name: str, *, rank: int, in_full: int, seed: int) -> torch.Tensor:
    """A [r, in_full] for the base weight of global name `name`: Kaiming-uniform as PEFT initialises it
    (`kaiming_uniform_(a=sqrt(5))`, bound 1/sqrt(in)), drawn from a generator seeded by the run's seed and the name,
    so every layout (TP/EP/PP) draws the same full matrix and slices its own part."""
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    bound = 1.0 / math.sqrt(in_full)
    return (torch.rand(rank, in_full, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).float()


def _layout_of(module: torch.nn.Module, kind: str) -> Layout:
    from megatron.core import parallel_state as ps

    expert = kind in _EXPERT_KINDS
    tp = 1 if expert else ps.get_tensor_model_parallel_world_size()
    sp = bool(getattr(module, "sequence_parallel", False)) and tp > 1
    return Layout(column=kind in _COLUMN, tp=tp, tp_rank=0 if tp == 1 else ps.get_tensor_model_parallel_rank(),
                  sequence_parallel=sp, expert=expert)


def _adapter_input(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the base linear multiplies: its input, or for TransformerEngine's fused norm + linear
    (`TELayerNormColumnParallelLinear`, GPU) the RMS-normalised input (its `layer_norm_weight`)."""
    gamma = getattr(module, "layer_norm_weight", None)
    if gamma is None:
        return x
    config = module.config
    if config.normalization != "RMSNorm":
        raise NotImplementedError(f"LoRA on a fused {config.normalization} + linear (only RMSNorm)")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + config.layernorm_epsilon)
    g = gamma.float() + 1 if getattr(config, "layernorm_zero_centered_gamma", False) else gamma.float()
    return (y * g).to(x.dtype)


def _add_adapter_output(module: torch.nn.Module, args: tuple, output: tuple | torch.Tensor) -> tuple | torch.Tensor:
    """Forward hook of an adapted linear: its (output, bias) with the adapter's output added to the output."""
    delta = getattr(module, ADAPTER)(_adapter_input(module, args[0]))
    if isinstance(output, tuple):
        return (output[0] + delta.to(output[0].dtype), *output[1:])
    return output + delta.to(output.dtype)


def adapted_modules(gpt: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(local module name, linear) of every adapted linear of a GPTModel, in model order."""
    for name, module in gpt.named_modules():
        if isinstance(getattr(module, ADAPTER, None), LoRAAdapter):
            yield name, module


def global_weight_name(gpt: torch.nn.Module, local_module: str, *, num_experts: int) -> str:
    """The conversion tables' global name of an adapted linear's weight (global layer and expert index)."""
    from scalerl_mega.convert import sharding
    from scalerl_mega.trainer.megatron.global_names import rank_offsets

    layer_offset, expert_offset = rank_offsets(gpt, num_experts=num_experts)
    return sharding.to_global_name(local_module + ".weight", layer_offset=layer_offset, expert_offset=expert_offset)


def inject_lora(gpt: torch.nn.Module, peft: PeftConfig, *, num_experts: int, seed: int) -> int:
    """Freeze every parameter of `gpt` (one GPTModel chunk, before DDP) and add a `LoRAAdapter` to each linear the
    targets select (`peft`: config.peft.PeftConfig). Returns the number of adapted linears on this rank; a chunk with
    none is an error naming `peft.targets` (nothing would train)."""
    from scalerl_mega.config.peft import target_kinds

    kinds = target_kinds(list(peft.targets))
    for p in gpt.parameters():
        p.requires_grad_(False)
    chosen = [(n, m, module_kind(n)) for n, m in gpt.named_modules() if module_kind(n) in kinds]
    grouped = [n for n, m in gpt.named_modules() if n.endswith(("mlp.experts.linear_fc1", "mlp.experts.linear_fc2"))]
    if grouped and kinds & _EXPERT_KINDS:
        raise NotImplementedError(f"peft.targets={list(peft.targets)!r}: LoRA on grouped-GEMM experts ({grouped[0]}) "
                                  "is not implemented; the trainer builds SequentialMLP experts (moe_grouped_gemm off)")
    for name, module, kind in chosen:
        layout = _layout_of(module, kind)
        out_local, in_local = (int(s) for s in module.weight.shape)
        in_full = in_local if layout.column else in_local * layout.tp
        a_full = _full_a(global_weight_name(gpt, name, num_experts=num_experts), rank=int(peft.rank),
                         in_full=in_full, seed=seed)
        adapter = LoRAAdapter(layout=layout, in_local=in_local, out_local=out_local, rank=int(peft.rank),
                              alpha=float(peft.alpha), dropout=float(peft.dropout), a_full=a_full, like=module.weight)
        module.add_module(ADAPTER, adapter)
        module.register_forward_hook(_add_adapter_output)
    if not chosen and len(gpt.decoder.layers):
        raise ValueError(f"peft.targets={list(peft.targets)!r} selects no linear of this model")
    return len(chosen)


def trainable_numel(gpt: torch.nn.Module) -> int:
    """Elements of this rank's trainable parameters (the adapters' local shards after `inject_lora`)."""
    return sum(p.numel() for p in gpt.parameters() if p.requires_grad)


def merge_adapters(gpt: torch.nn.Module) -> int:
    """Fold every adapter of a one-rank model into its base weight, `W += (alpha / r) B A` (in float64, rounded once
    to W's dtype), and zero B, so the model computes the same function with plain weights (a merged HF export).
    Returns the number of merged linears."""
    n = 0
    with torch.no_grad():
        for _, module in adapted_modules(gpt):
            adapter = getattr(module, ADAPTER)
            if adapter.layout.tp > 1:
                raise NotImplementedError("merge_adapters runs on a one-rank model (the converter's)")
            delta = (adapter.lora_B.double() @ adapter.lora_A.double()) * adapter.scale
            module.weight.add_(delta.to(module.weight.dtype))
            adapter.lora_B.zero_()
            n += 1
    return n
