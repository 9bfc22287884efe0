"""Benchmark: the Megatron trainer's training step in FP32 vs bf16 mixed precision on CPU.

The same small Llama-style model (built from a seed), the same batch and the trainer's own wrapping
(trainer/megatron/wrap.py: Float16Module, FP32 gradient buffers, FP32 main params in the optimizer,
FP32 head) run in two fresh subprocesses, one per precision, so that each peak RSS is its own. Per
precision: median wall time of the timed training steps (after one warm-up step) and peak RSS
(ru_maxrss) of the process; then the bf16/FP32 ratios. One run each (CPU bf16 speed depends on the
CPU's bf16 support; on a shared machine treat the time ratio as indicative).

    .venv/bin/python bench/precision.py                  # defaults below
    .venv/bin/python bench/precision.py --hidden 512 --layers 4 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> dict:
    """One precision: build, warm up, time `args.steps` training steps."""
    import dataclasses

    import torch

    sys.path.insert(0, str(ROOT))
    from scalerl_mega.trainer.megatron import models, parallel, step, wrap
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset

    torch.set_num_threads(args.threads)
    model = dataclasses.replace(load_model_preset("tiny_dense"), hidden_size=args.hidden, ffn_hidden_size=4 * args.hidden,
                                num_layers=args.layers, num_attention_heads=8, num_query_groups=4,
                                vocab_size=args.vocab, max_position_embeddings=args.seq)
    cfg = MegatronConfig(model=model, parallel=ParallelConfig(micro_batch_size=args.micro_batch),
                         optim=OptimConfig(lr=1e-4, warmup_steps=0), params_dtype=args.child).validate(world_size=1)
    parallel.init_parallel(cfg.parallel, model=cfg.model)
    gpt, tcfg = models.build_model(cfg.model, cfg.parallel, params_dtype=cfg.params_dtype)
    chunks = [wrap.wrap_model(gpt, tcfg, cfg)]
    step.configure_schedule(tcfg, chunks)
    optimizer = wrap.build_optimizer(chunks, cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.rows, args.seq + 1), generator=g)
    batch = {"input_ids": ids[:, :-1], "position_ids": torch.arange(args.seq).expand(args.rows, args.seq).contiguous(),
             "targets": ids[:, 1:], "loss_mask": torch.ones(args.rows, args.seq)}
    times, losses = [], []
    for i in range(args.steps + 1):
        t0 = time.perf_counter()
        m = step.train_step(chunks, optimizer, batch, step=i, optim=cfg.optim, parallel=cfg.parallel)
        if i:  # the first step is a warm-up
            times.append(time.perf_counter() - t0)
        losses.append(m["loss"])
    parallel.teardown_parallel()
    return {"precision": args.child, "params": sum(p.numel() for p in gpt.parameters()),
            "step_s": statistics.median(times), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "losses": losses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", choices=("float32", "bfloat16"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    results = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    passthrough = [a for a in sys.argv[1:]]
    for precision in ("float32", "bfloat16"):
        r = subprocess.run([sys.executable, __file__, *passthrough, "--child", precision], env=env,
                           capture_output=True, text=True, timeout=1800)
        if r.returncode:
            sys.exit(f"{precision} run failed:\n{r.stderr[-3000:]}")
        results[precision] = json.loads(r.stdout.strip().splitlines()[-1])
    f, b = results["float32"], results["bfloat16"]
    print(f"model: {f['params']:,} params, {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; "
          f"{args.rows} rows x {args.seq} tokens, micro-batch {args.micro_batch}, {args.threads} thread(s)")
    print(f"{'precision':<10} {'step s':>8} {'peak RSS MB':>12}  losses")
    for r in (f, b):
        print(f"{r['precision']:<10} {r['step_s']:>8.3f} {r['peak_rss_mb']:>12.0f}  "
              + " ".join(f"{x:.4f}" for x in r["losses"]))
    print(f"bf16/fp32: step time x{b['step_s'] / f['step_s']:.2f}, peak RSS x{b['peak_rss_mb'] / f['peak_rss_mb']:.2f}")
    print(json.dumps({"float32": f, "bfloat16": b}))


if __name__ == "__main__":
    main()
