"""Tokens/s of the local engine's batched decode vs HF `generate()` on the same tiny model and batch.

The model is a dense Llama of the CPU demo's depth and width (4 layers, d_model 128, 4 heads) with a 512-wide MLP
and a 24-id vocabulary: 1.06M parameters (the run prints the count). Both sides sample at temperature 1 with a
KV cache, one torch thread, the same prompts and the same number of new tokens (no early stop); rates are
tokens per CPU second of this process (`time.process_time`), so a busy machine slows them less than wall time.
Also reports the engine with continuous admission (more requests than slots, mixed lengths), and requests in
groups of 8 samples per prompt (as the trainer submits them) with the shared prefill (`CoreConfig.share_prefill`)
against a prefill per request, in the same run.
`--experiment NAME` takes the model that `experiment=NAME` composes instead, with 17-token prompts (e.g.
`reproduction/predictability`: the reproduction's Llama-4 MoE twin, with chunked-attention layers).
Races: engine vs HF `generate()`, `CoreConfig.share_prefill` on vs off, and on a MoE model
`CoreConfig.sparse_moe` (the engine's sparse expert dispatch) vs HF's all-experts pass.

    .venv/bin/python bench/generate.py [--batch 64 256] [--new-tokens 40] [--experiment NAME]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch

    from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
    from scalerl_mega.rollout.local import LocalModelSpec, build_model
    from scalerl_mega.types import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--experiment", default=None, help="take the model that experiment=NAME composes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.experiment:
        arch, cfg = _experiment_model(args.experiment)
        args.prompt_len = 17
    else:
        arch, cfg = "llama", dict(
            vocab_size=24,
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
    def fresh():  # the engine switches a model's MoE layers to sparse dispatch in place: one model per use
        return build_model(LocalModelSpec(arch=arch, config=cfg, init_seed=0))

    model = fresh()
    moe = any(type(m).__name__ == "Llama4TextMoe" for m in model.modules())
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, {args.new_tokens} new tokens")
    prompt = [1 + i % (cfg["vocab_size"] - 1) for i in range(args.prompt_len)]
    max_seq = args.prompt_len + args.new_tokens + 1
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)

    def engine(b: int, *, sparse: bool = True) -> tuple[float, float]:
        """(tok/s with b requests decoded together, tok/s with continuous admission of 3b mixed-length
        requests (budgets 10..new_tokens) into b slots)."""
        core = GenerationCore(fresh(), config=CoreConfig(max_batch=b, max_seq_len=max_seq, sparse_moe=sparse,
                                                         share_prefill=False))
        for i in range(2):
            core.add(GenRequest(rid=f"w{i}", prompt_id=f"w{i}", sample_index=0, prompt_ids=prompt, sampling=sp, seed=i))
        core.run_until_done()  # warm-up
        for i in range(b):
            core.add(GenRequest(rid=str(i), prompt_id=str(i), sample_index=0, prompt_ids=prompt, sampling=sp, seed=i))
        t0 = time.process_time()
        tok = sum(len(c.output_ids) for c in core.run_until_done())
        one = tok / (time.process_time() - t0)
        for i in range(3 * b):
            n_new = 10 + (i * 7) % (args.new_tokens - 9)
            core.add(GenRequest(rid=f"c{i}", prompt_id=f"c{i}", sample_index=0, prompt_ids=prompt,
                                sampling=SamplingParams(max_new_tokens=n_new), seed=i))  # fmt: skip
        t0 = time.process_time()
        tok = sum(len(c.output_ids) for c in core.run_until_done())
        return one, tok / (time.process_time() - t0)

    def grouped(b: int, *, share: bool) -> float:
        """tok/s with continuous admission of 6b requests, 8 samples per prompt (6b/8 distinct prompts, budgets
        10..new_tokens), into b slots."""
        core = GenerationCore(fresh(), config=CoreConfig(max_batch=b, max_seq_len=max_seq, share_prefill=share))
        core.add(GenRequest(rid="w", prompt_id="w", sample_index=0, prompt_ids=prompt, sampling=sp, seed=0))
        core.run_until_done()  # warm-up
        for i in range(6 * b):
            g = i // 8
            p = [1 + (g * 7 + j * 3) % (cfg["vocab_size"] - 1) for j in range(args.prompt_len)]
            core.add(GenRequest(rid=f"g{i}", prompt_id=f"g{g}", sample_index=i % 8, prompt_ids=p,
                                sampling=SamplingParams(max_new_tokens=10 + (i * 7) % (args.new_tokens - 9)), seed=i))
        t0 = time.process_time()
        tok = sum(len(c.output_ids) for c in core.run_until_done())
        return tok / (time.process_time() - t0)

    for b in args.batch:
        # HF generate (KV cache, sampling, HF's dense MoE); no eos so every row makes exactly new_tokens
        ids = torch.tensor([prompt] * b)
        kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens,
                  min_new_tokens=args.new_tokens, pad_token_id=0, eos_token_id=None)  # fmt: skip
        with torch.inference_mode():
            model.generate(ids[:2], **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
            t0 = time.process_time()
            out = model.generate(ids, **kw)
            hf_tps = (out.shape[1] - args.prompt_len) * b / (time.process_time() - t0)
        one, cont = engine(b)
        line = (f"batch {b:4d}: HF generate {hf_tps:8.0f} tok/s | engine {one:8.0f} tok/s ({one / hf_tps:.2f}x HF) | "
                f"engine, continuous admission of {3 * b} mixed-length requests {cont:8.0f} tok/s")
        if moe:  # baseline in the same run: the engine with HF's dense all-experts MoE pass
            _, dense = engine(b, sparse=False)
            line += f" (dense MoE {dense:8.0f} tok/s: sparse dispatch {cont / dense:.2f}x)"
        print(line, flush=True)
        shared, own = grouped(b, share=True), grouped(b, share=False)
        print(f"batch {b:4d}: {6 * b} requests in groups of 8 per prompt: shared prefill {shared:8.0f} tok/s, "
              f"a prefill per request {own:8.0f} tok/s ({shared / own:.2f}x)", flush=True)


def _experiment_model(name: str) -> tuple[str, dict]:
    """(arch, HF config kwargs) of the trainer model that `experiment=NAME` composes."""
    from scalerl_mega.compose import compose
    from scalerl_mega.model.hf_export import hf_config_from_model

    return hf_config_from_model(compose([f"experiment={name}"]).model)


if __name__ == "__main__":
    main()
