"""Benchmark: executed padding and trainer tokens/s of the micro-batch plan, sorted rows vs packed sequences.

Variants, one full `step.train_step` (forward, backward, AdamW; CISPO loss on the logits path) of
`tiny_dense` on CPU (world of 1, gloo) per round, alternated round by round in one process, the order
rotated every round (best of `--rounds`):

- `sorted`: the default plan (`batch.pack_micro_batches`, `train.pack_sequences=false`): length-sorted,
  cut by dynamic programming, each micro-batch trimmed to its own longest row;
- `packed`: `train.pack_sequences=true`: samples packed back to back into rows of `micro_batch_tokens`
  (block-diagonal causal mask and per-sample RoPE on CPU).

Two batches:
- `skewed`: issue 17's example, one 400-token row and 31 rows of 40 tokens at a 1,600-token budget;
- `paper`: the paper's length spread scaled down 32x (Sec. 2: 16,384-token sequences = 2,048 prompt +
  12,288 thinking + 2,048 answer; App. A.13 interruptions at 10k-12k thinking tokens): `--prompts`
  prompts x 16 samples, prompts of 16-64 tokens, 80% of completions short (exponential, mean 48
  tokens), 15% interrupted at 312-375 thinking tokens plus a short answer, 5% truncated at the
  448-token generation limit; budget 512 (16,384 / 32).

Reported per variant: micro-batches, executed padding fraction (1 - real tokens / the step's
`executed_tokens`, i.e. `train/padding_fraction`), and trainer tokens/s = real (unpadded) tokens / best
step time, wall and process CPU (on a shared, loaded machine the CPU time is the steadier), with the
ratio packed / sorted. Losses are printed to show the variants train the same objective. The race against
the pre-issue-17 execution (rows padded to the batch's longest) is retired: bench/results/microbatch.md.

    PYTHONPATH=$PWD .venv/bin/python bench/microbatch.py --rounds 3
"""

from __future__ import annotations

import argparse
import random

from single_rank import best_of_rounds, single_rank_model


def skewed_lengths() -> tuple[list[tuple[int, int]], int]:
    """(prompt, completion) lengths and the budget of issue 17's example; the long row sits in the middle."""
    rows = [(8, 32)] * 31
    rows.insert(13, (8, 392))
    return rows, 1600


def paper_lengths(prompts: int, seed: int) -> tuple[list[tuple[int, int]], int]:
    """The paper's spread scaled down 32x (module doc)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(prompts):
        prompt = rng.randint(16, 64)
        for _ in range(16):
            u = rng.random()
            if u < 0.80:
                out = min(448, max(4, int(rng.expovariate(1 / 48))))
            elif u < 0.95:
                out = rng.randint(312, 375) + rng.randint(8, 64)
            else:
                out = 448
            rows.append((prompt, out))
    return rows, 512


def build_batch(rows: list[tuple[int, int]], vocab: int, *, seed: int) -> dict:
    import torch

    from scalerl_mega.objective.losses import token_weights

    g = torch.Generator().manual_seed(seed)
    B, T = len(rows), max(p + o for p, o in rows)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    mask = torch.zeros(B, T)
    for b, (p, o) in enumerate(rows):
        ids[b, p + o:] = 0
        mask[b, p - 1:p - 1 + o] = 1.0
    pidx = torch.arange(B) // 16
    return {"input_ids": ids, "position_ids": torch.arange(T).expand(B, T).contiguous(),
            "targets": torch.roll(ids, -1, 1) * (mask > 0), "loss_mask": mask, "prompt_index": pidx,
            "advantages": torch.randn(B, generator=g),
            "gen_logp": (-torch.log(torch.tensor(float(vocab))) + 0.3 * torch.randn(B, T, generator=g)) * mask,
            "token_weights": token_weights(mask, pidx, "prompt")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the paper-spread batch (16 samples each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least load-sensitive)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    from scalerl_mega.batch import pack_micro_batches
    from scalerl_mega.trainer.megatron import parallel as par, step
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.microbatch import MicroBatchPlan
    from scalerl_mega.trainer.policy_loss import finalize_train_metrics, make_policy_loss_fn

    model_cfg = load_model_preset("tiny_dense")
    cfg, parallel, model, chunks, optimizer = single_rank_model(model_cfg)
    params = dict(model.named_parameters())
    init = {k: v.detach().clone() for k, v in params.items()}
    loss_fn = make_policy_loss_fn(loss_type="cispo", eps_low=None, eps_high=5.0, aggregation="prompt")

    print(f"torch threads {torch.get_num_threads()}; tiny_dense (hidden {model_cfg.hidden_size} x "
          f"{model_cfg.num_layers} layers, vocab {model_cfg.vocab_size}), CPU; best of {args.rounds} rounds")
    for name, (rows, budget) in (("skewed", skewed_lengths()), ("paper", paper_lengths(args.prompts, args.seed))):
        lengths = [p + o for p, o in rows]
        batch = build_batch(rows, model_cfg.vocab_size, seed=args.seed)
        T = max(lengths)
        plans = {"sorted": MicroBatchPlan(micro_batches=pack_micro_batches(lengths, max_tokens=budget), lengths=lengths),
                 "packed": MicroBatchPlan(micro_batches=pack_micro_batches(lengths, max_tokens=budget, pack=True),
                                          lengths=lengths, packed=True)}
        def run_one(v: str, r: int, batch=batch, plans=plans) -> dict:
            with torch.no_grad():  # every step from the same weights: the losses must agree
                for key, value in params.items():
                    value.copy_(init[key])
            return finalize_train_metrics(step.train_step(chunks, optimizer, batch, step=r, optim=cfg.optim,
                                                          parallel=parallel, loss_fn=loss_fn, plan=plans[v]))

        best, best_cpu, last = best_of_rounds(list(plans), run_one, rounds=args.rounds)
        real = sum(lengths)
        print(f"\n{name}: {len(rows)} rows, {real} tokens (longest {T}, median {sorted(lengths)[len(lengths) // 2]}), "
              f"micro_batch_tokens {budget}")
        print(f"{'variant':>8} {'micro-batches':>13} {'padding':>8} {'tokens/s wall':>14} {'x sorted':>8} "
              f"{'tokens/s CPU':>13} {'x sorted':>8} {'loss':>10}")
        for v, plan in plans.items():
            padding = 1.0 - real / last[v]["executed_tokens"]
            print(f"{v:>8} {len(plan.micro_batches):>13} {padding:>8.1%} "
                  f"{real / best[v]:>14.0f} {best['sorted'] / best[v]:>7.2f}x {real / best_cpu[v]:>13.0f} "
                  f"{best_cpu['sorted'] / best_cpu[v]:>7.2f}x {last[v]['loss']:>10.5f}")
    par.teardown_parallel()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
