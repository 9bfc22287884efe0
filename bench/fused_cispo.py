"""Benchmark: fused chunked FP32 CISPO vs naive torch (and Triton / Liger-Kernel when available).

Each measurement runs in a fresh subprocess so that its peak RSS is its own; --rounds rounds alternate the
variants (naive, chunked, ..., naive, chunked, ...) so that load drift on a shared machine hits all of
them alike. Per variant and shape we report the forward+backward wall time and process CPU time (best
over rounds) and the peak RSS increase over the process's RSS after the inputs were built
(ΔRSS = ru_maxrss - RSS before the loss), plus ratios against naive measured in the same run. Loss: CISPO with token aggregation (w = 1/N), eps_high = 1.2, fp32 inputs, so that all
variants (including Liger's chunked GRPO loss with loss_type="cispo", which normalises by the token count)
compute the same quantity; the loss values are printed for a cross-check.

    .venv/bin/python bench/fused_cispo.py                 # both shapes, all variants
    .venv/bin/python bench/fused_cispo.py --shapes 2048,512,32768 --rounds 1
    python3 bench/fused_cispo.py --device cuda            # GPU: the CPU shapes + 16384,4096,131072, bf16
    python3 bench/fused_cispo.py --device cuda --dtype float32 --fp32-precision tf32x3

Variants: naive (full [N, V] fp32 logits, autograd), chunked (scalerl_mega cispo_from_hidden, torch path),
triton (scalerl_mega Triton kernel; needs CUDA — skipped on CPU: the interpreter is ~1000x slower and is
covered by tests instead), liger (liger-kernel's LigerFusedLinearGRPOLoss, eager, if installed).

--device cuda: inputs are made on the GPU (bf16 by default, `--dtype`), each variant in its own process;
after one warm-up call (compilation, Triton autotuning) `--iters` forward+backward calls are timed with CUDA
events (median reported). Peak memory is torch.cuda.max_memory_allocated() during the timed calls minus the
memory allocated before the loss (inputs). Roofline fraction: useful FLOPs = 3 GEMMs of 2*N*H*V (logits,
grad_h, grad_W) over the median time, against the H100 SXM dense peaks H100_BF16_TFLOPS = 989 (bf16 tensor
cores) and H100_FP32_TFLOPS = 67 (FP32 without tensor cores; IEEE FP32 GEMMs run there). Variants that
recompute logits (triton: 4 GEMMs) or upcast to FP32 (naive, chunked) do more or slower work for the same
count, which is the point of the comparison. `--json PATH` writes every measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository root: each worker process gets it on PYTHONPATH (run as `python3 bench/fused_cispo.py`
from anywhere, the package still imports)."""
SHAPES = ((4096, 1024, 65536), (2048, 512, 32768))
CUDA_SHAPES = SHAPES + ((16384, 4096, 131072),)
H100_BF16_TFLOPS = 989.0
"""H100 SXM dense bf16 tensor-core peak (TFLOP/s)."""
H100_FP32_TFLOPS = 67.0
"""H100 SXM FP32 peak without tensor cores (TFLOP/s)."""
VARIANTS = ("naive", "chunked", "triton", "liger")
EPS_HIGH = 1.2
SEQ = 256


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _inputs(N: int, H: int, V: int, *, device: str = "cpu", dtype: str = "float32"):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(N, H, generator=g, device=device).to(getattr(torch, dtype)).requires_grad_(True)
    W = torch.randn(V, H, generator=g, device=device).mul_(H**-0.5).to(getattr(torch, dtype)).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g, device=device)
    gen = -torch.rand(N, generator=g, device=device).mul_(8.0).add_(2.0)
    adv_B = torch.randn(N // SEQ, generator=g, device=device)
    return h, W, y, gen, adv_B


def _loss_fn(variant: str, N: int, H: int, V: int, *, device: str, dtype: str, fp32_precision: str = "ieee"):
    """(run, h, W, skip_reason): run() returns the CISPO loss of this variant on fresh inputs."""
    import torch

    h, W, y, gen, adv_B = _inputs(N, H, V, device=device, dtype=dtype)
    adv = adv_B.repeat_interleave(SEQ)
    w = torch.full((N,), 1.0 / N, device=device)
    if variant == "naive":
        from scalerl_mega.objective.fused_logprob import naive_logprob

        def run():
            lp = naive_logprob(h, W, y)
            coef = (torch.exp(lp - gen).clamp(max=EPS_HIGH) * adv * w).detach()
            return -(coef * lp).sum()
    elif variant == "chunked":
        from scalerl_mega.objective.fused_logprob import cispo_from_hidden

        def run():
            return cispo_from_hidden(h, W, y, gen, adv, w, eps_high=EPS_HIGH, backend="torch")[0]
    elif variant == "triton":
        if device != "cuda":
            return None, h, W, "no CUDA device (Triton interpreter is ~1000x slower; covered by tests)"
        from scalerl_mega.objective.triton.fused_logprob import triton_cispo_from_hidden

        def run():  # what cispo_from_hidden(backend="triton") computes, with the FP32 dot mode selectable
            return triton_cispo_from_hidden(h, W, y, gen, adv, w, eps_high=EPS_HIGH, fp32_precision=fp32_precision)
    elif variant == "liger":
        try:
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        except Exception as e:  # noqa: BLE001 - optional dependency
            return None, h, W, f"liger-kernel not importable ({type(e).__name__}: {e})"
        B = N // SEQ
        mod = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False, chunk_size=2,
                                       epsilon_high=EPS_HIGH, loss_type="cispo")
        h3, y2, gen2 = h.view(B, SEQ, H), y.view(B, SEQ), gen.view(B, SEQ)
        mask = torch.ones(B, SEQ, dtype=torch.long, device=device)

        def run():
            out = mod(h3, W, y2, mask, adv_B, old_per_token_logps=gen2)
            return out[0] if isinstance(out, tuple) else out
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return run, h, W, None


def _worker(variant: str, N: int, H: int, V: int) -> dict:
    run, h, W, skip = _loss_fn(variant, N, H, V, device="cpu", dtype="float32")
    if skip:
        return {"skipped": skip}
    before = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = run()
    loss.backward()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"time_s": wall, "cpu_s": cpu, "delta_rss_mb": peak - before, "max_rss_mb": peak,
            "loss": float(loss.detach()), "grad_h_norm": float(h.grad.norm()), "grad_w_norm": float(W.grad.norm())}


def _worker_cuda(variant: str, N: int, H: int, V: int, *, dtype: str, iters: int, fp32_precision: str) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device visible"}
    torch.set_float32_matmul_precision("highest")  # FP32 GEMMs in IEEE precision (no TF32), as the kernel
    run, h, W, skip = _loss_fn(variant, N, H, V, device="cuda", dtype=dtype, fp32_precision=fp32_precision)
    if skip:
        return {"skipped": skip}

    def step():
        h.grad = W.grad = None
        loss = run()
        loss.backward()
        return loss

    loss = step()  # warm-up: compilation, autotuning, cuBLAS handles
    torch.cuda.synchronize()
    h.grad = W.grad = None
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    peak = torch.cuda.max_memory_allocated() - base
    t = sorted(times)[len(times) // 2]
    tflops = 6.0 * N * H * V / t / 1e12
    return {"time_s": t, "times_s": times, "peak_gib": peak / 2**30, "tflops": tflops,
            "frac_bf16_peak": tflops / H100_BF16_TFLOPS, "frac_fp32_peak": tflops / H100_FP32_TFLOPS,
            "loss": float(loss.detach()), "grad_h_norm": float(h.grad.float().norm()),
            "grad_w_norm": float(W.grad.float().norm()), "device_name": torch.cuda.get_device_name()}


def _print_rows(variants: list[str], notes: dict[str, str], row) -> bool:
    """One table line per variant: its note (skipped / failed) or `row(variant)`. True if any variant failed."""
    for variant in variants:
        print(f"{variant:<8} {notes[variant] if variant in notes else row(variant)}")
    return any(notes.get(v, "").startswith("FAILED") for v in variants)


def _run_worker(spec: str, extra: list[str]) -> tuple[dict | None, str | None]:
    """Run one measurement in a fresh process: (result, None) or (None, note)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", spec, *extra]
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    if proc.returncode != 0:
        return None, "FAILED: " + " ".join(proc.stderr.strip().splitlines()[-1:])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in res:
        return None, "skipped: " + res["skipped"]
    return res, None


def main_cuda(args) -> int:
    rows, failed = [], False
    shapes = args.shapes or [",".join(map(str, s)) for s in CUDA_SHAPES]
    print(f"roofline: H100 SXM dense bf16 {H100_BF16_TFLOPS:.0f} TFLOP/s, FP32 (no tensor cores) "
          f"{H100_FP32_TFLOPS:.0f} TFLOP/s; FLOPs counted = 6*N*H*V (3 GEMMs)")
    for shape in shapes:
        N, H, V = map(int, shape.split(","))
        if N % SEQ:
            raise ValueError(f"--shapes {shape}: N must be a multiple of {SEQ}")
        results, notes = {}, {}
        for variant in args.variants:
            res, note = _run_worker(f"{variant}:{shape}",
                                    ["--device", "cuda", "--dtype", args.dtype, "--iters", str(args.iters),
                                     "--fp32-precision", args.fp32_precision])
            if note:
                notes[variant] = note
            else:
                results[variant] = res
                rows.append({"variant": variant, "N": N, "H": H, "V": V, "dtype": args.dtype, **res})
        device = next((r["device_name"] for r in results.values()), "?")
        mode = f", FP32 dots {args.fp32_precision}" if args.dtype == "float32" else ""
        print(f"\nN={N} H={H} V={V}  (CISPO, {args.dtype} inputs{mode}, {device}, median of {args.iters})")
        print(f"{'variant':<8} {'ms':>9} {'peak GiB':>9} {'TFLOP/s':>8} {'%bf16pk':>8} {'%fp32pk':>8} "
              f"{'t/naive':>8} {'mem/naive':>9}  loss")
        base = results.get("naive")

        def row(variant: str) -> str:
            r = results[variant]
            tr = f"{r['time_s'] / base['time_s']:.3f}" if base else "-"
            mr = f"{r['peak_gib'] / base['peak_gib']:.3f}" if base and base["peak_gib"] > 0 else "-"
            return (f"{r['time_s'] * 1e3:9.2f} {r['peak_gib']:9.2f} {r['tflops']:8.1f} "
                    f"{100 * r['frac_bf16_peak']:7.1f}% {100 * r['frac_fp32_peak']:7.1f}% {tr:>8} {mr:>9}  "
                    f"{r['loss']:.6g}")

        failed |= _print_rows(args.variants, notes, row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None,
                    help="N,H,V triples (default: the two CPU benchmark shapes of docs/running_scalerl.md; with --device cuda also 16384,4096,131072)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--rounds", type=int, default=2, help="CPU: alternating rounds (best of)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="input dtype (default: float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--iters", type=int, default=5, help="CUDA: timed calls after one warm-up (median)")
    ap.add_argument("--fp32-precision", choices=("ieee", "tf32x3"), default="ieee",
                    help="CUDA, triton variant with --dtype float32: FP32 dot mode")
    ap.add_argument("--json", help="CUDA: write all measurements to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cpu" and args.dtype != "float32":
        ap.error("--dtype bfloat16 is for --device cuda (the CPU figures are FP32)")
    if args.worker:
        variant, shape = args.worker.split(":")
        N, H, V = map(int, shape.split(","))
        if args.device == "cuda":
            print(json.dumps(_worker_cuda(variant, N, H, V, dtype=args.dtype, iters=args.iters,
                                          fp32_precision=args.fp32_precision)))
        else:
            print(json.dumps(_worker(variant, N, H, V)))
        return 0
    if args.device == "cuda":
        return main_cuda(args)
    failed = False
    for shape in args.shapes or [",".join(map(str, s)) for s in SHAPES]:
        N, H, V = map(int, shape.split(","))
        if N % SEQ:
            raise ValueError(f"--shapes {shape}: N must be a multiple of {SEQ}")
        results: dict[str, list[dict]] = {v: [] for v in args.variants}
        notes: dict[str, str] = {}
        for _ in range(args.rounds):
            for variant in args.variants:
                if variant in notes:
                    continue
                res, note = _run_worker(f"{variant}:{shape}", [])
                if note:
                    notes[variant] = note
                    continue
                results[variant].append(res)
        print(f"\nN={N} H={H} V={V}  (CISPO, token aggregation, fp32, {os.cpu_count()} cores, best of "
              f"{args.rounds} alternating rounds)")
        print(f"{'variant':<8} {'wall s':>7} {'cpu s':>7} {'ΔRSS MB':>8} {'maxRSS':>7} {'wall/naive':>10} "
              f"{'cpu/naive':>9} {'ΔRSS/naive':>10}  loss  (wall per round)")
        best = {v: {k: min(r[k] for r in rs) for k in ("time_s", "cpu_s", "delta_rss_mb", "max_rss_mb")}
                for v, rs in results.items() if rs}
        base = best.get("naive")

        def cpu_row(variant: str) -> str:
            b = best[variant]

            def ratio(k: str, fmt: str = ".2f") -> str:
                return format(b[k] / base[k], fmt) if base else "-"

            walls = ", ".join(format(r["time_s"], ".2f") for r in results[variant])
            return (f"{b['time_s']:7.2f} {b['cpu_s']:7.2f} {b['delta_rss_mb']:8.0f} "
                    f"{b['max_rss_mb']:7.0f} {ratio('time_s'):>10} {ratio('cpu_s'):>9} "
                    f"{ratio('delta_rss_mb', '.3f'):>10}  {results[variant][0]['loss']:.6g}  ({walls})")

        failed |= _print_rows(args.variants, notes, cpu_row)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
