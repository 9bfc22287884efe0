"""Training step on Megatron-Core: pipeline schedules + pluggable loss over DDP chunks and the optimizer
built by `wrap.py` (the same builders for training, tests and benches).

Batches are dicts of [B, T] tensors (the global batch, identical on every rank): `input_ids`,
`position_ids`, `targets`, `loss_mask`, plus anything the loss needs. Each DP rank executes its share
of the batch's micro-batch plan (below).

Loss contract: `loss_fn(logp_BT, mb) -> (loss, metrics)` where `logp_BT` are FP32 log-probs of
`mb["targets"]` and `loss` is this micro-batch's share of the *global* objective (e.g. a token sum
divided by the token count of the whole global batch, available as `mb["global_tokens"]`). Summing
the returned losses over micro-batches and DP ranks gives the objective; this module undoes
Megatron's 1/num_microbatches and DDP's 1/dp averaging so gradients are those of that sum.
Metrics are summed the same way (so make them shares too); keys ending in `_max` are maxima instead.
RL micro-batches (with `advantages`) on the logits path also get `mb["entropy"]` [B, T] (no grad).

Fused head (paper Sec. 3.2 "FP32 Precision for LLM logits"): with `head_loss_fn`, the model runs
without its output layer and `head_loss_fn(head, mb) -> (loss, metrics)` gets an `LMHead`: the last
hidden states and this rank's (vocab-parallel) output-layer weight shard, so a loss such as
`objective.fused_logprob.cispo_from_hidden` computes the FP32 head chunk by chunk and no [N, V]
logits exist. Same loss contract as above.

Micro-batches: the batch's plan (`microbatch.MicroBatchPlan`, from `batch.pack_micro_batches`: rows
sorted by length, each micro-batch trimmed to its own longest row, or packed several samples to a
row) split over DP ranks (`microbatch.rank_share`); without a plan, `micro_batch_size` rows each or,
given `micro_batch_tokens`, planned by the same function. Packed rows (`plan.packed`) attend per
sample: Megatron's THD `PackedSeqParams` (cu_seqlens) with Transformer Engine on GPU, else a
block-diagonal causal attention mask with per-sample RoPE positions (`packed_inputs`). Every step
returns the executed `padding_fraction` (padded share of the model's input tokens, over all
micro-batches and DP ranks) and `executed_tokens`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator

from scalerl_mega.model.config import OptimConfig, ParallelConfig
from scalerl_mega.trainer.megatron.models import head_dtype, unwrap_gpt
from scalerl_mega.trainer.microbatch import MicroBatchPlan, plan_of, unpack
from scalerl_mega.trainer.policy_loss import next_token_ce_loss

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from megatron.core.models.gpt import GPTModel

    from scalerl_mega.trainer.megatron.routing import RouteTracker

LossFn = Callable[[Any, dict], tuple[Any, dict]]


@dataclass(frozen=True, kw_only=True)
class LMHead:
    """What a fused head loss needs instead of logits.

    `hidden_BTH`: final (post-norm) hidden states [B, T, H] of the micro-batch, full sequence, already
    passed through the TP region op, so the gradient a rank returns for them may be its vocab shard's
    partial sum (the region op's backward reduces it over the TP group). `weight_VH`: this rank's output
    layer rows [V/tp, H] (the shared embedding when tied), starting at vocab id `vocab_start`. `group`:
    the TP group (None at tp=1); pass it with `vocab_start` and `reduce_grad_hidden=False` to the
    `objective.fused_logprob` functions.
    """

    hidden_BTH: Any
    weight_VH: Any
    vocab_start: int
    group: Any

    def logprobs(self, targets_BT, *, mask_BT=None):
        """FP32 log p(target) [B, T] through `fused_logprob.chunked_logprob` (differentiable); with
        `mask_BT`, only masked-in tokens are computed (0 elsewhere)."""
        import torch

        from scalerl_mega.objective.fused_logprob import chunked_logprob

        B, T, H = self.hidden_BTH.shape
        if mask_BT is None:
            mask_BT = torch.ones(B, T, dtype=torch.bool, device=self.hidden_BTH.device)
        sel = (mask_BT > 0).reshape(-1)
        out = torch.zeros(B * T, dtype=torch.float32, device=self.hidden_BTH.device)
        if bool(sel.any()):
            logp = chunked_logprob(self.hidden_BTH.reshape(B * T, H)[sel], self.weight_VH,
                                   targets_BT.reshape(-1)[sel], group=self.group, vocab_start=self.vocab_start,
                                   reduce_grad_hidden=False)
            out = out.masked_scatter(sel, logp)
        return out.view(B, T)

    def zero_loss(self):
        """A zero that still reaches the hidden states and weight (for micro-batches without trained
        tokens: every rank must run the same backward)."""
        return (self.hidden_BTH.sum() + self.weight_VH.sum()) * 0.0


HeadLossFn = Callable[[LMHead, dict], tuple[Any, dict]]


# ----------------------------------------------------------------------------- log-probs
def token_logprobs(logits_BTV, targets_BT, *, dtype=None):
    """FP32 log p(target) from (vocab-parallel) logits [B, T, V/tp]; exact at any TP size.

    `vocab_parallel_cross_entropy` subtracts the max from its input and exponentiates it in
    place, so it gets a private FP32 copy (`.float()` alone is not a copy for FP32 logits).
    `dtype`: compute in this dtype instead (the bf16-head ablation: `models.head_dtype`).
    """
    import torch
    from megatron.core import tensor_parallel

    logits = logits_BTV.to(torch.float32 if dtype is None else dtype, copy=True)
    return -tensor_parallel.vocab_parallel_cross_entropy(logits, targets_BT)


def token_entropy(logits_BTV, mask_BT):
    """FP32 entropy [B, T] of the (vocab-parallel) next-token distributions at masked-in positions (0
    elsewhere), without grad: a loss diagnostic (`objective.fused_logprob.logits_entropy`)."""
    import torch
    from megatron.core import parallel_state as ps

    from scalerl_mega.objective.fused_logprob import logits_entropy

    B, T, V = logits_BTV.shape
    sel = (mask_BT > 0).reshape(-1)
    out = torch.zeros(B * T, dtype=torch.float32, device=logits_BTV.device)
    if bool(sel.any()):
        group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
        out[sel] = logits_entropy(logits_BTV.detach().reshape(B * T, V)[sel], group=group)
    return out.view(B, T)


# ----------------------------------------------------------------------------- setup
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
def local_microbatches(batch: dict, plan: MicroBatchPlan, *, cols_multiple: int = 1) -> list[dict]:
    """This DP rank's micro-batches of `plan` (`microbatch.rank_share`: the same count on every DP
    rank, fillers where the plan runs short), cut from the global batch (`microbatch.cut_micro_batch`)."""
    from megatron.core import parallel_state as ps

    from scalerl_mega.trainer.microbatch import aux_loss_weight, cut_micro_batch, rank_share

    dp = ps.get_data_parallel_world_size()
    share = rank_share(plan.micro_batches, dp=dp, dp_rank=ps.get_data_parallel_rank())
    global_tokens = batch["loss_mask"].float().sum().clamp_min(1.0)
    out = []
    for rows in share:
        mb = cut_micro_batch(batch, rows, plan.lengths, packed=plan.packed, cols_multiple=cols_multiple)
        mb["global_tokens"] = global_tokens
        mb["aux_loss_weight"] = aux_loss_weight(n_micro_batches=len(plan.micro_batches), dp=dp, filler=not rows)
        out.append(mb)
    return out


@contextlib.contextmanager
def aux_loss_scaled(config, weight: float):
    """During one micro-batch's forward, the MoE auxiliary-loss coefficient(s) of `config` (the
    TransformerConfig its routers read at call time) times `weight` (`microbatch.aux_loss_weight`).
    The auxiliary loss enters the graph with the coefficient already applied, so the weighting holds
    whichever backward runs next (pipeline schedules interleave them). Dense models: no-op."""
    base = getattr(config, "moe_aux_loss_coeff", None)
    if not getattr(config, "num_moe_experts", None) or base is None or weight == 1.0:
        yield
        return
    config.moe_aux_loss_coeff = [c * weight for c in base] if isinstance(base, list) else base * weight
    try:
        yield
    finally:
        config.moe_aux_loss_coeff = base


def _to_device(mb: dict, device) -> dict:
    import torch

    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in mb.items()}


# ----------------------------------------------------------------------------- fused head
@contextlib.contextmanager
def hidden_states_only(gpt):
    """Run `gpt.forward` without the output layer: Megatron-Core 0.16 `GPTModel._postprocess` returns
    the (final-norm) decoder output [S(/tp under SP), B, H] when `post_process` is False, before any
    MTP-free output-layer work. The flag is only read there at forward time; it is restored after."""
    if getattr(gpt, "mtp_process", False):
        raise ValueError("fused head loss: models with multi-token prediction are not supported")
    saved = gpt.post_process
    gpt.post_process = False
    try:
        yield
    finally:
        gpt.post_process = saved


def lm_head(gpt, hidden_SBH) -> LMHead:
    """`LMHead` from the decoder output [S, B, H]: the same TP region op as Megatron's output layer
    (ColumnParallelLinear: all-gather of the sequence under SP, else identity with an all-reduce of the
    gradient), transposed to [B, T, H]."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights \
        else gpt.output_layer.weight
    tp = ps.get_tensor_model_parallel_world_size()
    group = ps.get_tensor_model_parallel_group() if tp > 1 else None
    if tp > 1 and gpt.config.sequence_parallel:
        hidden_SBH = tensor_parallel.gather_from_sequence_parallel_region(
            hidden_SBH, tensor_parallel_output_grad=True, group=group)
    hidden_BTH = hidden_SBH.transpose(0, 1).contiguous()
    if tp > 1 and not gpt.config.sequence_parallel:
        # on a contiguous tensor: Megatron's backward all-reduce (mappings._reduce) reduces a
        # `.contiguous()` copy and returns its input, so a non-contiguous gradient would stay unreduced
        hidden_BTH = tensor_parallel.copy_to_tensor_model_parallel_region(hidden_BTH, group=group)
    vocab_start = ps.get_tensor_model_parallel_rank() * weight.shape[0]
    return LMHead(hidden_BTH=hidden_BTH, weight_VH=weight, vocab_start=vocab_start, group=group)


# ----------------------------------------------------------------------------- step
def packed_inputs(gpt, mb: dict) -> tuple[dict, Any]:
    """Model keyword arguments for a micro-batch, and a context for its forward.

    Unpacked: no attention mask (Megatron's causal default). Packed (`cu_seqlens` in `mb`, one row
    [1, L]): with Transformer Engine, THD `PackedSeqParams` (TE restarts RoPE and the causal mask at
    every cu_seqlens boundary); otherwise (CPU, local attention) the block-diagonal causal mask
    `microbatch.block_causal_mask` and per-sample RoPE: Megatron's `RotaryEmbedding` embeds positions
    0..L-1 whatever `position_ids` say, so a forward hook replaces its output by the rows of
    `mb["position_ids"]` (restarting at 0 per sample) for the duration of the forward.
    MoE models get `padding_mask` (routing and the auxiliary loss skip padded positions)."""
    import torch

    kwargs: dict[str, Any] = {}
    if getattr(gpt.config, "num_moe_experts", None):
        kwargs["padding_mask"] = mb["padding_mask"]
    if "cu_seqlens" not in mb:
        return kwargs, contextlib.nullcontext()
    from scalerl_mega.trainer.megatron.models import te_available
    from scalerl_mega.trainer.microbatch import block_causal_mask

    if torch.cuda.is_available() and te_available():
        from megatron.core.packed_seq_params import PackedSeqParams

        cu = mb["cu_seqlens"].to(device=mb["input_ids"].device, dtype=torch.int32)
        kwargs["packed_seq_params"] = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                      max_seqlen_q=int(mb["max_seqlen"]),
                                                      max_seqlen_kv=int(mb["max_seqlen"]))
        return kwargs, contextlib.nullcontext()
    L = int(mb["input_ids"].shape[1])
    kwargs["attention_mask"] = block_causal_mask(mb["cu_seqlens"], L, device=mb["input_ids"].device)
    return kwargs, _rope_at(gpt, mb["position_ids"][0])


@contextlib.contextmanager
def _rope_at(gpt, positions_L):
    """During the forward: `gpt.rotary_pos_emb(...)` returns the embeddings of `positions_L` (see
    `packed_inputs`) instead of those of 0..L-1."""
    rotary = getattr(gpt, "rotary_pos_emb", None)
    if rotary is None:
        yield
        return
    handle = rotary.register_forward_hook(lambda module, args, out: out[positions_L.to(out.device)])
    try:
        yield
    finally:
        handle.remove()


@dataclass(kw_only=True)
class _MicroBatchRunner:
    """The per-micro-batch callbacks `forward_backward` hands Megatron's pipeline schedule:
    `forward_step` (the model call, under the packing / routing-replay / auxiliary-loss contexts) and
    the loss of its output (`loss` on full logits, `head_loss` for the fused head)."""

    loss_fn: LossFn
    head_loss_fn: HeadLossFn | None
    routes: RouteTracker | None
    device: torch.device
    scale: float
    """Undoes Megatron's 1/num_microbatches and DDP's 1/dp averaging (module doc)."""
    forward_only: bool
    collect_logprobs: bool

    @property
    def fused(self) -> bool:
        return self.head_loss_fn is not None and not self.collect_logprobs

    def metrics(self, metrics: dict, mb: dict) -> dict:
        import torch

        out = {k: (v.detach().double() if torch.is_tensor(v) else torch.tensor(float(v), dtype=torch.float64,
                                                                                  device=self.device))
               for k, v in metrics.items()}
        out.update(executed_tokens=mb["executed_tokens"], real_tokens=mb["real_tokens"])
        return out

    def loss(self, mb: dict, output: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, dict]:
        packed = "unpack_index" in mb
        if "logit_temperature" in mb:  # RL at the generator's sampling temperature: softmax(logits / T)
            output = output / mb["logit_temperature"]
        logp = token_logprobs(output, mb["packed_targets" if packed else "targets"], dtype=dtype)
        if packed:
            logp = unpack(logp, mb["unpack_index"])
        if not self.forward_only and "advantages" in mb:  # RL loss diagnostics (policy_loss.py)
            entropy = token_entropy(output, mb["packed_loss_mask" if packed else "loss_mask"])
            mb = {**mb, "entropy": unpack(entropy, mb["unpack_index"]) if packed else entropy}
        loss, metrics = self.loss_fn(logp, mb)
        metrics = self.metrics(metrics, mb)
        if self.collect_logprobs:
            metrics["__logp"] = logp.detach()
            metrics["__rows"] = mb["rows"]
        return loss * self.scale, metrics

    def head_loss(self, mb: dict, gpt: GPTModel, output: torch.Tensor) -> tuple[torch.Tensor, dict]:
        head = lm_head(gpt, output)
        if "unpack_index" in mb:
            head = dataclasses.replace(head, hidden_BTH=unpack(head.hidden_BTH, mb["unpack_index"]))
        loss, metrics = self.head_loss_fn(head, mb)
        return loss * self.scale, self.metrics(metrics, mb)

    def forward_step(self, data_iterator: Iterator[dict], model: torch.nn.Module
                     ) -> tuple[torch.Tensor, Callable[[torch.Tensor], tuple[torch.Tensor, dict]]]:
        mb = _to_device(next(data_iterator), self.device)
        gpt = unwrap_gpt(model)
        kwargs, ctx = packed_inputs(gpt, mb)
        replay = self.routes.scope(mb) if self.routes is not None else contextlib.nullcontext()
        aux = aux_loss_scaled(gpt.config, mb["aux_loss_weight"])
        if self.fused and gpt.post_process:
            with hidden_states_only(gpt), ctx, replay, aux:
                output = model(mb["input_ids"], mb["position_ids"], kwargs.pop("attention_mask", None), **kwargs)
            return output, partial(self.head_loss, mb, gpt)
        with ctx, replay, aux:
            output = model(mb["input_ids"], mb["position_ids"], kwargs.pop("attention_mask", None), **kwargs)
        return output, partial(self.loss, mb, dtype=head_dtype(gpt))


def forward_backward(chunks: list[torch.nn.Module], batch: dict, *, loss_fn: LossFn, parallel: ParallelConfig,
                     forward_only: bool = False, collect_logprobs: bool = False,
                     head_loss_fn: HeadLossFn | None = None, micro_batch_tokens: int | None = None,
                     routes: RouteTracker | None = None, plan: MicroBatchPlan | None = None) -> dict:
    """Run the pipeline schedule over this rank's micro-batches of `plan` (default: `microbatch.plan_of`
    the batch's rows by `micro_batch_tokens` or `parallel.micro_batch_size`).

    `routes` (a `routing.RouteTracker`, MoE models): each micro-batch's forward runs inside its
    `scope` (generator routes replayed per `moe.routing_replay`, agreement counted); its global
    agreement metrics are added to the returned metrics.

    With `head_loss_fn` (and not `collect_logprobs`) the last stage skips the output layer and the
    loss comes from `head_loss_fn(LMHead, mb)`; otherwise from `loss_fn(logp_BT, mb)` on full logits.
    Packed micro-batches are unpacked to per-sample rows before either (`microbatch.unpack`).
    Returns summed metrics (all-reduced over DP, broadcast from the last pipeline stage) and, if
    `collect_logprobs`, `logp_BT`: [B, T] log-probs of the batch's rows this DP rank executed (last
    stage only, else None; zero in other rows and beyond each micro-batch's width).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_model_config

    rows, seq_len = (int(n) for n in batch["input_ids"].shape[:2])
    if plan is None:
        plan = plan_of(rows=rows, seq_len=seq_len, micro_batch_tokens=micro_batch_tokens,
                       micro_batch_size=parallel.micro_batch_size)
    pp, tp = ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
    if pp > 1:  # micro-batches differ in shape: the p2p exchanges each one's shape first
        get_model_config(chunks[0]).variable_seq_lengths = True
    # the model's resolved SP (`ParallelConfig.sequence_parallel_on`: on for MoE with tp > 1 even when
    # `parallel.sequence_parallel` is unset), which scatters the sequence over TP: widths must divide
    sp = bool(get_model_config(chunks[0]).sequence_parallel)
    mbs = local_microbatches(batch, plan, cols_multiple=tp if sp and tp > 1 else 1)
    device = next(chunks[0].parameters()).device
    runner = _MicroBatchRunner(loss_fn=loss_fn, head_loss_fn=head_loss_fn, routes=routes, device=device,
                               scale=float(len(mbs) * ps.get_data_parallel_world_size()),
                               forward_only=forward_only, collect_logprobs=collect_logprobs)
    store = get_forward_backward_func()(
        forward_step_func=runner.forward_step,
        data_iterator=iter(mbs) if len(chunks) == 1 else [iter(mbs) for _ in chunks],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(mbs),
        seq_length=int(mbs[0]["input_ids"].shape[1]),
        micro_batch_size=int(mbs[0]["input_ids"].shape[0]),
        forward_only=forward_only,
    )
    out = _reduce_metrics(store, collect_logprobs=collect_logprobs, device=device, shape=(rows, seq_len))
    executed = out.pop("executed_tokens", 0.0)
    real = out.pop("real_tokens", 0.0)
    if executed:
        out.update(executed_tokens=executed, padding_fraction=1.0 - real / executed)
    if routes is not None:
        out.update(routes.reduce())
    return out


def _reduce_metrics(store: list, *, collect_logprobs: bool, device, shape: tuple[int, int] | None = None) -> dict:
    """Sum the micro-batch metric shares on the last stage (keys ending in `_max`: take their max),
    all-reduce them over DP (sum; MAX for `_max` keys) and broadcast
    them over the pipeline group, so every rank returns the same global values. The reduced tensor
    lives on the model's device (NCCL groups take only CUDA tensors; gloo takes CPU ones).
    `__logp` / `__rows` entries (collect_logprobs) are scattered into a [B, T] = `shape` tensor."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    last = ps.is_pipeline_last_stage()
    logp = None
    keys: list[str] = []
    if last and store:
        keys = sorted(k for k in store[0] if not k.startswith("__"))
        if collect_logprobs:
            logp = torch.zeros(shape, dtype=torch.float32, device=device)
            for m in store:
                rows = m["__rows"].to(device)
                if rows.numel():
                    width = min(int(m["__logp"].shape[1]), shape[1])
                    logp[rows, :width] = m["__logp"][:, :width].float()
    # the metric key list lives on the last stage; share it with the pipeline group
    holder = [keys]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast_object_list(holder, src=ps.get_pipeline_model_parallel_last_rank(),
                                   group=ps.get_pipeline_model_parallel_group())
    keys = holder[0]
    values = torch.zeros(len(keys), dtype=torch.float64, device=device)
    is_max = torch.tensor([k.endswith("_max") for k in keys], dtype=torch.bool, device=device)
    if last and keys:
        values[is_max] = -float("inf")
        for m in store:
            v = torch.stack([m[k].to(device=device, dtype=torch.float64).sum() for k in keys])
            values = torch.where(is_max, torch.maximum(values, v), values + v)
        if ps.get_data_parallel_world_size() > 1:
            maxes = torch.where(is_max, values, -float("inf"))
            dist.all_reduce(values, group=ps.get_data_parallel_group())
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
            values = torch.where(is_max, maxes, values)
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(values, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
    out: dict[str, Any] = {k: float(v) for k, v in zip(keys, values.tolist())}
    if collect_logprobs:
        out["logp_BT"] = logp
    return out


def train_step(chunks: list, optimizer, batch: dict, *, step: int, optim: OptimConfig,
               parallel: ParallelConfig, loss_fn: LossFn = next_token_ce_loss,
               head_loss_fn: HeadLossFn | None = None, micro_batch_tokens: int | None = None,
               routes: RouteTracker | None = None, plan: MicroBatchPlan | None = None) -> dict[str, float]:
    """Zero grads, forward/backward over all micro-batches, clip + AdamW step. Returns metrics.
    `head_loss_fn` selects the fused head (no logits); `plan` the micro-batches (default: planned by
    `micro_batch_tokens`, see `forward_backward`); `routes` the MoE routing replay (`forward_backward`)."""
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    metrics = forward_backward(chunks, batch, loss_fn=loss_fn, parallel=parallel, head_loss_fn=head_loss_fn,
                               micro_batch_tokens=micro_batch_tokens, routes=routes, plan=plan)
    lr = set_lr(optimizer, optim, step)
    ok, grad_norm, _ = optimizer.step()
    metrics.update(lr=lr, grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                   update_successful=float(bool(ok)))
    return metrics


def compute_logprobs(chunks: list, batch: dict, *, parallel: ParallelConfig, micro_batch_tokens: int | None = None,
                     routes: RouteTracker | None = None, plan: MicroBatchPlan | None = None):
    """Forward-only FP32 log-probs of `batch["targets"]`: [B, T], filled in the rows this DP rank
    executed (all rows at dp=1), on the last pipeline stage (None on other stages); with `routes`,
    also the routing agreement metrics: returns (logp, metrics) then."""
    import torch

    def no_loss(logp_BT, mb):
        return logp_BT.sum() * 0.0, {}

    with torch.no_grad():
        out = forward_backward(chunks, batch, loss_fn=no_loss, parallel=parallel, forward_only=True,
                               collect_logprobs=True, micro_batch_tokens=micro_batch_tokens, routes=routes,
                               plan=plan)
    if routes is None:
        return out["logp_BT"]
    return out.pop("logp_BT"), out
