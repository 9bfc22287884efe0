"""The Triton fused log-prob kernel under TRITON_INTERPRET=1 on tiny shapes vs the torch reference.

Runs in subprocesses so that TRITON_INTERPRET is set before triton is imported (and no other test's
triton import is affected). The interpreter is ~1000x slower than torch: shapes stay tiny.

What the interpreter can and cannot show: it runs programs one after another in numpy, so races, register
pressure, TF32 rounding and speed are invisible here (tests/gpu covers those on hardware). It does emulate
int32 wrap-around and it does see the `input_precision` each tl.dot asks for, which is what the index and
precision tests below check.
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
        # 3 vocabulary splits (merged on the host) and 16-row backward chunks (3 chunks): the split/chunk paths
        lp = triton_logprob(h2, W2, y, block_n=16, block_v=64, block_h=16, v_splits=3, bwd_chunk_rows=16)
        (lp * up).sum().backward()
        out[str(dtype)] = dict(logp=rel(lp, ref), gh=rel(h2.grad.float(), h1.grad), gw=rel(W2.grad.float(), W1.grad),
                               gdtype=str(h2.grad.dtype))
        # entropy of each token's softmax vs float64, over 3 splits and over 6 (two of them hold no vocabulary:
        # V = 200 is 4 blocks of 64), with logits shifted by +40 (a centring error shows as cancellation)
        z64 = h.double() @ W.double().t()
        ent_ref = -(z64.softmax(-1) * z64.log_softmax(-1)).sum(-1)
        for splits in (3, 6):
            lp_e, ent = triton_logprob(h, W, y, block_n=16, block_v=64, block_h=16, v_splits=splits,
                                       with_entropy=True)
            out[str(dtype)][f"ent{splits}"] = float((ent.double() - ent_ref).abs().max())
            out[str(dtype)][f"ent{splits}_logp"] = bool(torch.equal(lp_e, lp.detach()) or splits != 3)
            out[str(dtype)][f"ent{splits}_grad"] = ent.requires_grad
        hb = torch.cat([h.float(), torch.ones(N, 1)], 1).to(dtype)
        Wb = torch.cat([W.float(), torch.full((V, 1), 40.0)], 1).to(dtype)
        _, ent = triton_logprob(hb, Wb, y, block_n=16, block_v=64, block_h=16, v_splits=3, with_entropy=True)
        out[str(dtype)]["ent_shift"] = float((ent.double() - ent_ref).abs().max())
        out[str(dtype)]["ent_range"] = [float(ent_ref.min()), float(ent_ref.max())]
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
    _, met_torch = cispo_from_hidden(h, W, y, gen, A, w, eps_high=1.2, backend="torch")
    out["backend"] = dict(loss=abs(float(loss3.detach()) - float(ref.detach())) / abs(float(ref.detach())),
                          gh=rel(h3.grad, h1.grad), gw=rel(W3.grad, W1.grad), clip=met["clip_fraction"],
                          entropy=met.get("entropy"), entropy_torch=met_torch["entropy"])
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
    for dtype in ("torch.float32", "torch.bfloat16"):
        r = res[dtype]
        assert 1.0 < r["ent_range"][0] < r["ent_range"][1] < 5.3, r  # non-trivial entropies (log 200 = 5.3)
        for k in ("ent3", "ent6", "ent_shift"):  # nats, float64 reference
            assert r[k] < 2e-5, (dtype, k, r)
        assert r["ent3_logp"] and not r["ent3_grad"] and not r["ent6_grad"], r
    assert res["backend"]["entropy"] == pytest.approx(res["backend"]["entropy_torch"], rel=1e-5)
    for k in ("loss", "gh", "gw"):
        assert res["cispo"][k] < 1e-5, (k, res)
        assert res["backend"][k] < 1e-5, (k, res)  # cispo_from_hidden(backend="triton")
    assert 0 < res["backend"]["clip"] < 1


# Index arithmetic and dot precision, checked on the kernel helpers themselves (a file: @triton.jit needs
# the source of the probe kernels).
PROBE = textwrap.dedent(r"""
    import json, sys, torch, triton, triton.language as tl
    from triton.runtime import interpreter
    from scalerl_mega.objective.triton._kernels import block_index, tile_offsets

    @triton.jit
    def probe(out_ptr, idx, col, stride, BLOCK: tl.constexpr):
        # exactly the kernels' address math: row indices of block idx, column indices of block col
        offs = tile_offsets(block_index(idx, BLOCK), block_index(col, BLOCK), stride)
        tl.store(out_ptr + tile_offsets(block_index(0, BLOCK), block_index(0, BLOCK), BLOCK), offs)

    @triton.jit
    def probe_int32(out_ptr, idx, col, stride, BLOCK: tl.constexpr):
        # the pre-fix arithmetic (int32 program ids times strides): the negative control
        r = idx * BLOCK + tl.arange(0, BLOCK)
        c = col * BLOCK + tl.arange(0, BLOCK)
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i[:, None] * BLOCK + i[None, :], r[:, None] * stride + c[None, :])

    @triton.jit
    def probe_guard(out_ptr, stride, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)  # int32 indices handed to tile_offsets: its static_assert must fire
        tl.store(out_ptr + i, tl.sum(tile_offsets(i, i, stride), 1))

    res = {}
    B = 128
    # (block index, column block, stride): W rows of vocab block 2400 (rows 307200..307327, i.e. V > 300k)
    # at H = 8192, and hidden rows of token block 4100 (N > 524k) at H = 4096. Both pass 2^31.
    cases = [(2400, 63, 8192), (4100, 31, 4096)]
    for name, kern in (("int64", probe), ("int32", probe_int32)):
        ok, top = [], []
        for idx, col, stride in cases:
            out = torch.zeros(B, B, dtype=torch.int64)
            kern[(1,)](out, idx, col, stride, BLOCK=B)
            truth = torch.tensor([[(idx * B + i) * stride + col * B + j for j in range(B)] for i in range(B)],
                                 dtype=torch.int64)
            ok.append(bool(torch.equal(out, truth)))
            top.append(int(truth.max()))
        res[name] = dict(exact=ok, max_offset=top)
    try:
        probe_guard[(1,)](torch.zeros(16, dtype=torch.int64), 8, BLOCK=16)
        res["guard"] = "did not fire"
    except Exception as e:  # InterpreterError wrapping the static_assert
        res["guard"] = str(e)

    # input_precision requested by every tl.dot of a forward + backward, FP32 and bf16 inputs
    seen = []
    original = interpreter.InterpreterBuilder.create_dot

    def recording(self, a, b, d, input_precision, max_num_imprecise_acc):
        seen.append(str(input_precision))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = recording
    from scalerl_mega.objective.triton.fused_logprob import triton_logprob
    g = torch.Generator().manual_seed(1)
    N, H, V = 40, 32, 192
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        h0 = torch.randn(N, H, generator=g).to(dtype)
        W0 = (torch.randn(V, H, generator=g) * 0.3).to(dtype)
        y = torch.randint(0, V, (N,), generator=g)
        up = torch.randn(N, generator=g)
        seen.clear()
        outs = []
        for _ in range(2):  # determinism: two identical calls
            h, W = h0.clone().requires_grad_(True), W0.clone().requires_grad_(True)
            lp = triton_logprob(h, W, y, block_n=16, block_v=64, block_h=16, v_splits=2, bwd_chunk_rows=16)
            (lp * up).sum().backward()
            outs.append((lp.detach(), h.grad, W.grad))
        runs[str(dtype)] = dict(precisions=sorted(set(seen)), n_dots=len(seen),
                                identical=all(torch.equal(a, b) for a, b in zip(*outs)))
    seen.clear()  # the optional 3xTF32 mode reaches every dot too
    triton_logprob(h0.float(), W0.float(), y, block_n=16, block_v=64, block_h=16, fp32_precision="tf32x3")
    res["tf32x3"] = sorted(set(seen))
    # negative control: a plain tl.dot without input_precision is recorded as TF32 (Triton's default)
    @triton.jit
    def plain(a_ptr, o_ptr):
        i = tl.arange(0, 16)
        a = tl.load(a_ptr + i[:, None] * 16 + i[None, :])
        tl.store(o_ptr + i[:, None] * 16 + i[None, :], tl.dot(a, a))

    seen.clear()
    plain[(1,)](torch.randn(16, 16), torch.empty(16, 16))
    res["plain_dot"] = sorted(set(seen))
    res["runs"] = runs
    print(json.dumps(res))
""")


def _run_interpreted(script: str, tmp_path) -> dict:
    path = tmp_path / "probe.py"
    path.write_text(script)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernel_index_math_is_int64_and_dots_are_ieee_and_runs_repeat(tmp_path):
    """Checked: the helpers every kernel address goes through (`block_index`, `tile_offsets`) give exact
    int64 offsets past 2^31 (the int32 version of the same arithmetic wraps: the check can fail), and
    `tile_offsets` refuses int32 indices at compile time; every tl.dot of the FP32 path (which the
    interpreter runs for bf16 inputs too) asks for IEEE precision, a plain tl.dot for TF32; two identical
    forward+backward calls give bit-identical logp and gradients. Not checked here: a real launch at
    N*H >= 2^31 (it would allocate > 8 GB), and determinism under real GPU concurrency (tests/gpu does)."""
    res = _run_interpreted(PROBE, tmp_path)
    assert res["int64"]["exact"] == [True, True], res
    assert min(res["int64"]["max_offset"]) > 2**31, res
    assert res["int32"]["exact"] == [False, False], res  # the interpreter does wrap int32: the check bites
    assert "tile offsets must be int64" in res["guard"], res
    assert res["plain_dot"] == ["INPUT_PRECISION.TF32"], res
    assert res["tf32x3"] == ["INPUT_PRECISION.TF32x3"], res
    for dtype, run in res["runs"].items():
        assert run["precisions"] == ["INPUT_PRECISION.IEEE"], (dtype, run)
        # per call: forward (3 V tiles x 2 H slices x 3 row blocks) + dlogits (same count): 36, twice
        assert run["n_dots"] == 2 * 36, (dtype, run)
        assert run["identical"], (dtype, run)


AOT = textwrap.dedent(r"""
    import dataclasses, json, triton, triton.language as tl
    from scalerl_mega.objective.triton.aot import compile_kernel

    @triton.jit
    def plain_fp32_dot(h_ptr, h1_ptr, h2_ptr, w_ptr, w1_ptr, w2_ptr, y_ptr, m_ptr, s_ptr, t_ptr, z_ptr, N, V, H,
                       stride_h, stride_w, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                       UPCAST: tl.constexpr, PRECISION: tl.constexpr, WITH_ENTROPY: tl.constexpr, HP: tl.constexpr,
                       WP: tl.constexpr):
        r = tl.arange(0, BLOCK_N)
        c = tl.arange(0, BLOCK_V)
        k = tl.arange(0, BLOCK_H)
        a = tl.load(h_ptr + r[:, None] * stride_h + k[None, :])
        b = tl.load(w_ptr + c[:, None] * stride_w + k[None, :])
        tl.store(m_ptr + r, tl.sum(tl.dot(a, tl.trans(b)), 1))  # no input_precision: Triton's default

    out = {}
    for kernel in ("logprob_fwd_kernel", "dlogits_kernel"):
        out[kernel + ":bf16"] = compile_kernel(kernel, "bf16", (128, 128, 64, 8, 3))
        out[kernel + ":fp32"] = compile_kernel(kernel, "fp32", (64, 128, 32, 8, 3))
    out["entropy:bf16"] = compile_kernel("logprob_fwd_kernel", "bf16", (128, 128, 64, 8, 3), with_entropy=True)
    out["control"] = compile_kernel("logprob_fwd_kernel", "fp32", (64, 64, 32, 4, 3), fn=plain_fp32_dot)
    # bf16x3: the FP32 head's path on CUDA, bf16-valued hidden states (1 piece) x FP32 weight (3 pieces), in the
    # largest configuration of its autotune list; and general FP32 hidden states (3 pieces) in its smallest
    big, small = (128, 128, 64, 8, 2), (64, 64, 64, 4, 3)
    out["split:fwd"] = compile_kernel("logprob_fwd_kernel", "bf16x3 h1w3", big)
    out["split:fwd+entropy"] = compile_kernel("logprob_fwd_kernel", "bf16x3 h1w3", big, with_entropy=True)
    out["split:dlogits"] = compile_kernel("dlogits_kernel", "bf16x3 h1w3", big)
    out["split6:fwd"] = compile_kernel("logprob_fwd_kernel", "bf16x3 h3w3", small)
    print(json.dumps({k: dataclasses.asdict(v) for k, v in out.items()}))
""")


def test_kernels_compile_for_sm90_with_ieee_fp32_and_tensor_core_bf16(tmp_path):
    """Ahead-of-time compile for sm_90 on CPU (Triton's bundled ptxas, no driver): bf16 dots lower to wgmma
    without register spills; the FP32 path lowers to FMA (no mma/wgmma, no .tf32), while the same dot without
    input_precision lowers to TF32 wgmma (the control); the bf16x3 path (FP32 operands as bf16 pieces) lowers
    to bf16 wgmma only, 3 (6) products per step, no spills in its largest configuration with bf16-valued
    hidden states. Says nothing about speed."""
    path = tmp_path / "aot.py"
    path.write_text(AOT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-W", "ignore", str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for kernel in ("logprob_fwd_kernel", "dlogits_kernel"):
        bf16, fp32 = res[kernel + ":bf16"], res[kernel + ":fp32"]
        assert bf16["wgmma"] and not bf16["tf32"] and bf16["spill_bytes"] == 0, bf16
        assert 0 < bf16["registers"] <= 255 and bf16["shared_bytes"] <= 227 * 1024, bf16
        assert not fp32["wgmma"] and not fp32["mma_sync"] and not fp32["tf32"], fp32
        assert fp32["fma_f32"] >= 1024, fp32  # 64x128 tile x 32-deep slice / 256 threads, unrolled
    assert res["control"]["wgmma"] and res["control"]["tf32"], res["control"]
    e = res["entropy:bf16"]  # the WITH_ENTROPY variant: still wgmma, no spills in the largest bf16 config
    assert e["wgmma"] and not e["tf32"] and e["spill_bytes"] == 0 and 0 < e["registers"] <= 255, e
    # bf16x3: tensor-core bf16 dots only (no TF32, no FMA dot), no spills; 3 products per 16-deep wgmma step
    # of a 64-deep slice with one hidden piece (12 wgmma), 6 with three (24)
    plain = res["logprob_fwd_kernel:bf16"]["wgmma_count"]
    for key in ("split:fwd", "split:fwd+entropy", "split:dlogits", "split6:fwd"):
        r = res[key]
        assert r["wgmma"] and not r["tf32"] and not r["mma_sync"] and r["fma_f32"] < 128, (key, r)
        assert 0 < r["registers"] <= 255 and r["shared_bytes"] <= 227 * 1024 and r["spill_bytes"] == 0, (key, r)
    assert plain == 4 and res["split:fwd"]["wgmma_count"] == res["split:dlogits"]["wgmma_count"] == 3 * plain, res
    assert res["split6:fwd"]["wgmma_count"] == 6 * plain, res["split6:fwd"]


def test_fp32_mode_defaults_to_bf16x3_on_cuda_only(monkeypatch):
    """The FP32 head runs on tensor cores (bf16x3: exact bf16 pieces) on a GPU unless another mode is asked
    for; off CUDA and under the interpreter it stays IEEE (FP32 FMA dots made the 8B head
    +50-90% slower; 3xTF32 still ran at 1.13x naive's time)."""
    from types import SimpleNamespace

    import torch

    from scalerl_mega.objective.triton.fused_logprob import resolve_fp32_precision

    cuda_like, cpu = SimpleNamespace(is_cuda=True), torch.zeros(1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_fp32_precision(None, cuda_like) == "bf16x3"
    assert resolve_fp32_precision("ieee", cuda_like) == "ieee"
    assert resolve_fp32_precision("tf32x3", cuda_like) == "tf32x3"
    assert resolve_fp32_precision(None, cpu) == "ieee"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_fp32_precision(None, cuda_like) == "ieee"
    with pytest.raises(ValueError, match=r"fp32_precision='tf32' is not one of"):
        resolve_fp32_precision("tf32", cpu)
