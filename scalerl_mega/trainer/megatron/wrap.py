"""Wrap a built `GPTModel` for training, Megatron's way: mixed precision, DDP, optimizer.

Precision (paper Sec. 3.2, "FP32 Precision for LLM logits"; Megatron-Core mixed precision):

* `params_dtype: bfloat16` -> `Float16Module` (bf16 parameters and activations, FP32 outputs on
  the last stage), DDP with an FP32 gradient buffer (`main_grad`) when `grad_reduce_in_fp32`, and
  `OptimizerConfig(bf16=True)`: the optimizer keeps FP32 main weights and FP32 Adam moments, steps
  them and copies back to the bf16 parameters.
* `model.fp32_lm_head`: after the wrapping (which casts every module to bf16) the output layer is
  cast back to FP32 and fed FP32 hidden states (`models.ensure_fp32_lm_head`), so logits and the
  log-softmax stay FP32; without it the output layer really runs in bf16 (the `bf16_head` ablation).
* Distributed optimizer (`optim.use_distributed_optimizer`, default on when DP > 1, and with the
  FP32 head on bf16 params: see `MegatronConfig.distributed_optimizer`): FP32 main
  params and Adam moments sharded over the data-parallel group (expert ones over expert-DP);
  `optim.overlap_grad_reduce` / `optim.overlap_param_gather` are passed to DDP/optimizer as given.
"""

from __future__ import annotations

from typing import Any

from scalerl_mega.model.config import MegatronConfig


def data_parallel_size() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_world_size()


def wrap_model(gpt, tcfg, cfg: MegatronConfig) -> Any:
    """`GPTModel` -> (Float16Module ->) Megatron DDP, per `cfg` (parallel state initialised)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    from scalerl_mega.trainer.megatron import models

    module = gpt
    if cfg.bf16:
        module = Float16Module(tcfg, gpt)
        if cfg.model.fp32_lm_head:
            models.ensure_fp32_lm_head(gpt)  # Float16Module cast it to bf16: back to FP32
    distopt = cfg.distributed_optimizer(data_parallel_size())
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=cfg.grad_reduce_in_fp32, overlap_grad_reduce=cfg.optim.overlap_grad_reduce,
        overlap_param_gather=cfg.optim.overlap_param_gather and distopt, use_distributed_optimizer=distopt)
    return DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=module)


def optimizer_config(cfg: MegatronConfig):
    """Megatron `OptimizerConfig`: AdamW, bf16 mixed precision (FP32 main params) when `cfg.bf16`."""
    import torch
    from megatron.core.optimizer import OptimizerConfig

    o = cfg.optim
    distopt = cfg.distributed_optimizer(data_parallel_size())
    return OptimizerConfig(optimizer="adam", lr=o.lr, min_lr=o.lr, weight_decay=o.weight_decay,
                           adam_beta1=o.adam_beta1, adam_beta2=o.adam_beta2, adam_eps=o.adam_eps,
                           clip_grad=o.clip_grad, bf16=cfg.bf16, fp16=False,
                           params_dtype=torch.bfloat16 if cfg.bf16 else torch.float32,
                           main_params_dtype=torch.float32, main_grads_dtype=torch.float32,
                           use_distributed_optimizer=distopt,
                           overlap_param_gather=o.overlap_param_gather and distopt)


def build_optimizer(chunks: list, cfg: MegatronConfig, *, use_gloo_process_groups: bool = True):
    """`get_megatron_optimizer` over the DDP-wrapped chunks (a ChainedOptimizer; dense + expert).
    `use_gloo_process_groups=False` for a process group without gloo sub-groups (the dry run)."""
    from megatron.core.optimizer import get_megatron_optimizer

    optimizer = get_megatron_optimizer(optimizer_config(cfg), chunks, use_gloo_process_groups=use_gloo_process_groups)
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        fix_mixed_dtype_group_order(sub)
    return optimizer


def fix_mixed_dtype_group_order(optimizer) -> None:
    """Repair `DistributedOptimizer.model_param_group_index_map` for param groups that mix FP32 and
    bf16 parameters (bf16 body + FP32 head in one weight-decay group).

    Megatron-Core 0.16.1 numbers each parameter's position in its optimizer group in grad-buffer order
    (`_build_optimizer_group_ranges`), but then builds the group as [FP32 shards..., FP32 copies of the
    bf16 shards...] (`_build_model_and_main_param_groups`). With both kinds in one group the positions
    point at the wrong tensors, and the dp_reshardable checkpoint fails (`assert tensors[key].shape ==
    (gbuf_local_end - gbuf_local_start,)`) or would pair states with the wrong parameters. The map is
    rebuilt in the group's real order; groups of one dtype are unchanged. No-op for other optimizers.
    """
    fp32_groups = getattr(optimizer, "model_fp32_groups", None)
    f16_groups = getattr(optimizer, "model_float16_groups", None)
    if fp32_groups is None or f16_groups is None:
        return
    fixed = {}
    for index, (fp32, f16) in enumerate(zip(fp32_groups, f16_groups)):
        for order, param in enumerate([*fp32, *f16]):
            fixed[param] = (index, order)
    optimizer.model_param_group_index_map = fixed
