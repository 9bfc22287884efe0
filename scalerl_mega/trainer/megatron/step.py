"""Training step on Megatron-Core: DDP + Megatron optimizer + pipeline schedules + pluggable loss.

Batches are dicts of [B, T] tensors (the global batch, identical on every rank): `input_ids`,
`position_ids`, `targets`, `loss_mask`, plus anything the loss needs. Each DP rank takes its
B/dp rows and splits them into micro-batches of `micro_batch_size` rows.

Loss contract: `loss_fn(logp_BT, mb) -> (loss, metrics)` where `logp_BT` are FP32 log-probs of
`mb["targets"]` and `loss` is this micro-batch's share of the *global* objective (e.g. a token sum
divided by the token count of the whole global batch, available as `mb["global_tokens"]`). Summing
the returned losses over micro-batches and DP ranks gives the objective; this module undoes
Megatron's 1/num_microbatches and DDP's 1/dp averaging so gradients are those of that sum.
Metrics are summed the same way (so make them shares too).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

from scalerl_mega.trainer.megatron.config import OptimConfig, ParallelConfig

LossFn = Callable[[Any, dict], tuple[Any, dict]]


# ----------------------------------------------------------------------------- log-probs
def token_logprobs(logits_BTV, targets_BT):
    """FP32 log p(target) from (vocab-parallel) logits [B, T, V/tp]; exact at any TP size.

    `vocab_parallel_cross_entropy` subtracts the max from its input and exponentiates it in
    place, so it gets a private FP32 copy (`.float()` alone is not a copy for FP32 logits).
    """
    import torch
    from megatron.core import tensor_parallel

    logits = logits_BTV.to(torch.float32, copy=True)
    return -tensor_parallel.vocab_parallel_cross_entropy(logits, targets_BT)


def next_token_ce_loss(logp_BT, mb: dict) -> tuple[Any, dict]:
    """Masked next-token cross-entropy, normalised by the global number of trained tokens."""
    mask = mb["loss_mask"].float()
    loss = -(logp_BT * mask).sum() / mb["global_tokens"]
    return loss, {"loss": loss.detach()}


# ----------------------------------------------------------------------------- setup
def wrap_ddp(model, tcfg, *, use_distributed_optimizer: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=use_distributed_optimizer)
    return DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=model)


def build_optimizer(chunks: list, optim: OptimConfig):
    """AdamW through `get_megatron_optimizer` (FP32; the distributed optimizer if configured)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    cfg = OptimizerConfig(optimizer="adam", lr=optim.lr, min_lr=optim.lr, weight_decay=optim.weight_decay,
                          adam_beta1=optim.adam_beta1, adam_beta2=optim.adam_beta2, adam_eps=optim.adam_eps,
                          clip_grad=optim.clip_grad, bf16=False, fp16=False, params_dtype=torch.float32,
                          use_distributed_optimizer=optim.use_distributed_optimizer)
    return get_megatron_optimizer(cfg, chunks)


def set_lr(optimizer, optim: OptimConfig, step: int) -> float:
    """Linear warmup then constant LR (paper App. A.3); weight decay scaled by each group's wd_mult."""
    lr = optim.lr_at(step)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
        group["weight_decay"] = optim.weight_decay * group.get("wd_mult", 1.0)
    return lr


def configure_schedule(tcfg, chunks: list) -> None:
    """Hook Megatron's grad finalisation (DP reduce, tied/SP/embedding grads) into the schedules."""
    from megatron.core.distributed import finalize_model_grads

    tcfg.finalize_model_grads_func = finalize_model_grads
    tcfg.no_sync_func = chunks[0].no_sync if len(chunks) == 1 else [c.no_sync for c in chunks]


# ----------------------------------------------------------------------------- batches
def local_microbatches(batch: dict, *, micro_batch_size: int) -> list[dict]:
    """This DP rank's rows of the global batch, split into micro-batches (dicts of tensors)."""
    from megatron.core import parallel_state as ps

    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = batch["input_ids"].shape[0]
    if rows % (dp * micro_batch_size):
        raise ValueError(f"batch: {rows} rows are not divisible by dp*micro_batch_size="
                         f"{dp}*{micro_batch_size}")
    per_rank = rows // dp
    global_tokens = batch["loss_mask"].float().sum().clamp_min(1.0)
    out = []
    for start in range(dp_rank * per_rank, (dp_rank + 1) * per_rank, micro_batch_size):
        mb = {k: (v[start:start + micro_batch_size] if _is_rowwise(v, rows) else v) for k, v in batch.items()}
        mb["global_tokens"] = global_tokens
        out.append(mb)
    return out


def _is_rowwise(value: Any, rows: int) -> bool:
    import torch

    return torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows


def _to_device(mb: dict, device) -> dict:
    import torch

    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in mb.items()}


# ----------------------------------------------------------------------------- step
def forward_backward(chunks: list, batch: dict, *, loss_fn: LossFn, parallel: ParallelConfig,
                     forward_only: bool = False, collect_logprobs: bool = False) -> dict:
    """Run the pipeline schedule over this rank's micro-batches.

    Returns summed metrics (all-reduced over DP, broadcast from the last pipeline stage) and, if
    `collect_logprobs`, this DP rank's log-probs `logp_BT` (last stage only, else None).
    """
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    mbs = local_microbatches(batch, micro_batch_size=parallel.micro_batch_size)
    n_mb = len(mbs)
    dp = ps.get_data_parallel_world_size()
    device = next(chunks[0].parameters()).device
    scale = float(n_mb * dp)

    def loss_func(mb, output):
        logp = token_logprobs(output, mb["targets"])
        loss, metrics = loss_fn(logp, mb)
        metrics = {k: (v.detach().float() if torch.is_tensor(v) else torch.tensor(float(v))) for k, v in metrics.items()}
        if collect_logprobs:
            metrics["__logp"] = logp.detach()
        return loss * scale, metrics

    def forward_step(data_iterator: Iterator, model):
        mb = _to_device(next(data_iterator), device)
        output = model(mb["input_ids"], mb["position_ids"], None)
        return output, partial(loss_func, mb)

    seq_len = batch["input_ids"].shape[1]
    store = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(mbs) if len(chunks) == 1 else [iter(mbs) for _ in chunks],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=n_mb,
        seq_length=seq_len,
        micro_batch_size=parallel.micro_batch_size,
        forward_only=forward_only,
    )
    return _reduce_metrics(store, collect_logprobs=collect_logprobs)


def _reduce_metrics(store: list, *, collect_logprobs: bool) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    last = ps.is_pipeline_last_stage()
    logp = None
    keys: list[str] = []
    if last and store:
        keys = sorted(k for k in store[0] if k != "__logp")
        if collect_logprobs:
            logp = torch.cat([m["__logp"] for m in store], dim=0)
    # the metric key list lives on the last stage; share it with the pipeline group
    holder = [keys]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast_object_list(holder, src=ps.get_pipeline_model_parallel_last_rank(),
                                   group=ps.get_pipeline_model_parallel_group())
    keys = holder[0]
    values = torch.zeros(len(keys), dtype=torch.float64)
    if last and keys:
        for m in store:
            values += torch.stack([m[k].double().sum().cpu() for k in keys])
        if ps.get_data_parallel_world_size() > 1:
            dist.all_reduce(values, group=ps.get_data_parallel_group())
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(values, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
    out: dict[str, Any] = {k: float(v) for k, v in zip(keys, values.tolist())}
    if collect_logprobs:
        out["logp_BT"] = logp
    return out


def train_step(chunks: list, optimizer, batch: dict, *, step: int, optim: OptimConfig,
               parallel: ParallelConfig, loss_fn: LossFn = next_token_ce_loss) -> dict[str, float]:
    """Zero grads, forward/backward over all micro-batches, clip + AdamW step. Returns metrics."""
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    metrics = forward_backward(chunks, batch, loss_fn=loss_fn, parallel=parallel)
    lr = set_lr(optimizer, optim, step)
    ok, grad_norm, _ = optimizer.step()
    metrics.update(lr=lr, grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                   update_successful=float(bool(ok)))
    return metrics


def compute_logprobs(chunks: list, batch: dict, *, parallel: ParallelConfig):
    """Forward-only FP32 log-probs of `batch["targets"]`: this DP rank's rows [B/dp, T] on the last
    pipeline stage (None on other stages)."""
    import torch

    def no_loss(logp_BT, mb):
        return logp_BT.sum() * 0.0, {}

    with torch.no_grad():
        out = forward_backward(chunks, batch, loss_fn=no_loss, parallel=parallel, forward_only=True,
                               collect_logprobs=True)
    return out["logp_BT"]
