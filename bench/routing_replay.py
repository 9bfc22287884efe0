#!/usr/bin/env python
"""Benchmark: MoE rollout routing replay (issue #19) on the demo's model and task, on CPU.

The demo's Llama-4-style MoE (`experiment=demo`: tiny_moe widened, 4 routed experts top-1 sigmoid + a
shared expert) is built as the Megatron trainer, warm-started on the demo's SFT data (the demo's
`sft.*` settings, `--sft-steps` steps), and its weights are exported into the real local engine core
(`rollout.core.GenerationCore`, HF transformers, route recording on) in three engine settings:

- ``fp32``: the demo's own engine (FP32 body and head, as `make demo` runs it);
- ``bf16``: a bf16 engine body (a GPU-style generator) against the FP32 trainer;
- ``fp32+noise``: FP32, with the engine's router weights perturbed by Gaussian noise of
  `--noise` x their std, a stand-in for two numerical stacks that round router logits differently.

Each engine samples `--prompts` demo prompts x `--samples`; the same samples are then scored by the
trainer with `moe.routing_replay` = none, ids, ids_and_weights (`tests/support/routing_probe.py`).
Per setting and mode: routing agreement on on-policy tokens (routes the trainer used == the engine's),
the trainer routers' own agreement, and the engine-vs-trainer |log-ratio| mean and max on on-policy
tokens, with the ratio to replay off (the baseline measured in the same run).

    PYTHONPATH=. .venv/bin/python bench/routing_replay.py [--sft-steps 100 --prompts 32 --samples 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=str, default="", help="also write the results here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    from scalerl_mega import build, sft
    from scalerl_mega.compose import compose
    from scalerl_mega.data.tasks.arith import sft_token_ids
    from tests.support.routing_probe import engine_core, probe, sample_batch

    torch.set_num_threads(1)
    cfg = compose(["experiment=demo", "output_dir=.", f"seed={args.seed}"], machine=True)
    task = build.build_task(cfg)
    trainer = build.build_trainer(cfg)
    t0 = time.perf_counter()
    examples = [sft_token_ids(task.tokenizer, p) for p in task.train_prompts]
    sft.warm_start(trainer, examples, steps=args.sft_steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                   warmup_steps=min(cfg.sft.warmup_steps, args.sft_steps), seed=args.seed)
    sft_s = time.perf_counter() - t0
    rng = random.Random(args.seed)
    prompts = [task.encode(p.text) for p in rng.sample(list(task.train_prompts), args.prompts)]
    max_seq = build.engine_max_seq_len(cfg, task)
    settings = [("fp32", "float32", 0.0), ("bf16", "bfloat16", 0.0), ("fp32+noise", "float32", args.noise)]
    rows = []
    try:
        for name, dtype, noise in settings:
            core = engine_core(trainer, dtype=dtype, router_noise=noise, max_seq_len=max_seq, seed=args.seed,
                               max_batch=cfg.rollout.max_batch_size, eos_token_ids=list(task.stop_token_ids))
            batch = sample_batch(core, prompts, samples=args.samples, max_new_tokens=cfg.length.max_new_tokens,
                                 version=trainer.step, seed=args.seed)
            for r in probe(trainer, batch):
                rows.append({"engine": name, "mode": r.mode, "tokens": r.tokens,
                             "agreement": r.routing.get("routing_agreement_onpolicy"),
                             "natural_agreement": r.routing.get("routing_agreement_natural_onpolicy"),
                             "abs_log_ratio_mean": r.abs_log_ratio_mean, "abs_log_ratio_max": r.abs_log_ratio_max})
    finally:
        trainer.close()
    base = {row["engine"]: row for row in rows if row["mode"] == "none"}
    print(f"demo model, SFT {args.sft_steps} steps ({sft_s:.0f} s), {args.prompts} prompts x {args.samples} samples, "
          f"on-policy tokens per engine: {rows[0]['tokens']}")
    print(f"{'engine':<11} {'replay':<16} {'agree':>7} {'trainer':>8} {'|log-ratio| mean':>17} {'max':>10} "
          f"{'mean/off':>9} {'max/off':>8}")
    for row in rows:
        b = base[row["engine"]]
        print(f"{row['engine']:<11} {row['mode']:<16} {row['agreement']:>7.4f} {row['natural_agreement']:>8.4f} "
              f"{row['abs_log_ratio_mean']:>17.3e} {row['abs_log_ratio_max']:>10.3e} "
              f"{row['abs_log_ratio_mean'] / b['abs_log_ratio_mean']:>9.3f} "
              f"{row['abs_log_ratio_max'] / b['abs_log_ratio_max']:>8.3f}")
    print("agree: routes the trainer used == the engine's (on-policy tokens x MoE layers); trainer: the trainer "
          "routers' own top-1 == the engine's")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
