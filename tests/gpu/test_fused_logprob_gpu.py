"""The Triton fused FP32 LM-head kernel on a GPU against a float64 reference (skipped without CUDA).

Shape N=4096, H=4096, V=131072 (the Llama vocabulary: 64-bit offsets; a second, smaller V re-ran every case's
autotuning for no new path). Inputs: bf16 hidden and weight (bf16 operands); FP32 hidden and weight in
bf16x3 (the default on CUDA: `test_default_fp32_mode_on_cuda_is_bf16x3`, so not run twice), 3xTF32 and IEEE
mode; FP32 hidden states holding bf16 values with an FP32 weight, the trainer's FP32 head
(Float16Module upcasts the last stage's bf16 output, so the head sees bf16-valued FP32 hidden states and an
FP32 weight), in the default mode (bf16x3 with the hidden states detected as one bf16 piece: 3 exact
products); bf16 hidden with an FP32 weight in bf16x3, IEEE and 3xTF32 mode. The loss is CISPO (Eq. (cispo))
through `triton_cispo_from_hidden`; the reference is formed in float64 from the same (rounded) inputs, by hand
(no autograd graph, to keep the [N, V] float64 buffer to one: 4 GiB at 128k).

Tolerances, and why:
- logp (max abs error) <= 1e-4: logits are FP32 accumulations of exact products (bf16 x bf16, bf16 pieces, or
  FP32 x FP32 in IEEE mode), about 1e-6 here; 3xTF32 drops only the lo*lo term (relative 2^-22 per product)
  and bf16x3 with general FP32 hidden states the pieces of significance >= 3 (2^-24), held to the same bound,
  as is the default mode. Plain TF32 dots would give about 1e-3 (inputs rounded to 10-bit mantissas, logits
  of std 2 summed over 4096 terms), as would bf16-rounded FP32 inputs, so this bound catches both.
- loss (relative) <= 1e-4.
- each gradient, ||got - ref|| / ||ref||: <= 2e-5 when it is FP32 (dlogits FP32 or three exact bf16 pieces,
  FP32-accurate GEMMs), <= 8e-3 when it is bf16 (returned in bf16; with bf16 operands dlogits is rounded to
  bf16 before the GEMMs too: about 2^-9 relative per element; METHOD: bf16 operands land between 1e-3 and 1e-2).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 131072)]
EPS_HIGH = 1.2
TOL_LOGP = TOL_LOSS = 1e-4
TOL_GRAD = {"float32": 2e-5, "bfloat16": 8e-3}
CASES = [  # (hidden, weight dtype, fp32_precision; None = the default, bf16x3 on CUDA). Hidden "float32_bf16":
    # FP32 holding bf16 values (the trainer's head input)
    ("bfloat16", "bfloat16", "ieee"),
    ("float32_bf16", "float32", None),
    ("float32", "float32", "bf16x3"),
    ("float32", "float32", "ieee"),
    ("float32", "float32", "tf32x3"),
    ("bfloat16", "float32", "bf16x3"),
    ("bfloat16", "float32", "ieee"),
    ("bfloat16", "float32", "tf32x3"),
]


def _inputs(N: int, H: int, V: int, dtype, seed: int = 0, *, w_dtype=None):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(N, H, generator=g, device="cuda")
    h = h.bfloat16().float() if dtype == "float32_bf16" else h.to(dtype)
    w_dtype = w_dtype or (torch.float32 if dtype == "float32_bf16" else dtype)
    W = (torch.randn(V, H, generator=g, device="cuda") * (2.0 / H**0.5)).to(w_dtype)  # logits std ~2
    y = torch.randint(0, V, (N,), generator=g, device="cuda")
    noise = torch.randn(N, generator=g, device="cuda")
    A = torch.randn(N, generator=g, device="cuda")
    w = torch.full((N,), 1.0 / N, device="cuda")
    return h, W, y, noise, A, w


def _reference(h, W, y, noise, A, w):
    """float64 (logp, gen_logp, loss, grad_h, grad_W) of the CISPO loss -sum w*sg(min(rho, eps))*A*logp."""
    import torch

    h64, W64 = h.double(), W.double()
    logits = h64 @ W64.t()
    lse = torch.logsumexp(logits, dim=1)
    logp = logits.gather(1, y[:, None])[:, 0] - lse
    gen = logp + 0.3 * noise.double()  # rho = exp(-0.3 noise): part of the tokens above eps_high
    coef = w.double() * A.double() * torch.exp(logp - gen).clamp(max=EPS_HIGH)
    loss = -(coef * logp).sum()
    # dloss/dlogits = -coef * (onehot - softmax) = coef * softmax - coef * onehot, in place
    d = logits.sub_(lse[:, None]).exp_().mul_(coef[:, None])
    d[torch.arange(len(y), device=y.device), y] -= coef
    return logp, gen, loss, d @ W64, d.t() @ h64


def _rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.fixture(autouse=True)
def _ieee_torch_matmul():
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # the FP32 backward GEMMs follow torch's setting
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("h_dtype,w_dtype,fp32_precision", CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N{}_H{}_V{}".format(*s))
def test_fused_kernel_matches_float64(shape, h_dtype, w_dtype, fp32_precision):
    import torch

    from scalerl_mega.objective.triton.fused_logprob import triton_cispo_from_hidden, triton_logprob

    h, W, y, noise, A, w = _inputs(*shape, h_dtype if h_dtype == "float32_bf16" else getattr(torch, h_dtype),
                                   w_dtype=getattr(torch, w_dtype))
    logp64, gen, loss64, gh64, gW64 = _reference(h, W, y, noise, A, w)
    h.requires_grad_(True)
    W.requires_grad_(True)
    loss = triton_cispo_from_hidden(h, W, y, gen.float(), A, w, eps_high=EPS_HIGH, fp32_precision=fp32_precision)
    loss.backward()
    with torch.no_grad():
        logp = triton_logprob(h.detach(), W.detach(), y, fp32_precision=fp32_precision)
    errs = dict(logp=float((logp.double() - logp64).abs().max()),
                loss=abs(float(loss) - float(loss64)) / abs(float(loss64)),
                grad_h=_rel(h.grad, gh64), grad_W=_rel(W.grad, gW64))
    print(f"\n{shape} h {h_dtype} W {w_dtype} {fp32_precision}: {errs}")
    h_type = h_dtype.split("_")[0]
    assert str(h.grad.dtype) == f"torch.{h_type}" and str(W.grad.dtype) == f"torch.{w_dtype}"
    assert errs["logp"] <= TOL_LOGP, errs
    assert errs["loss"] <= TOL_LOSS, errs
    assert errs["grad_h"] <= TOL_GRAD[h_type], errs
    assert errs["grad_W"] <= TOL_GRAD[w_dtype], errs


@pytest.mark.parametrize("h_dtype,w_dtype", [("bfloat16", "bfloat16"), ("float32_bf16", "float32")])
def test_fused_kernel_is_deterministic(h_dtype, w_dtype):
    """Two forward+backward calls on the same inputs give bit-identical logp and gradients (no atomics;
    the autotuned configuration is cached after the first call). 4 backward chunks: chunked dW accumulation
    (bf16); the default bf16x3 path of the trainer's head (vocabulary chunks, cuBLAS bf16 GEMMs)."""
    import torch

    from scalerl_mega.objective.triton.fused_logprob import triton_logprob

    h0, W0, y, noise, _, _ = _inputs(4096, 4096, 32768, h_dtype if h_dtype == "float32_bf16" else torch.bfloat16,
                                     seed=1, w_dtype=getattr(torch, w_dtype))
    outs = []
    for _ in range(3):  # call 1 may autotune; calls 2 and 3 are compared (and 1 too, if no retuning happened)
        h, W = h0.clone().requires_grad_(True), W0.clone().requires_grad_(True)
        lp = triton_logprob(h, W, y, bwd_chunk_rows=1024)
        (lp * noise).sum().backward()
        torch.cuda.synchronize()
        outs.append((lp.detach(), h.grad, W.grad))
    for a, b in zip(outs[1], outs[2]):
        assert torch.equal(a, b)


def test_cispo_backends_agree_on_gpu():
    """`cispo_from_hidden`: backend="auto" picks Triton on CUDA; it agrees with the chunked torch path."""
    import torch

    from scalerl_mega.objective.fused_logprob import cispo_from_hidden

    N, H, V = 2048, 1024, 32768
    h0, W0, y, noise, A, w = _inputs(N, H, V, torch.bfloat16, seed=2)
    with torch.no_grad():
        from scalerl_mega.objective.fused_logprob import naive_logprob

        gen = naive_logprob(h0, W0, y) + 0.3 * noise
    res = {}
    for backend in ("auto", "torch"):
        h, W = h0.clone().requires_grad_(True), W0.clone().requires_grad_(True)
        loss, metrics = cispo_from_hidden(h, W, y, gen, A, w, eps_high=EPS_HIGH, backend=backend)
        loss.backward()
        res[backend] = (loss.detach().double(), h.grad.double(), W.grad.double(), metrics["clip_fraction"])
        res[backend + "_entropy"] = metrics["entropy"]
    (la, gha, gwa, ca), (lt, ght, gwt, ct) = res["auto"], res["torch"]
    assert res["auto_entropy"] == pytest.approx(res["torch_entropy"], rel=1e-4)  # the kernel's online entropy
    assert abs(float(la - lt)) <= 1e-4 * abs(float(lt))
    assert float((gha - ght).norm() / ght.norm()) <= 8e-3
    assert float((gwa - gwt).norm() / gwt.norm()) <= 8e-3
    assert 0 < ct < 1 and abs(ca - ct) <= 2.0 / N


def test_default_fp32_mode_on_cuda_is_bf16x3():
    """The FP32 head's default on a GPU is the bf16x3 mode: bit-identical to asking for it, not tf32x3's result;
    bf16-valued hidden states are detected (one piece) and give the same logp as their bf16 copy in bf16x3."""
    import torch

    from scalerl_mega.objective.triton.fused_logprob import resolve_fp32_precision, triton_logprob

    h, W, y, *_ = _inputs(2048, 4096, 32768, torch.float32, seed=3)
    assert resolve_fp32_precision(None, h) == "bf16x3"
    blocks = dict(block_n=64, block_v=64, block_h=32)  # one configuration for all calls
    default = triton_logprob(h, W, y, **blocks)
    assert torch.equal(default, triton_logprob(h, W, y, fp32_precision="bf16x3", **blocks))
    assert not torch.equal(default, triton_logprob(h, W, y, fp32_precision="tf32x3", **blocks))
    hb = h.bfloat16()
    assert torch.equal(triton_logprob(hb.float(), W, y, **blocks), triton_logprob(hb, W, y, fp32_precision="bf16x3",
                                                                                   **blocks))
