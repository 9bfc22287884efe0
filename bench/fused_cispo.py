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

Variants: naive (full [N, V] fp32 logits, autograd), chunked (scalerl_mega cispo_from_hidden),
triton (scalerl_mega Triton kernel; needs CUDA — skipped on CPU: the interpreter is ~1000x slower and is
covered by tests instead), liger (liger-kernel's LigerFusedLinearGRPOLoss, eager, if installed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SHAPES = ((4096, 1024, 65536), (2048, 512, 32768))
VARIANTS = ("naive", "chunked", "triton", "liger")
EPS_HIGH = 1.2
SEQ = 256


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _inputs(N: int, H: int, V: int):
    import torch

    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, H, generator=g).requires_grad_(True)
    W = torch.randn(V, H, generator=g).mul_(H**-0.5).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g)
    gen = -torch.rand(N, generator=g).mul_(8.0).add_(2.0)
    adv_B = torch.randn(N // SEQ, generator=g)
    return h, W, y, gen, adv_B


def _worker(variant: str, N: int, H: int, V: int) -> dict:
    import torch

    h, W, y, gen, adv_B = _inputs(N, H, V)
    adv = adv_B.repeat_interleave(SEQ)
    w = torch.full((N,), 1.0 / N)
    if variant == "naive":
        from scalerl_mega.objective.fused_logprob import naive_logprob

        def run():
            lp = naive_logprob(h, W, y)
            coef = (torch.exp(lp - gen).clamp(max=EPS_HIGH) * adv * w).detach()
            return -(coef * lp).sum()
    elif variant == "chunked":
        from scalerl_mega.objective.fused_logprob import cispo_from_hidden

        def run():
            return cispo_from_hidden(h, W, y, gen, adv, w, eps_high=EPS_HIGH)[0]
    elif variant == "triton":
        if not torch.cuda.is_available():
            return {"skipped": "no CUDA device (Triton interpreter is ~1000x slower; covered by tests)"}
        raise NotImplementedError  # pragma: no cover - GPU path measured on a GPU machine
    elif variant == "liger":
        try:
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        except Exception as e:  # noqa: BLE001 - optional dependency
            return {"skipped": f"liger-kernel not importable ({type(e).__name__}: {e})"}
        B = N // SEQ
        mod = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False, chunk_size=2,
                                       epsilon_high=EPS_HIGH, loss_type="cispo")
        h3, y2, gen2 = h.view(B, SEQ, H), y.view(B, SEQ), gen.view(B, SEQ)
        mask = torch.ones(B, SEQ, dtype=torch.long)

        def run():
            out = mod(h3, W, y2, mask, adv_B, old_per_token_logps=gen2)
            return out[0] if isinstance(out, tuple) else out
    else:
        raise ValueError(f"unknown variant {variant!r}")
    before = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = run()
    loss.backward()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"time_s": wall, "cpu_s": cpu, "delta_rss_mb": peak - before, "max_rss_mb": peak,
            "loss": float(loss.detach()), "grad_h_norm": float(h.grad.norm()), "grad_w_norm": float(W.grad.norm())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES],
                    help="N,H,V triples")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        variant, shape = args.worker.split(":")
        N, H, V = map(int, shape.split(","))
        print(json.dumps(_worker(variant, N, H, V)))
        return 0
    for shape in args.shapes:
        N, H, V = map(int, shape.split(","))
        if N % SEQ:
            raise ValueError(f"--shapes {shape}: N must be a multiple of {SEQ}")
        results: dict[str, list[dict]] = {v: [] for v in args.variants}
        notes: dict[str, str] = {}
        for _ in range(args.rounds):
            for variant in args.variants:
                if variant in notes:
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{variant}:{shape}"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    notes[variant] = "FAILED: " + " ".join(proc.stderr.strip().splitlines()[-1:])
                    continue
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                if "skipped" in res:
                    notes[variant] = "skipped: " + res["skipped"]
                    continue
                results[variant].append(res)
        print(f"\nN={N} H={H} V={V}  (CISPO, token aggregation, fp32, {os.cpu_count()} cores, best of "
              f"{args.rounds} alternating rounds)")
        print(f"{'variant':<8} {'wall s':>7} {'cpu s':>7} {'ΔRSS MB':>8} {'maxRSS':>7} {'wall/naive':>10} "
              f"{'cpu/naive':>9} {'ΔRSS/naive':>10}  loss  (wall per round)")
        best = {v: {k: min(r[k] for r in rs) for k in ("time_s", "cpu_s", "delta_rss_mb", "max_rss_mb")}
                for v, rs in results.items() if rs}
        base = best.get("naive")
        for variant in args.variants:
            if variant in notes:
                print(f"{variant:<8} {notes[variant]}")
                continue
            b = best[variant]

            def ratio(k: str, fmt: str = ".2f") -> str:
                return format(b[k] / base[k], fmt) if base else "-"

            walls = ", ".join(format(r["time_s"], ".2f") for r in results[variant])
            print(f"{variant:<8} {b['time_s']:7.2f} {b['cpu_s']:7.2f} {b['delta_rss_mb']:8.0f} "
                  f"{b['max_rss_mb']:7.0f} {ratio('time_s'):>10} {ratio('cpu_s'):>9} "
                  f"{ratio('delta_rss_mb', '.3f'):>10}  {results[variant][0]['loss']:.6g}  "
                  f"({walls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
