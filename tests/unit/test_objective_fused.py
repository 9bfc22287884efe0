"""Chunked FP32 log-probs and the fused CISPO path against a naive full-logits reference.

The reference CISPO below is written from Sec. 3.2 Eq. (cispo): -sum_t w_t * sg(min(rho_t, eps)) * A_t * logp_t
with logp from materialised fp32 logits (torch.log_softmax), gradients by autograd.
"""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.objective.fused_logprob import (
    chunked_logprob, cispo_from_hidden, default_chunk_size, naive_logprob)
from scalerl_mega.objective.losses import policy_loss, token_weights


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def problem(seed=0, N=70, H=24, V=333, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g).to(dtype)
    W = (torch.randn(V, H, generator=g) * 0.4).to(dtype)
    y = torch.randint(0, V, (N,), generator=g)
    return h, W, y, g


def reference_cispo(h, W, y, gen, A, w, eps_high, eps_low=None):
    logits = h.double() @ W.double().t()  # float64 reference
    lp = torch.log_softmax(logits, -1).gather(1, y[:, None])[:, 0]
    rho = torch.exp(lp - gen.double()).detach()
    trunc = rho.clamp(max=eps_high) if eps_low is None else rho.clamp(min=eps_low, max=eps_high)
    return -(w.double() * trunc * A.double() * lp).sum()


@pytest.mark.parametrize("chunk", [7, 16, 64, 1000])
def test_chunked_logprob_matches_naive(chunk):
    h, W, y, g = problem()
    up = torch.randn(h.shape[0], generator=g)
    h1, W1 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    (naive_logprob(h1, W1, y) * up).sum().backward()
    ref = naive_logprob(h, W, y)
    h2, W2 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    lp = chunked_logprob(h2, W2, y, chunk_size=chunk)
    (lp * up).sum().backward()
    assert rel_err(lp, ref) < 1e-5
    assert rel_err(h2.grad, h1.grad) < 1e-5
    assert rel_err(W2.grad, W1.grad) < 1e-5


@pytest.mark.parametrize("chunk,eps_low", [(9, None), (32, None), (512, 0.5)])
def test_cispo_from_hidden_matches_float64_reference(chunk, eps_low):
    h, W, y, g = problem(seed=1)
    N = h.shape[0]
    gen = naive_logprob(h, W, y).detach() + 0.4 * torch.randn(N, generator=g)
    A = torch.randn(N, generator=g)
    w = torch.rand(N, generator=g) * (torch.rand(N, generator=g) > 0.2)  # some untrained tokens
    h64, W64 = h.double().requires_grad_(True), W.double().requires_grad_(True)
    ref = reference_cispo(h64, W64, y, gen, A, w, 1.3, eps_low)
    ref.backward()
    h2, W2 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    loss, met = cispo_from_hidden(h2, W2, y, gen, A, w, eps_high=1.3, eps_low=eps_low, chunk_size=chunk)
    loss.backward()
    assert abs(loss.item() - ref.item()) / abs(ref.item()) < 1e-5
    assert rel_err(h2.grad, h64.grad) < 1e-5
    assert rel_err(W2.grad, W64.grad) < 1e-5
    rho = torch.exp(naive_logprob(h, W, y) - gen)[w > 0]
    assert 0 < met["clip_fraction"] < 1
    assert met["rho_max"] == pytest.approx(float(rho.max()), rel=1e-5)


def test_fused_equals_policy_loss_on_batch_layout_with_prompt_aggregation():
    h, W, y, g = problem(seed=2, N=4 * 9)
    B, T = 4, 9
    lengths = torch.tensor([9, 3, 5, 7])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    pidx = torch.tensor([0, 0, 1, 1])
    gen = naive_logprob(h, W, y).detach().view(B, T) + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    wts = token_weights(mask, pidx, "prompt")
    hA, WA = h.double().requires_grad_(True), W.double().requires_grad_(True)  # float64 reference
    lpA = torch.log_softmax(hA @ WA.t(), -1).gather(1, y[:, None])[:, 0]
    ref, ref_met = policy_loss(lpA.view(B, T), gen.double(), adv.double(), mask, pidx, loss_type="cispo",
                               aggregation="prompt", eps_high=1.25)
    ref.backward()
    hB, WB = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    loss, met = cispo_from_hidden(hB, WB, y, gen.flatten(), adv.repeat_interleave(T), wts.flatten(),
                                  eps_high=1.25, chunk_size=8)
    loss.backward()
    assert abs(loss.item() - ref.item()) < 1e-5 * abs(ref.item())
    assert rel_err(hB.grad, hA.grad) < 1e-5 and rel_err(WB.grad, WA.grad) < 1e-5
    for k in ("clip_fraction", "rho_mean", "rho_max", "approx_kl", "num_tokens"):
        assert met[k] == pytest.approx(ref_met[k], rel=1e-4, abs=1e-6), k


def test_bf16_inputs_use_fp32_logits_and_return_input_dtype_grads():
    h, W, y, g = problem(seed=3, dtype=torch.bfloat16)
    gen = naive_logprob(h, W, y).detach() + 0.2 * torch.randn(h.shape[0], generator=g)
    A, w = torch.randn(h.shape[0], generator=g), torch.full((h.shape[0],), 0.01)
    h64, W64 = h.double().requires_grad_(True), W.double().requires_grad_(True)
    ref = reference_cispo(h64, W64, y, gen, A, w, 2.0)
    ref.backward()
    h2, W2 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    loss, _ = cispo_from_hidden(h2, W2, y, gen, A, w, eps_high=2.0, chunk_size=16)
    loss.backward()
    assert h2.grad.dtype == torch.bfloat16 and W2.grad.dtype == torch.bfloat16
    assert abs(loss.item() - ref.item()) / abs(ref.item()) < 1e-5  # logits exact in fp32 from bf16 inputs
    assert rel_err(h2.grad.double(), h64.grad) < 1e-2  # bf16 rounding of the returned gradient


def test_grad_output_scaling_and_no_grad_forward():
    h, W, y, g = problem(seed=4)
    gen = naive_logprob(h, W, y).detach()
    A, w = torch.randn(h.shape[0], generator=g), torch.full((h.shape[0],), 0.02)
    h1 = h.clone().requires_grad_(True)
    loss, _ = cispo_from_hidden(h1, W, y, gen, A, w, chunk_size=16)
    loss.backward()
    h2 = h.clone().requires_grad_(True)
    loss2, _ = cispo_from_hidden(h2, W, y, gen, A, w, chunk_size=16)
    (3.0 * loss2).backward()
    torch.testing.assert_close(h2.grad, 3.0 * h1.grad)
    with torch.no_grad():
        l3, _ = cispo_from_hidden(h, W, y, gen, A, w)
    assert l3.item() == pytest.approx(loss.item(), rel=1e-6)


def test_default_chunk_size_is_bounded():
    assert default_chunk_size(65536) == 256
    assert default_chunk_size(32768) == 512
    assert default_chunk_size(10) == 8192


def test_bad_inputs():
    h, W, y, _ = problem()
    N = h.shape[0]
    z = torch.zeros(N)
    with pytest.raises(ValueError, match="weight"):
        cispo_from_hidden(h, W[:, :-1], y, z, z, z)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprob(h, W, y[:-1])
    with pytest.raises(ValueError, match="empty batch"):
        chunked_logprob(h[:0], W, y[:0])
    with pytest.raises(ValueError, match="advantages"):
        cispo_from_hidden(h, W, y, z, z[:-1], z)
    bad = z.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="gen_logp contains NaN"):
        cispo_from_hidden(h, W, y, bad, z, z)


def test_weight_only_gradient_and_single_backward():
    h, W, y, g = problem(seed=5)
    gen = naive_logprob(h, W, y).detach() + 0.1
    A, w = torch.randn(h.shape[0], generator=g), torch.full((h.shape[0],), 0.02)
    W64 = W.double().requires_grad_(True)
    reference_cispo(h.double(), W64, y, gen, A, w, 5.0).backward()
    W1 = W.clone().requires_grad_(True)
    loss, _ = cispo_from_hidden(h, W1, y, gen, A, w, chunk_size=16)  # hidden needs no gradient
    loss.backward(retain_graph=True)
    assert rel_err(W1.grad, W64.grad) < 1e-5
    with pytest.raises(RuntimeError, match="single backward"):
        loss.backward()
