"""The Triton head's bf16x3 path (FP32 operands as exact bf16 pieces, objective/triton/split_path.py) under
TRITON_INTERPRET=1 on tiny shapes, against float64 with the GPU suite's bounds
(tests/gpu/test_fused_logprob_gpu.py) and against the torch reference of the same scheme
(`bf16_split.split_matmul`).

The interpreter upcasts the bf16 pieces to FP32 before each dot (its bf16 dot is wrong), which keeps the
products exact, so what runs here is the scheme's arithmetic, indexing, chunking and piece bookkeeping; the
bf16 wgmma lowering is checked by the AOT test in test_objective_triton.py and speed only on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

TOL_LOGP = TOL_LOSS = 1e-4  # the GPU suite's bounds
TOL_GRAD = {"torch.float32": 2e-5, "torch.bfloat16": 8e-3}
TOL_ENTROPY = 2e-5  # nats, as test_objective_triton.py

SCRIPT = textwrap.dedent(r"""
    import json, torch
    from triton.runtime import interpreter
    from scalerl_mega.objective.bf16_split import split_matmul
    from scalerl_mega.objective.triton import fused_logprob as fl

    dots = []
    original = interpreter.InterpreterBuilder.create_dot

    def recording(self, a, b, d, input_precision, max_num_imprecise_acc):
        dots.append(str(input_precision))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = recording

    def reference(h, W, y, up):
        # float64 logp, entropy, loss sum(up * logp) and its gradients, from the same (rounded) inputs
        h64, W64 = h.double().requires_grad_(True), W.double().requires_grad_(True)
        z = h64 @ W64.t()
        lp = torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0]
        ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
        loss = (lp * up.double()).sum()
        loss.backward()
        return lp.detach(), ent.detach(), float(loss), h64.grad, W64.grad

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    BLOCKS = dict(block_n=16, block_v=64, block_h=16)
    g = torch.Generator().manual_seed(0)
    N, H, V = 37, 40, 200  # none a multiple of the blocks: exercises masking
    out = {}
    for case in ("bf16_valued", "fp32", "bf16_hidden"):
        h = torch.randn(N, H, generator=g)
        h = {"bf16_valued": h.bfloat16().float(), "fp32": h, "bf16_hidden": h.bfloat16()}[case]
        W = torch.randn(V, H, generator=g) * 0.3
        y = torch.randint(0, V, (N,), generator=g)
        up = torch.randn(N, generator=g)
        lp64, ent64, loss64, gh64, gw64 = reference(h, W, y, up)
        res = {}
        # one chunk, and the smallest chunks (2 vocabulary chunks forward and backward, 3 row chunks backward)
        for name, chunk_bytes in (("one_chunk", 2**30), ("chunked", 1)):
            runs = []
            for _ in range(2):
                dots.clear()
                h2, W2 = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
                lp, ent = fl.triton_logprob(h2, W2, y, fp32_precision="bf16x3", with_entropy=True,
                                            chunk_bytes=chunk_bytes, **BLOCKS)
                loss = (lp * up).sum()
                loss.backward()
                runs.append((lp.detach(), ent, h2.grad, W2.grad))
            res[name] = dict(logp=float((lp.double() - lp64).abs().max()), entropy=float((ent.double() - ent64).abs().max()),
                             loss=abs(float(loss) - loss64) / abs(loss64), gh=rel(h2.grad, gh64), gw=rel(W2.grad, gw64),
                             gh_dtype=str(h2.grad.dtype), gw_dtype=str(W2.grad.dtype), n_dots=len(dots),
                             precisions=sorted(set(dots)),
                             identical=all(torch.equal(a, b) for a, b in zip(*runs)))
        # the torch reference of the same scheme: logits through split_matmul, log-softmax in float64
        z = split_matmul(h.float(), W.t()).double()
        res["vs_scheme"] = float((lp.double() - torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0]).abs().max())
        out[case] = res
    # negative control: general FP32 hidden states taken as one bf16 piece (the detection overruled)
    fl.pieces_needed = lambda x: 1
    h = torch.randn(N, H, generator=g)
    W = torch.randn(V, H, generator=g) * 0.3
    y = torch.randint(0, V, (N,), generator=g)
    lp64 = reference(h, W, y, torch.ones(N))[0]
    lp = fl.triton_logprob(h, W, y, fp32_precision="bf16x3", **BLOCKS)
    out["control_logp"] = float((lp.double() - lp64).abs().max())
    print(json.dumps(out))
""")


def test_bf16x3_path_matches_float64_with_the_gpu_bounds():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    # per call: forward and dlogits each (3 row blocks x 4 vocabulary tiles x 3 H slices) x products per slice:
    # 3 with one hidden piece (bf16 dtype, or FP32 detected bf16-valued), 6 with three (general FP32)
    products = {"bf16_valued": 3, "fp32": 6, "bf16_hidden": 3}
    for case, res_case in ((c, res[c]) for c in products):
        for name in ("one_chunk", "chunked"):
            r = res_case[name]
            assert r["n_dots"] == 2 * 36 * products[case], (case, name, r)
            assert r["precisions"] == ["INPUT_PRECISION.IEEE"], r  # exact products of the upcast pieces
            assert r["logp"] <= TOL_LOGP and r["loss"] <= TOL_LOSS and r["entropy"] <= TOL_ENTROPY, (case, name, r)
            assert r["gh"] <= TOL_GRAD[r["gh_dtype"]] and r["gw"] <= TOL_GRAD[r["gw_dtype"]], (case, name, r)
            assert r["gw_dtype"] == "torch.float32", r
            assert r["identical"], (case, name, r)  # two calls, bit-identical logp, entropy and gradients
            if r["gh_dtype"] == "torch.float32":  # FP32 throughout: ~1e-7 here, far inside the bounds
                assert max(r["logp"], r["gh"], r["gw"]) < 1e-5, (case, name, r)
        assert res_case["one_chunk"]["gh_dtype"] == ("torch.bfloat16" if case == "bf16_hidden" else "torch.float32")
        assert res_case["vs_scheme"] < 1e-5, (case, res_case)
    # the control fails the bound the detection keeps: bf16 rounding of general FP32 inputs is ~2^-9 relative
    assert res["control_logp"] > 10 * TOL_LOGP, res["control_logp"]
