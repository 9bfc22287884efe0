"""float64 reference of the benchmarked CISPO head loss, and the errors of a measured variant against it
(bench/fused_cispo.py --error). Rows are processed in chunks, so the only [rows, V] float64 buffer is one
chunk's (`chunk_bytes`); W, grad_W and h are held in float64 once (at N=16384, H=4096, V=131072: ~9 GiB)."""

from __future__ import annotations


def cispo_float64(h, W, y, gen, coef_scale, *, eps_high: float, chunk_bytes: int = 2**30):
    """(logp [N], loss, grad_h [N, H], grad_W [V, H]) in float64 of -sum_t c_t logp_t with
    c_t = coef_scale_t * min(exp(logp_t - gen_t), eps_high) held constant (Eq. (cispo))."""
    import torch

    N, V = h.shape[0], W.shape[0]
    W64 = W.detach().double()
    grad_h = torch.empty(N, W.shape[1], dtype=torch.float64, device=h.device)
    grad_w = torch.zeros_like(W64)
    logp = torch.empty(N, dtype=torch.float64, device=h.device)
    loss = torch.zeros((), dtype=torch.float64, device=h.device)
    rows = max(1, chunk_bytes // (8 * V))
    for r0 in range(0, N, rows):
        r1 = min(r0 + rows, N)
        h64 = h[r0:r1].detach().double()
        z = h64 @ W64.t()
        lse = torch.logsumexp(z, dim=1)
        lp = z.gather(1, y[r0:r1, None])[:, 0] - lse
        coef = coef_scale[r0:r1].double() * torch.exp(lp - gen[r0:r1].double()).clamp(max=eps_high)
        logp[r0:r1] = lp
        loss -= (coef * lp).sum()
        d = z.sub_(lse[:, None]).exp_().mul_(coef[:, None])  # dloss/dz = coef * (softmax - onehot), in place
        d[torch.arange(r1 - r0, device=d.device), y[r0:r1]] -= coef
        grad_h[r0:r1] = d @ W64
        grad_w.addmm_(d.t(), h64)
    return logp, loss, grad_h, grad_w


def errors(h, W, y, gen, coef_scale, *, eps_high: float, loss, logp=None) -> dict[str, float]:
    """A variant's errors against `cispo_float64`: loss (relative), logp (max abs, when given), grad_h and
    grad_W (||got - ref|| / ||ref||, from h.grad and W.grad): the GPU suite's measures."""
    import torch

    ref_logp, ref_loss, ref_gh, ref_gw = cispo_float64(h, W, y, gen, coef_scale, eps_high=eps_high)

    def rel(got, ref):
        return float((got.double() - ref).norm() / ref.norm())

    out = {"err_loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
           "err_grad_h_rel": rel(h.grad, ref_gh), "err_grad_w_rel": rel(W.grad, ref_gw)}
    if logp is not None:
        out["err_logp_abs"] = float((logp.detach().double() - ref_logp).abs().max())
    del ref_gh, ref_gw
    if h.is_cuda:
        torch.cuda.empty_cache()
    return out
