"""FP32 LM-head log-probabilities without materialising [N, V] logits, and the fused CISPO loss.

Paper Sec. 3.2 "FP32 Precision for LLM logits": the trainer computes the LM head (and the softmax) in FP32.
Here logits are computed chunk by chunk over tokens (fp32 GEMM, fp32 log-sum-exp); a chunk's buffer is
reused for its gradient, and grad_hidden / grad_weight are accumulated in fp32.

- `naive_logprob`: the reference (full [N, V] fp32 logits + log_softmax). Kept for tests and the bench.
- `chunked_logprob`: per-token log-probs with a custom backward (recomputes each chunk's logits: 4 GEMMs
  in total). Use it for any loss (DAPO, GRPO, GSPO) via `losses.policy_loss`.
- `cispo_from_hidden`: the CISPO loss of Sec. 3.2 Eq. (cispo) / J_ScaleRL straight from hidden states.
  Because the CISPO coefficient sg(min(rho, eps_high)) * A * w is detached, dL/dlogp_t is a constant -c_t
  known as soon as the token's logp is, so each chunk's gradient c_t * (softmax - onehot) is formed in
  place right after its forward and pushed through the two gradient GEMMs: 3 GEMMs in total, one pass.

Vocab parallel (TP): pass `group` (a torch.distributed process group) and the shard's `vocab_start`;
`weight` is then this rank's [V_local, H] rows. The log-sum-exp is combined across the group with an
all-reduce of the row max and of the sum of exponentials; the target logit comes from the owning shard
(all-reduce sum). grad_weight is the local shard's; grad_hidden is all-reduced over the group when
`reduce_grad_hidden=True` (set False if the caller's region op, e.g. Megatron's
copy_to_tensor_model_parallel_region, already reduces it in its backward).
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_BYTES = 64 * 2**20
"""Budget of the fp32 [chunk, V] logits buffer used to pick the default chunk size."""


def default_chunk_size(vocab: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Largest power of two (16..8192) whose fp32 [chunk, vocab] buffer fits in `chunk_bytes`."""
    c = 16
    while c * 2 <= 8192 and c * 2 * vocab * 4 <= chunk_bytes:
        c *= 2
    return c


def _validate(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_start: int) -> None:
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, H={hidden.shape[1]}], got shape {tuple(weight.shape)}")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets must be [N={hidden.shape[0]}], got shape {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        raise ValueError("hidden is empty: empty batch")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64/int32, got {targets.dtype}")
    if vocab_start < 0:
        raise ValueError(f"vocab_start={vocab_start} must be >= 0")


def naive_logprob(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Reference: log_softmax(h W^T)[target] with the full [N, V] fp32 logits (autograd does the rest)."""
    _validate(hidden, weight, targets, 0)
    logits = hidden.float() @ weight.float().t()
    return torch.log_softmax(logits, dim=-1).gather(1, targets.long()[:, None])[:, 0]


def _all_reduce(t: torch.Tensor, group, op) -> torch.Tensor:
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(t, op=op, group=group)
    return t


def _max_op():
    import torch.distributed as dist

    return dist.ReduceOp.MAX


def _sum_op():
    import torch.distributed as dist

    return dist.ReduceOp.SUM


class _ShardTargets:
    """Local column of each target in this vocab shard, and whether the shard owns it."""

    def __init__(self, targets: torch.Tensor, vocab_start: int, v_local: int):
        local = targets.long() - vocab_start
        self.owned = (local >= 0) & (local < v_local)
        self.index = torch.where(self.owned, local, torch.zeros_like(local))[:, None]


def _chunk_softmax_stats(logits: torch.Tensor, tgt: _ShardTargets, sl: slice, group):
    """Turns `logits` [C, Vl] in place into exp(logits - max) and returns (target logit, max, sum-exp)."""
    owned = tgt.owned[sl]
    t_logit = torch.where(owned, logits.gather(1, tgt.index[sl])[:, 0], torch.zeros((), dtype=logits.dtype,
                                                                                        device=logits.device))
    row_max = logits.amax(dim=1)
    if group is not None:
        _all_reduce(row_max, group, _max_op())
        _all_reduce(t_logit, group, _sum_op())
    logits.sub_(row_max[:, None]).exp_()
    sum_exp = logits.sum(dim=1)
    _all_reduce(sum_exp, group, _sum_op())
    return t_logit, row_max, sum_exp


def _to_grad(logits_exp: torch.Tensor, sum_exp: torch.Tensor, coef: torch.Tensor, tgt: _ShardTargets,
             sl: slice) -> torch.Tensor:
    """In place: exp(logits - max) -> coef * (softmax - onehot), the gradient of -coef * logp wrt logits."""
    logits_exp.mul_((coef / sum_exp)[:, None])
    sub = torch.where(tgt.owned[sl], -coef, torch.zeros_like(coef))
    logits_exp.scatter_add_(1, tgt.index[sl], sub[:, None])
    return logits_exp


def _prep(hidden: torch.Tensor, weight: torch.Tensor):
    w32 = weight if weight.dtype == torch.float32 else weight.float()
    return w32, hidden.dtype != torch.float32


class _ChunkedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, group, vocab_start, reduce_grad_hidden):
        N = hidden.shape[0]
        w32, upcast = _prep(hidden, weight)
        tgt = _ShardTargets(targets, vocab_start, weight.shape[0])
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)
        buf = torch.empty(min(chunk_size, N), weight.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            logits = torch.mm(h, w32.t(), out=buf[: sl.stop - s])
            t_logit, row_max, sum_exp = _chunk_softmax_stats(logits, tgt, sl, group)
            lse[sl] = row_max + sum_exp.log()
            logp[sl] = t_logit - lse[sl]
        ctx.save_for_backward(hidden, weight, lse)
        ctx.tgt, ctx.chunk_size, ctx.group, ctx.reduce = tgt, chunk_size, group, reduce_grad_hidden
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        hidden, weight, lse = ctx.saved_tensors
        tgt, chunk_size, group = ctx.tgt, ctx.chunk_size, ctx.group
        N = hidden.shape[0]
        w32, upcast = _prep(hidden, weight)
        grad_h = torch.empty(N, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        grad_w = torch.zeros_like(w32, dtype=torch.float32)
        buf = torch.empty(min(chunk_size, N), weight.shape[0], dtype=torch.float32, device=hidden.device)
        g = grad_logp.float()
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            logits = torch.mm(h, w32.t(), out=buf[: sl.stop - s])
            logits.sub_(lse[sl][:, None]).exp_()  # softmax
            ones = torch.ones_like(g[sl])
            # d logp / d logits = onehot - softmax; times g: -(g * (softmax - onehot))
            dl = _to_grad(logits, ones, -g[sl], tgt, sl)
            torch.mm(dl, w32, out=grad_h[sl])
            grad_w.addmm_(dl.t(), h)
        if ctx.reduce:
            _all_reduce(grad_h, group, _sum_op())
        return grad_h.to(hidden.dtype), grad_w.to(weight.dtype), None, None, None, None, None


def chunked_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    group=None,
    vocab_start: int = 0,
    reduce_grad_hidden: bool = True,
) -> torch.Tensor:
    """Per-token fp32 log pi(target | hidden) [N] from hidden [N, H] and LM-head weight [V(_local), H]."""
    _validate(hidden, weight, targets, vocab_start)
    chunk_size = chunk_size or default_chunk_size(weight.shape[0])
    return _ChunkedLogProb.apply(hidden, weight, targets, chunk_size, group, vocab_start, reduce_grad_hidden)


class _FusedCispo(torch.autograd.Function):
    """loss = -sum_t w_t * sg(min(rho_t, eps_high)) * A_t * logp_t, gradients computed during forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, gen_logp, coef_scale, eps_low, eps_high, chunk_size, group,
                vocab_start, reduce_grad_hidden, need_grad, stats):
        N, H = hidden.shape
        w32, upcast = _prep(hidden, weight)
        tgt = _ShardTargets(targets, vocab_start, weight.shape[0])
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        coef = torch.empty(N, dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty(N, H, dtype=torch.float32, device=hidden.device) if need_grad else None
        grad_w = torch.zeros(w32.shape, dtype=torch.float32, device=hidden.device) if need_grad else None
        buf = torch.empty(min(chunk_size, N), weight.shape[0], dtype=torch.float32, device=hidden.device)
        gen = gen_logp.float()
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            logits = torch.mm(h, w32.t(), out=buf[: sl.stop - s])
            t_logit, row_max, sum_exp = _chunk_softmax_stats(logits, tgt, sl, group)
            lp = t_logit - row_max - sum_exp.log()
            logp[sl] = lp
            # dJ/dlogp_t = w_t * A_t * sg(clamp(rho_t)); loss = -J (Eq. (cispo)).
            c = coef_scale[sl] * torch.exp(lp - gen[sl]).clamp(min=eps_low, max=eps_high)
            coef[sl] = c
            if need_grad:
                dl = _to_grad(logits, sum_exp, c, tgt, sl)  # dLoss/dlogits = c * (softmax - onehot)
                torch.mm(dl, w32, out=grad_h[sl])
                grad_w.addmm_(dl.t(), h)
        if need_grad and reduce_grad_hidden:
            _all_reduce(grad_h, group, _sum_op())
        stats["logp"] = logp
        ctx.grads = (grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return -(coef.double() * logp.double()).sum().float()

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.grads
        if grad_h is None:
            raise RuntimeError("cispo_from_hidden ran without grad enabled; cannot backpropagate")
        hd, wd = ctx.dtypes
        if grad_loss.device.type == "cpu" and float(grad_loss) == 1.0:
            gh, gw = grad_h, grad_w
        else:
            gh, gw = grad_h * grad_loss, grad_w * grad_loss
        return gh.to(hd), gw.to(wd), None, None, None, None, None, None, None, None, None, None, None


def cispo_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    eps_high: float = 5.0,
    eps_low: float | None = None,
    chunk_size: int | None = None,
    group=None,
    vocab_start: int = 0,
    reduce_grad_hidden: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO loss -J (Sec. 3.2 Eq. (cispo), J_ScaleRL) from hidden states, never forming [N, V] logits.

    hidden [N, H], weight [V(_local), H], targets [N]; per-token gen_logp [N], advantages [N] (the sample's
    advantage repeated over its tokens) and aggregation weights [N] (`losses.token_weights` of the global
    batch, flattened; 0 for untrained tokens). `eps_high` is the absolute cap on rho, `eps_low` an optional
    absolute floor (as in `losses.policy_loss`). Equals `policy_loss(..., loss_type="cispo")` on the same
    tokens and weights. Metrics as in `policy_loss` (over tokens with weight > 0).
    """
    _validate(hidden, weight, targets, vocab_start)
    N = hidden.shape[0]
    for name, t in (("gen_logp", gen_logp), ("advantages", advantages), ("weights", weights)):
        if t.shape != (N,):
            raise ValueError(f"{name} must be [N={N}], got shape {tuple(t.shape)} (shape mismatch)")
    if torch.isnan(gen_logp).any():
        raise ValueError("gen_logp contains NaN")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages contains NaN or inf")
    if not eps_high > 0:
        raise ValueError(f"eps_high={eps_high} must be > 0 (absolute cap of the CISPO ratio)")
    chunk_size = chunk_size or default_chunk_size(weight.shape[0])
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    coef_scale = (weights.float() * advantages.float()).detach()
    stats: dict[str, torch.Tensor] = {}
    loss = _FusedCispo.apply(hidden, weight, targets, gen_logp.detach(), coef_scale, eps_low, eps_high,
                             chunk_size, group, vocab_start, reduce_grad_hidden, need_grad, stats)
    with torch.no_grad():
        m = weights > 0
        lr = (stats["logp"] - gen_logp.float())[m]
        rho = lr.exp()
        clipped = rho > eps_high
        if eps_low is not None:
            clipped |= rho < eps_low
        metrics = {
            "loss": float(loss.detach()),
            "clip_fraction": float(clipped.float().mean()) if rho.numel() else 0.0,
            "rho_mean": float(rho.mean()) if rho.numel() else 1.0,
            "rho_max": float(rho.max()) if rho.numel() else 1.0,
            "approx_kl": float((rho - 1 - lr).mean()) if rho.numel() else 0.0,
            "num_tokens": float(m.sum()),
        }
    return loss, metrics
