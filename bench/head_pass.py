"""Benchmark: Megatron trainer step time with the fused CISPO head before/after removing its second LM-head pass.

Before (issue 17), `make_cispo_head_loss_fn` ran `cispo_from_hidden` (3 GEMMs: logits + both gradients) and
then a no-grad `LMHead.logprobs` pass (one more logits GEMM over the trained tokens) only for the IS metrics.
Now the fused pass returns its per-token log-probs, and it also computes the policy entropy from the
softmax buffer it already has. Variants, alternated round by round in one process, the order rotated
every round (best of `--rounds`):

- `two_pass`: the old behaviour (fused loss without entropy + the extra no-grad head pass);
- `one_pass_no_entropy`: one head pass, no entropy;
- `one_pass`: the default now (one head pass + entropy).

Each is a full `step.train_step` (forward, backward, AdamW) of a small Llama-style model with a large vocab
on CPU (world of 1, gloo), so the head is a visible share of the step, as for a real LLM's FP32 head.
Wall and process CPU time are both reported (best over rounds); on a shared, loaded machine the CPU
time is the steadier of the two.

    .venv/bin/python bench/head_pass.py --vocab 32768 --hidden 256 --rows 8 --seq 256 --rounds 3
"""

from __future__ import annotations

import argparse

from single_rank import best_of_rounds, single_rank_model


def _old_head_fn(eps_high: float):
    """The pre-issue-17 fused head loss: one fused pass, then a second no-grad head pass for the IS metrics."""
    import torch

    from scalerl_mega.trainer.policy_loss import make_cispo_head_loss_fn, policy_metrics

    fused = make_cispo_head_loss_fn(eps_low=None, eps_high=eps_high, with_entropy=False)

    def head_loss_fn(head, mb):
        loss, metrics = fused(head, mb)
        with torch.no_grad():
            logp_BT = head.logprobs(mb["targets"], mask_BT=mb["loss_mask"] > 0)
        return loss, {**metrics, **policy_metrics(logp_BT, mb, loss)}

    return head_loss_fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least load-sensitive)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    from scalerl_mega.objective.losses import token_weights
    from scalerl_mega.trainer.megatron import parallel as par, step
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.policy_loss import finalize_train_metrics, make_cispo_head_loss_fn

    model_cfg = load_model_preset("tiny_dense", overrides=dict(
        vocab_size=args.vocab, hidden_size=args.hidden, ffn_hidden_size=2 * args.hidden, num_layers=args.layers,
        max_position_embeddings=max(512, args.seq)))
    cfg, parallel, model, chunks, optimizer = single_rank_model(model_cfg)

    B, T = args.rows, args.seq
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, : T // 8] = 0.0
    pidx = torch.arange(B) // 4
    batch = {"input_ids": ids, "position_ids": torch.arange(T).expand(B, T).contiguous(),
             "targets": torch.roll(ids, -1, 1), "loss_mask": mask, "prompt_index": pidx,
             "advantages": torch.randn(B, generator=g),
             "gen_logp": -torch.log(torch.tensor(float(args.vocab))) + 0.3 * torch.randn(B, T, generator=g),
             "token_weights": token_weights(mask, pidx, "prompt")}
    variants = {"two_pass": _old_head_fn(5.0),
                "one_pass_no_entropy": make_cispo_head_loss_fn(eps_low=None, eps_high=5.0, with_entropy=False),
                "one_pass": make_cispo_head_loss_fn(eps_low=None, eps_high=5.0)}
    def run_one(name: str, r: int) -> dict:
        return finalize_train_metrics(step.train_step(chunks, optimizer, batch, step=r, optim=cfg.optim,
                                                      parallel=parallel, head_loss_fn=variants[name],
                                                      micro_batch_tokens=B * T))

    best, best_cpu, last = best_of_rounds(list(variants), run_one, rounds=args.rounds)
    print(f"torch threads {torch.get_num_threads()}; model hidden {args.hidden} x {args.layers} layers, vocab "
          f"{args.vocab}; batch {B} x {T} ({int(mask.sum())} trained tokens); best of {args.rounds} rounds")
    for name in variants:
        ent = last[name].get("entropy")
        print(f"{name:>20}: train_step wall {best[name]:.3f} s ({best[name] / best['two_pass']:.2f}x two_pass), "
              f"CPU {best_cpu[name]:.3f} s ({best_cpu[name] / best_cpu['two_pass']:.2f}x)"
              f"  entropy={'-' if ent is None else f'{ent:.4f}'}  rho_mean={last[name]['rho_mean']:.4f}")
    par.teardown_parallel()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
