"""FP32 LM-head log-probabilities without materialising [N, V] logits, and the fused CISPO loss.

Paper Sec. 3.2 "FP32 Precision for LLM logits": the trainer computes the LM head (and the softmax) in FP32.
Here logits are computed chunk by chunk over tokens (fp32 GEMM), so [N, V] logits never exist; the only
large buffers are one fp32 [V, chunk] logits buffer (64 MiB by default) and the fp32 grad_weight accumulator.

Per chunk: logits^T = W h^T into the buffer ([V, n] is the faster MKL layout on CPU), the per-token max m,
P = exp(logits - m) in place, s = sum P, lse = m + log s. Neither the normalised softmax nor the gradient
c * (softmax - onehot) is materialised: per-token scalings commute with the GEMMs, so with r = 1/s,
grad_h = (c r) . (P^T W) - c . W[target] and grad_W += P ((c r) . h) - onehot^T (c . h).

- `naive_logprob`: the reference (full [N, V] fp32 logits + log_softmax). Kept for tests and the bench.
- `chunked_logprob`: per-token log-probs with a custom backward (recomputes each chunk's logits: 4 GEMMs
  in total). Use it for any loss (DAPO, GRPO, GSPO) via `losses.policy_loss`.
- `cispo_from_hidden`: the CISPO loss of Sec. 3.2 Eq. (cispo) / J_ScaleRL straight from hidden states.
  Because the CISPO coefficient sg(min(rho, eps_high)) * A * w is detached, dL/dlogp_t is a constant -c_t
  known as soon as the token's logp is, so each chunk's gradient is pushed through the two gradient GEMMs
  right after its forward: 3 GEMMs in total, one pass; backward only returns the stored gradients.

Vocab parallel (TP): pass `group` (a torch.distributed process group) and the shard's `vocab_start`;
`weight` is then this rank's [V_local, H] rows. The log-sum-exp is combined across the group with an
all-reduce of the row max and of the rescaled sums of exponentials (the shard-local softmax is then
corrected by a per-token factor r, again folded into the GEMMs); the target logit comes from the owning shard
(all-reduce sum). grad_weight is the local shard's; grad_hidden is all-reduced over the group when
`reduce_grad_hidden=True` (set False if the caller's region op, e.g. Megatron's
copy_to_tensor_model_parallel_region, already reduces it in its backward).
"""

from __future__ import annotations

import torch

from scalerl_mega.objective.fused_checks import validate_head_inputs

DEFAULT_CHUNK_BYTES = 64 * 2**20
"""Budget of the fp32 [chunk, V] logits buffer used to pick the default chunk size."""


def default_chunk_size(vocab: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Largest power of two (16..8192) whose fp32 [chunk, vocab] buffer fits in `chunk_bytes`."""
    c = 16
    while c * 2 <= 8192 and c * 2 * vocab * 4 <= chunk_bytes:
        c *= 2
    return c


def naive_logprob(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Reference: log_softmax(h W^T)[target] with the full [N, V] fp32 logits (autograd does the rest)."""
    validate_head_inputs(hidden, weight, targets, 0)
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
    """Local row of each target in this vocab shard, and whether the shard owns it."""

    def __init__(self, targets: torch.Tensor, vocab_start: int, v_local: int):
        local = targets.long() - vocab_start
        self.owned = (local >= 0) & (local < v_local)
        self.index = torch.where(self.owned, local, torch.zeros_like(local))


def _chunk_forward(w32, h, tgt_index, owned, group, buf_flat, lse=None):
    """Logits of one token chunk, transposed ([V, n]: the faster GEMM layout on CPU), turned in place into
    P = exp(logits - max) (shard-local max). Returns (P, target logit [n], lse [n], r [n]) with the true
    softmax exp(logits - lse) = P * r. Given `lse` (backward), no collective is issued.
    """
    V, n = w32.shape[0], h.shape[0]
    P = buf_flat[: V * n].view(V, n)
    torch.mm(w32, h.t(), out=P)
    zero = torch.zeros((), dtype=P.dtype, device=P.device)
    t_logit = torch.where(owned, P.gather(0, tgt_index[None, :])[0], zero)
    row_max = P.amax(dim=0)
    P.sub_(row_max).exp_()
    if lse is not None:
        return P, t_logit, lse, torch.exp(row_max - lse)
    sum_exp = P.sum(dim=0)
    if group is None:
        return P, t_logit, row_max + sum_exp.log(), sum_exp.reciprocal()
    g_max = row_max.clone()
    _all_reduce(g_max, group, _max_op())
    g_sum = sum_exp * torch.exp(row_max - g_max)
    _all_reduce(g_sum, group, _sum_op())
    _all_reduce(t_logit, group, _sum_op())
    lse = g_max + g_sum.log()
    return P, t_logit, lse, torch.exp(row_max - lse)


def _chunk_entropy(P: torch.Tensor, r: torch.Tensor, *, lse: torch.Tensor | None = None,
                   pz: torch.Tensor | None = None) -> torch.Tensor:
    """This shard's part of the entropy -sum_v p_v log p_v of each token's softmax p = P * r (P [V, n]
    = exp(logits - shard max), r [n]); summed over the vocab shards it is the entropy.

    Given `pz` = sum_v P_v z_v (z the logits; the row-wise dot of P^T W with h, which the gradient GEMM
    computes anyway) and the global `lse`: -r (pz - lse sum_v P), one reduction over the buffer. Else
    -(r sum_v P log P + r log r sum_v P): an elementwise log pass (a temporary of the buffer's size)."""
    if pz is not None:
        return -r * (pz - lse * P.sum(dim=0))
    return -(r * torch.special.xlogy(P, P).sum(dim=0) + torch.special.xlogy(r, r) * P.sum(dim=0))


def _chunk_backward(P, r, coef, h, w32, tgt_index, owned, grad_h_rows, grad_w, *, first: bool,
                    pz_out: torch.Tensor | None = None) -> None:
    """Gradient of -sum_t coef_t * logp_t for one chunk: dlogits = coef * (softmax - onehot).

    Row scalings commute with the GEMMs, so the [V, n] buffer is never rescaled:
    grad_h = (coef*r) . (P^T W) - coef . W[target];  grad_W += P ((coef*r) . h) - onehot^T (coef . h).
    `first`: grad_w is uninitialised and is written (not accumulated) by this chunk. `pz_out` (needs
    grad_h_rows): receives sum_v P_v z_v = rowdot(P^T W, h) for `_chunk_entropy`.
    """
    cr = coef * r
    c_own = torch.where(owned, coef, torch.zeros_like(coef))
    if grad_h_rows is not None:
        torch.mm(P.t(), w32, out=grad_h_rows)
        if pz_out is not None:
            pz_out.copy_((grad_h_rows * h).sum(dim=1))
        grad_h_rows.mul_(cr[:, None]).sub_(c_own[:, None] * w32[tgt_index])
    if grad_w is not None:
        if first:
            torch.mm(P, cr[:, None] * h, out=grad_w)
        else:
            grad_w.addmm_(P, cr[:, None] * h)
        grad_w.index_add_(0, tgt_index, c_own[:, None] * h, alpha=-1.0)


def _prep(hidden: torch.Tensor, weight: torch.Tensor):
    w32 = weight if weight.dtype == torch.float32 else weight.float()
    return w32, hidden.dtype != torch.float32


def _buffer(chunk_size: int, N: int, w32: torch.Tensor) -> torch.Tensor:
    return torch.empty(min(chunk_size, N) * w32.shape[0], dtype=torch.float32, device=w32.device)


@torch.no_grad()
def logits_entropy(logits: torch.Tensor, *, group=None, chunk_size: int | None = None) -> torch.Tensor:
    """FP32 entropy [N] of softmax(logits) for logits [N, V(_local)] (vocab-parallel over `group`, as in
    this module), without grad, chunk by chunk over tokens (one fp32 [V, chunk] temporary)."""
    N, V = logits.shape
    out = torch.empty(N, dtype=torch.float32, device=logits.device)
    chunk_size = chunk_size or default_chunk_size(V)
    for s in range(0, N, chunk_size):
        sl = slice(s, min(s + chunk_size, N))
        P = logits[sl].to(torch.float32, copy=True).t()
        row_max = P.amax(dim=0)
        P.sub_(row_max).exp_()
        sum_exp = P.sum(dim=0)
        if group is None:
            r = sum_exp.reciprocal()
        else:
            g_max = _all_reduce(row_max.clone(), group, _max_op())
            g_sum = _all_reduce(sum_exp * torch.exp(row_max - g_max), group, _sum_op())
            r = torch.exp(row_max - g_max - g_sum.log())
        out[sl] = _chunk_entropy(P, r)
    return _all_reduce(out, group, _sum_op())


class _ChunkedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, group, vocab_start, reduce_grad_hidden):
        N = hidden.shape[0]
        w32, upcast = _prep(hidden, weight)
        tgt = _ShardTargets(targets, vocab_start, weight.shape[0])
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)
        buf = _buffer(chunk_size, N, w32)
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            _, t_logit, lse[sl], _ = _chunk_forward(w32, h, tgt.index[sl], tgt.owned[sl], group, buf)
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
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty(N, hidden.shape[1], dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.empty(w32.shape, dtype=torch.float32, device=hidden.device) if need_w else None
        buf = _buffer(chunk_size, N, w32)
        coef = -grad_logp.float()  # d(-coef * logp)/dlogp = grad_logp
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            P, _, _, r = _chunk_forward(w32, h, tgt.index[sl], tgt.owned[sl], group, buf, lse=lse[sl])
            _chunk_backward(P, r, coef[sl], h, w32, tgt.index[sl], tgt.owned[sl],
                            grad_h[sl] if need_h else None, grad_w, first=s == 0)
        if need_h and ctx.reduce:
            _all_reduce(grad_h, group, _sum_op())
        return (grad_h.to(hidden.dtype) if need_h else None, grad_w.to(weight.dtype) if need_w else None,
                None, None, None, None, None)


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
    validate_head_inputs(hidden, weight, targets, vocab_start)
    chunk_size = chunk_size or default_chunk_size(weight.shape[0])
    return _ChunkedLogProb.apply(hidden, weight, targets, chunk_size, group, vocab_start, reduce_grad_hidden)


class _FusedCispo(torch.autograd.Function):
    """loss = -sum_t w_t * sg(min(rho_t, eps_high)) * A_t * logp_t, gradients computed during forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, gen_logp, coef_scale, eps_low, eps_high, chunk_size, group,
                vocab_start, reduce_grad_hidden, need_grad, stats, with_entropy):
        N, H = hidden.shape
        w32, upcast = _prep(hidden, weight)
        tgt = _ShardTargets(targets, vocab_start, weight.shape[0])
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        coef = torch.empty(N, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(N, dtype=torch.float32, device=hidden.device) if with_entropy else None
        need_h = need_grad and hidden.requires_grad
        need_w = need_grad and weight.requires_grad
        grad_h = torch.empty(N, H, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.empty(w32.shape, dtype=torch.float32, device=hidden.device) if need_w else None
        buf = _buffer(chunk_size, N, w32)
        gen = gen_logp.float()
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            h = hidden[sl].float() if upcast else hidden[sl]
            P, t_logit, lse, r = _chunk_forward(w32, h, tgt.index[sl], tgt.owned[sl], group, buf)
            lp = t_logit - lse
            logp[sl] = lp
            # dJ/dlogp_t = w_t * A_t * sg(clamp(rho_t)) =: c_t; loss = -J (Eq. (cispo)).
            c = coef_scale[sl] * torch.exp(lp - gen[sl]).clamp(min=eps_low, max=eps_high)
            coef[sl] = c
            pz = torch.empty_like(lp) if ent is not None and need_h else None
            if need_h or need_w:
                _chunk_backward(P, r, c, h, w32, tgt.index[sl], tgt.owned[sl],
                                grad_h[sl] if need_h else None, grad_w, first=s == 0, pz_out=pz)
            if ent is not None:
                ent[sl] = _chunk_entropy(P, r, lse=lse, pz=pz)
        if need_h and reduce_grad_hidden:
            _all_reduce(grad_h, group, _sum_op())
        stats["logp"] = logp
        if ent is not None:
            stats["entropy"] = _all_reduce(ent, group, _sum_op())
        ctx.grads = (grad_h, grad_w)
        ctx.need_grad = need_grad
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return -(coef.double() * logp.double()).sum().float()

    @staticmethod
    def backward(ctx, grad_loss):
        if not ctx.need_grad:
            raise RuntimeError("cispo_from_hidden ran without grad enabled; cannot backpropagate")
        if ctx.grads is None:
            raise RuntimeError("cispo_from_hidden supports a single backward (its gradients are handed over)")
        # Hand the stored gradients over (drop our reference) so that AccumulateGrad can steal them
        # instead of copying a [V, H] fp32 tensor.
        grads, ctx.grads = ctx.grads, None
        hd, wd = ctx.dtypes
        out = []
        for g, dt in zip(grads, (hd, wd)):
            if g is None:
                out.append(None)
            elif grad_loss.device.type == "cpu" and float(grad_loss) == 1.0:
                out.append(g.to(dt))
            else:
                out.append((g * grad_loss).to(dt))
        del grads, g
        return (*out, None, None, None, None, None, None, None, None, None, None, None, None)


BACKENDS = ("auto", "torch", "triton")


def _resolve_backend(backend: str, hidden: torch.Tensor, group) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; expected one of {BACKENDS}")
    if backend == "triton" and group is not None:
        raise ValueError("backend='triton' has no vocab-parallel variant: pass group=None or backend='torch'")
    if backend != "auto":
        return backend
    if hidden.is_cuda and group is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    return "torch"


def _check_cispo_inputs(gen_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor, *, n: int,
                        eps_high: float) -> None:
    """`cispo_from_hidden`'s per-token inputs are [N] (gen_logp without NaN, finite advantages), eps_high > 0."""
    for name, t in (("gen_logp", gen_logp), ("advantages", advantages), ("weights", weights)):
        if t.shape != (n,):
            raise ValueError(f"{name} must be [N={n}], got shape {tuple(t.shape)} (shape mismatch)")
    if torch.isnan(gen_logp).any():
        raise ValueError("gen_logp contains NaN")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages contains NaN or inf")
    if not eps_high > 0:
        raise ValueError(f"eps_high={eps_high} must be > 0 (absolute cap of the CISPO ratio)")


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
    backend: str = "auto",
    sums: bool = False,
    with_entropy: bool = True,
    return_logp: bool = False,
):
    """CISPO loss -J (Sec. 3.2 Eq. (cispo), J_ScaleRL) from hidden states, never forming [N, V] logits.

    hidden [N, H], weight [V(_local), H], targets [N]; per-token gen_logp [N], advantages [N] (the sample's
    advantage repeated over its tokens) and aggregation weights [N] (`losses.token_weights` of the global
    batch, flattened; 0 for untrained tokens). `eps_high` is the absolute cap on rho, `eps_low` an optional
    absolute floor (as in `losses.policy_loss`). Equals `policy_loss(..., loss_type="cispo")` on the same
    tokens and weights. Metrics as in `policy_loss` (over tokens with weight > 0), including `entropy` when
    `with_entropy` (computed in the same pass: from the softmax buffer of each chunk on torch, from
    the kernel's online sums on Triton); `sums=True` returns them as `losses.diagnostic_sums` shares
    (`policy_loss(..., sums=True)`). `return_logp=True`: returns (loss, metrics, logp [N]) with the
    per-token fp32 log-probs of the pass (detached), so callers need no second head pass.

    `backend`: "torch" (chunked, this module), "triton" (`objective.triton`, no vocab parallelism), or
    "auto": Triton when the tensors are on a CUDA device, triton imports and `group` is None, else torch.
    """
    validate_head_inputs(hidden, weight, targets, vocab_start)
    _check_cispo_inputs(gen_logp, advantages, weights, n=hidden.shape[0], eps_high=eps_high)
    backend = _resolve_backend(backend, hidden, group)
    chunk_size = chunk_size or default_chunk_size(weight.shape[0])
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    coef_scale = (weights.float() * advantages.float()).detach()
    stats: dict[str, torch.Tensor] = {}
    if backend == "triton":
        loss = _cispo_triton(hidden, weight, targets, gen_logp, coef_scale, stats, eps_low=eps_low, eps_high=eps_high,
                             with_entropy=with_entropy)
    else:
        loss = _FusedCispo.apply(hidden, weight, targets, gen_logp.detach(), coef_scale, eps_low, eps_high,
                                 chunk_size, group, vocab_start, reduce_grad_hidden, need_grad, stats,
                                 with_entropy)
    metrics = _cispo_metrics(loss, stats, gen_logp, weights, eps_low=eps_low, eps_high=eps_high, sums=sums)
    if return_logp:
        return loss, metrics, stats["logp"].detach()
    return loss, metrics


def _cispo_triton(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, gen_logp: torch.Tensor,
                  coef_scale: torch.Tensor, stats: dict[str, torch.Tensor], *, eps_low: float | None,
                  eps_high: float, with_entropy: bool) -> torch.Tensor:
    """The Triton backend of `cispo_from_hidden`: the kernel's log-probs (autograd through the kernel) times
    the detached CISPO coefficient; fills stats["logp"] (and stats["entropy"] when `with_entropy`)."""
    from scalerl_mega.objective.triton.fused_logprob import triton_logprob

    if with_entropy:
        logp, stats["entropy"] = triton_logprob(hidden, weight, targets, with_entropy=True)
    else:
        logp = triton_logprob(hidden, weight, targets)
    coef = coef_scale * torch.exp(logp.detach() - gen_logp.float()).clamp(min=eps_low, max=eps_high)
    loss = -(coef * logp).sum()
    stats["logp"] = logp.detach()
    return loss


def _cispo_metrics(loss: torch.Tensor, stats: dict[str, torch.Tensor], gen_logp: torch.Tensor,
                   weights: torch.Tensor, *, eps_low: float | None, eps_high: float, sums: bool) -> dict:
    """`cispo_from_hidden`'s metrics over tokens with weight > 0 (as `policy_loss`'s; `sums=True`: the
    `losses.diagnostic_sums` shares)."""
    from scalerl_mega.objective.losses import diagnostic_means, diagnostic_sums

    with torch.no_grad():
        m = weights > 0
        lr = (stats["logp"] - gen_logp.float())[m]
        rho = lr.exp()
        clipped = rho > eps_high
        if eps_low is not None:
            clipped |= rho < eps_low
        diag = diagnostic_sums(lr, clipped, entropy_t=stats["entropy"][m] if "entropy" in stats else None)
        if sums:
            return {"loss": loss.detach(), **diag}
        return {"loss": float(loss.detach()), **diagnostic_means(diag), "num_tokens": float(m.sum())}
