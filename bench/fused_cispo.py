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
covered by tests instead; `--fp32-precision` picks its FP32 mode, default the kernel's: bf16x3 on CUDA),
liger (liger-kernel's LigerFusedLinearGRPOLoss, eager, if installed), trainer (the call the trainer's fused
head makes, trainer/policy_loss.py: `cispo_from_hidden(backend="auto", with_entropy=True, sums=True,
return_logp=True)`: Triton on CUDA, chunked torch on CPU; not in the default list).

The trainer's head input: `--dtype float32 --bf16-valued-hidden` gives FP32 hidden states holding bf16 values
(Float16Module's upcast of the bf16 decoder output) with an FP32 weight. `--error`: after the timed calls,
each variant's loss, logp (where it returns them) and gradients are compared with a float64 reference
(bench/head_reference.py; columns err_* of the JSON, the GPU suite's measures).

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
VARIANTS = ("naive", "chunked", "triton", "liger", "trainer")
DEFAULT_VARIANTS = ("naive", "chunked", "triton", "liger")
EPS_HIGH = 1.2
SEQ = 256


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _inputs(N: int, H: int, V: int, *, device: str = "cpu", dtype: str = "float32", bf16_valued: bool = False):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(N, H, generator=g, device=device)
    h = (h.bfloat16().float() if bf16_valued else h.to(getattr(torch, dtype))).requires_grad_(True)
    W = torch.randn(V, H, generator=g, device=device).mul_(H**-0.5).to(getattr(torch, dtype)).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g, device=device)
    gen = -torch.rand(N, generator=g, device=device).mul_(8.0).add_(2.0)
    adv_B = torch.randn(N // SEQ, generator=g, device=device)
    return h, W, y, gen, adv_B


class Case:
    """One variant on fresh inputs: `run()` -> (CISPO loss, per-token logp or None); `skip` says why not."""

    def __init__(self, variant: str, N: int, H: int, V: int, *, device: str, dtype: str, fp32_precision=None,
                 bf16_valued: bool = False):
        import torch

        if bf16_valued and dtype != "float32":
            raise ValueError("--bf16-valued-hidden needs --dtype float32 (FP32 hidden states holding bf16 values)")
        self.h, self.W, self.y, self.gen, adv_B = _inputs(N, H, V, device=device, dtype=dtype,
                                                          bf16_valued=bf16_valued)
        self.adv = adv_B.repeat_interleave(SEQ)
        self.w = torch.full((N,), 1.0 / N, device=device)
        self.skip = None
        self.run = getattr(self, "_" + variant)(N=N, H=H, device=device, fp32_precision=fp32_precision)

    def _naive(self, **_):
        import torch

        from scalerl_mega.objective.fused_logprob import naive_logprob

        def run():
            lp = naive_logprob(self.h, self.W, self.y)
            coef = (torch.exp(lp - self.gen).clamp(max=EPS_HIGH) * self.adv * self.w).detach()
            return -(coef * lp).sum(), lp.detach()
        return run

    def _chunked(self, **_):
        from scalerl_mega.objective.fused_logprob import cispo_from_hidden

        def run():
            loss, _, logp = cispo_from_hidden(self.h, self.W, self.y, self.gen, self.adv, self.w, eps_high=EPS_HIGH,
                                              backend="torch", return_logp=True)
            return loss, logp
        return run

    def _trainer(self, **_):
        from scalerl_mega.objective.fused_logprob import cispo_from_hidden

        def run():  # trainer/policy_loss.py make_cispo_head_loss_fn at TP 1
            loss, _, logp = cispo_from_hidden(self.h, self.W, self.y, self.gen, self.adv, self.w, eps_high=EPS_HIGH,
                                              sums=True, with_entropy=True, return_logp=True)
            return loss, logp
        return run

    def _triton(self, *, device: str, fp32_precision, **_):
        if device != "cuda":
            self.skip = "no CUDA device (Triton interpreter is ~1000x slower; covered by tests)"
            return None
        from scalerl_mega.objective.triton.fused_logprob import triton_cispo_from_hidden

        def run():  # what cispo_from_hidden(backend="triton") computes, with the FP32 mode selectable
            return triton_cispo_from_hidden(self.h, self.W, self.y, self.gen, self.adv, self.w, eps_high=EPS_HIGH,
                                            fp32_precision=fp32_precision), None
        return run

    def _liger(self, *, N: int, H: int, device: str, **_):
        import torch

        try:
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        except Exception as e:  # noqa: BLE001 - optional dependency
            self.skip = f"liger-kernel not importable ({type(e).__name__}: {e})"
            return None
        B = N // SEQ
        mod = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False, chunk_size=2,
                                       epsilon_high=EPS_HIGH, loss_type="cispo")
        h3, y2, gen2 = self.h.view(B, SEQ, H), self.y.view(B, SEQ), self.gen.view(B, SEQ)
        mask = torch.ones(B, SEQ, dtype=torch.long, device=device)
        adv_B = self.adv[::SEQ]

        def run():
            out = mod(h3, self.W, y2, mask, adv_B, old_per_token_logps=gen2)
            return (out[0] if isinstance(out, tuple) else out), None
        return run

    def errors(self, loss, logp) -> dict[str, float]:
        """The errors against float64 of the last call (its loss, logp, and the gradients left in h, W)."""
        from head_reference import errors

        return errors(self.h, self.W, self.y, self.gen, (self.adv * self.w).detach(), eps_high=EPS_HIGH, loss=loss,
                      logp=logp)


def _worker(variant: str, N: int, H: int, V: int, *, bf16_valued: bool = False, error: bool = False) -> dict:
    case = Case(variant, N, H, V, device="cpu", dtype="float32", bf16_valued=bf16_valued)
    if case.skip:
        return {"skipped": case.skip}
    before = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    loss, logp = case.run()
    loss.backward()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"time_s": wall, "cpu_s": cpu, "delta_rss_mb": peak - before, "max_rss_mb": peak,
           "loss": float(loss.detach()), "grad_h_norm": float(case.h.grad.norm()),
           "grad_w_norm": float(case.W.grad.norm())}
    return {**out, **(case.errors(loss, logp) if error else {})}


def _worker_cuda(variant: str, N: int, H: int, V: int, *, dtype: str, iters: int, fp32_precision: str | None,
                 bf16_valued: bool = False, error: bool = False) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device visible"}
    torch.set_float32_matmul_precision("highest")  # FP32 GEMMs in IEEE precision (no TF32), as the kernel
    case = Case(variant, N, H, V, device="cuda", dtype=dtype, fp32_precision=fp32_precision, bf16_valued=bf16_valued)
    if case.skip:
        return {"skipped": case.skip}
    h, W = case.h, case.W

    def step():
        h.grad = W.grad = None
        loss, logp = case.run()
        loss.backward()
        return loss, logp

    step()  # warm-up: compilation, autotuning, cuBLAS handles
    torch.cuda.synchronize()
    h.grad = W.grad = None
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss, logp = step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    peak = torch.cuda.max_memory_allocated() - base
    t = sorted(times)[len(times) // 2]
    tflops = 6.0 * N * H * V / t / 1e12
    out = {"time_s": t, "times_s": times, "peak_gib": peak / 2**30, "tflops": tflops,
           "frac_bf16_peak": tflops / H100_BF16_TFLOPS, "frac_fp32_peak": tflops / H100_FP32_TFLOPS,
           "loss": float(loss.detach()), "grad_h_norm": float(h.grad.float().norm()),
           "grad_w_norm": float(W.grad.float().norm()), "device_name": torch.cuda.get_device_name()}
    return {**out, **(case.errors(loss, logp) if error else {})}


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


def _worker_args(args) -> list[str]:
    """The options a measurement process gets from the driver's."""
    out = ["--device", args.device, "--dtype", args.dtype, "--iters", str(args.iters)]
    if args.fp32_precision:
        out += ["--fp32-precision", args.fp32_precision]
    return out + ["--bf16-valued-hidden"] * args.bf16_valued_hidden + ["--error"] * args.error


def _err_text(r: dict) -> str:
    """The float64 errors of a measurement (--error), or nothing."""
    keys = (("err_loss_rel", "loss"), ("err_logp_abs", "logp"), ("err_grad_h_rel", "gh"), ("err_grad_w_rel", "gW"))
    parts = [f"{name} {r[k]:.1e}" for k, name in keys if k in r]
    return ("  err vs f64: " + ", ".join(parts)) if parts else ""


def _inputs_text(args) -> str:
    if args.dtype != "float32":
        return f"{args.dtype} inputs"
    hidden = "bf16-valued FP32 hidden" if args.bf16_valued_hidden else "FP32 hidden"
    return f"{hidden}, FP32 weight, FP32 mode {args.fp32_precision or 'default'}"


def main_cuda(args) -> int:
    rows, failed = [], False
    shapes = args.shapes or [",".join(map(str, s)) for s in CUDA_SHAPES]
    print(f"roofline: H100 SXM dense bf16 {H100_BF16_TFLOPS:.0f} TFLOP/s, FP32 (no tensor cores) "
          f"{H100_FP32_TFLOPS:.0f} TFLOP/s; FLOPs counted = 6*N*H*V (3 GEMMs)")
    for shape in shapes:
        N, H, V = _shape(shape)
        results, notes = {}, {}
        for variant in args.variants:
            res, note = _run_worker(f"{variant}:{shape}", _worker_args(args))
            if note:
                notes[variant] = note
            else:
                results[variant] = res
                _emit(args, rows, {"variant": variant, "N": N, "H": H, "V": V, "dtype": args.dtype,
                                   "bf16_valued_hidden": args.bf16_valued_hidden,
                                   "fp32_precision": args.fp32_precision, **res})
        device = next((r["device_name"] for r in results.values()), "?")
        print(f"\nN={N} H={H} V={V}  (CISPO, {_inputs_text(args)}, {device}, median of {args.iters})")
        print(f"{'variant':<8} {'ms':>9} {'peak GiB':>9} {'TFLOP/s':>8} {'%bf16pk':>8} {'%fp32pk':>8} "
              f"{'t/naive':>8} {'mem/naive':>9}  loss")
        base = results.get("naive")

        def row(variant: str) -> str:
            r = results[variant]
            tr = f"{r['time_s'] / base['time_s']:.3f}" if base else "-"
            mr = f"{r['peak_gib'] / base['peak_gib']:.3f}" if base and base["peak_gib"] > 0 else "-"
            return (f"{r['time_s'] * 1e3:9.2f} {r['peak_gib']:9.2f} {r['tflops']:8.1f} "
                    f"{100 * r['frac_bf16_peak']:7.1f}% {100 * r['frac_fp32_peak']:7.1f}% {tr:>8} {mr:>9}  "
                    f"{r['loss']:.6g}{_err_text(r)}")

        failed |= _print_rows(args.variants, notes, row)
    _write_json(args, rows)
    return 1 if failed else 0


def _shape(shape: str) -> tuple[int, int, int]:
    N, H, V = map(int, shape.split(","))
    if N % SEQ:
        raise ValueError(f"--shapes {shape}: N must be a multiple of {SEQ}")
    return N, H, V


def _emit(args, rows: list[dict], row: dict) -> None:
    """Keep a measurement and, with --jsonl, append it as one line now (a later variant's timeout keeps it)."""
    rows.append(row)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")


def _write_json(args, rows: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main_cpu(args) -> int:
    failed, rows = False, []
    for shape in args.shapes or [",".join(map(str, s)) for s in SHAPES]:
        N, H, V = _shape(shape)
        results: dict[str, list[dict]] = {v: [] for v in args.variants}
        notes: dict[str, str] = {}
        for _ in range(args.rounds):
            for variant in args.variants:
                if variant in notes:
                    continue
                res, note = _run_worker(f"{variant}:{shape}", _worker_args(args))
                if note:
                    notes[variant] = note
                    continue
                results[variant].append(res)
                _emit(args, rows, {"variant": variant, "N": N, "H": H, "V": V, "dtype": args.dtype,
                                   "bf16_valued_hidden": args.bf16_valued_hidden, **res})
        print(f"\nN={N} H={H} V={V}  (CISPO, token aggregation, {_inputs_text(args)}, {os.cpu_count()} cores, "
              f"best of {args.rounds} alternating rounds)")
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
                    f"{ratio('delta_rss_mb', '.3f'):>10}  {results[variant][0]['loss']:.6g}  ({walls})"
                    f"{_err_text(results[variant][-1])}")

        failed |= _print_rows(args.variants, notes, cpu_row)
    _write_json(args, rows)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None,
                    help="N,H,V triples (default: the two CPU benchmark shapes of docs/running_scalerl.md; with --device cuda also 16384,4096,131072)")
    ap.add_argument("--variants", nargs="*", default=list(DEFAULT_VARIANTS), choices=VARIANTS)
    ap.add_argument("--rounds", type=int, default=2, help="CPU: alternating rounds (best of)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="input dtype (default: float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--bf16-valued-hidden", action="store_true",
                    help="with --dtype float32: FP32 hidden states holding bf16 values (the trainer's head input)")
    ap.add_argument("--iters", type=int, default=5, help="CUDA: timed calls after one warm-up (median)")
    ap.add_argument("--fp32-precision", choices=("bf16x3", "tf32x3", "ieee"), default=None,
                    help="CUDA, triton variant with FP32 operands: its mode (default: the kernel's, bf16x3)")
    ap.add_argument("--error", action="store_true",
                    help="also compare each variant's loss, logp and gradients with float64 (bench/head_reference.py)")
    ap.add_argument("--json", help="write all measurements to this file (at the end)")
    ap.add_argument("--jsonl", help="append each measurement to this file as one JSON line when it finishes")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cpu" and args.dtype != "float32":
        ap.error("--dtype bfloat16 is for --device cuda (the CPU figures are FP32)")
    if args.bf16_valued_hidden and args.dtype != "float32":
        ap.error("--bf16-valued-hidden needs --dtype float32")
    if args.worker:
        variant, shape = args.worker.split(":")
        N, H, V = map(int, shape.split(","))
        opts = dict(bf16_valued=args.bf16_valued_hidden, error=args.error)
        if args.device == "cuda":
            print(json.dumps(_worker_cuda(variant, N, H, V, dtype=args.dtype, iters=args.iters,
                                          fp32_precision=args.fp32_precision, **opts)))
        else:
            print(json.dumps(_worker(variant, N, H, V, **opts)))
        return 0
    return main_cuda(args) if args.device == "cuda" else main_cpu(args)


if __name__ == "__main__":
    raise SystemExit(main())
