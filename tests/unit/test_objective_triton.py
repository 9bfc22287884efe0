"""The Triton fused log-prob kernel under TRITON_INTERPRET=1 on tiny shapes vs the torch reference.

Runs in a subprocess so that TRITON_INTERPRET is set before triton is imported (and no other test's
triton import is affected). The interpreter is ~1000x slower than torch: shapes stay tiny.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r"""
    import json, torch
    from scalerl_mega.objective.fused_logprob import naive_logprob
    from scalerl_mega.objective.triton.fused_logprob import triton_logprob, triton_cispo_from_hidden

    def rel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max())

    out = {}
    g = torch.Generator().manual_seed(0)
    N, H, V = 37, 40, 200   # none a multiple of the blocks: exercises masking
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(N, H, generator=g).to(dtype)
        W = (torch.randn(V, H, generator=g) * 0.3).to(dtype)
        y = torch.randint(0, V, (N,), generator=g)
        up = torch.randn(N, generator=g)
        h1, W1 = h.float().clone().requires_grad_(True), W.float().clone().requires_grad_(True)
        ref = naive_logprob(h1, W1, y)
        (ref * up).sum().backward()
        h2, W2 = h.detach().clone().requires_grad_(True), W.detach().clone().requires_grad_(True)
        lp = triton_logprob(h2, W2, y, block_n=16, block_v=64, block_h=16)
        (lp * up).sum().backward()
        out[str(dtype)] = dict(logp=rel(lp, ref), gh=rel(h2.grad.float(), h1.grad), gw=rel(W2.grad.float(), W1.grad),
                               gdtype=str(h2.grad.dtype))
    # CISPO through the kernel vs the torch reference formula
    h = torch.randn(N, H, generator=g); W = torch.randn(V, H, generator=g) * 0.3
    y = torch.randint(0, V, (N,), generator=g)
    gen = naive_logprob(h, W, y) + 0.3 * torch.randn(N, generator=g)
    A = torch.randn(N, generator=g); w = torch.full((N,), 1.0 / N)
    h1, W1 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    lp = naive_logprob(h1, W1, y)
    ref = -(w * torch.exp(lp - gen).clamp(max=1.2).detach() * A * lp).sum(); ref.backward()
    h2, W2 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    loss = triton_cispo_from_hidden(h2, W2, y, gen, A, w, eps_high=1.2, block_n=16, block_v=64, block_h=16)
    loss.backward()
    from scalerl_mega.objective.fused_logprob import cispo_from_hidden
    h3, W3 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    loss3, met = cispo_from_hidden(h3, W3, y, gen, A, w, eps_high=1.2, backend="triton")
    loss3.backward()
    out["backend"] = dict(loss=abs(float(loss3.detach()) - float(ref.detach())) / abs(float(ref.detach())),
                          gh=rel(h3.grad, h1.grad), gw=rel(W3.grad, W1.grad), clip=met["clip_fraction"])
    out["cispo"] = dict(loss=abs(float(loss.detach()) - float(ref.detach())) / abs(float(ref.detach())), gh=rel(h2.grad, h1.grad),
                        gw=rel(W2.grad, W1.grad))
    print(json.dumps(out))
""")


def test_triton_kernel_under_interpreter_matches_torch():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for k in ("logp", "gh", "gw"):
        assert res["torch.float32"][k] < 1e-5, (k, res)
        # bf16 inputs: logits are exact fp32 products of the bf16 values; only the returned grads are
        # rounded to bf16 (relative 2^-8).
        tol = 1e-5 if k == "logp" else 8e-3
        assert res["torch.bfloat16"][k] < tol, (k, res)
    assert res["torch.bfloat16"]["gdtype"] == "torch.bfloat16"
    for k in ("loss", "gh", "gw"):
        assert res["cispo"][k] < 1e-5, (k, res)
        assert res["backend"][k] < 1e-5, (k, res)  # cispo_from_hidden(backend="triton")
    assert 0 < res["backend"]["clip"] < 1
