#!/usr/bin/env python
"""Benchmark: peak memory of Llama-4 chunked local attention, folded into the batch (the layer spec
in ``trainer/megatron/llama4.py``) vs the previous approach (one full ``[s, s]`` chunk mask and
``[b*heads, s, s]`` scores), on CPU.

One child process per measurement (forward + backward of a one-layer Llama-4 model, chunked RoPE
layer, fp32) reports its own peak RSS (VmHWM); a baseline child runs ``seq = chunk``, where both
approaches are the same plain causal attention. Prints the peak and the growth over the baseline
at ``seq = 4x`` and ``16x`` the chunk, and the ratio full-mask / folded.

    python bench/llama4_attention.py [--chunk 128 --heads 16 --head-dim 16]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert import run_child  # noqa: E402  (bench/convert.py: child process + VmHWM)


def _full_mask_core(base):
    """The previous approach, for comparison only: the chunk mask over the whole sequence."""
    import torch

    class FullMaskCore(base):
        def __init__(self, config, layer_number, *args, chunk_size: int = 0, **kwargs):
            super().__init__(config, layer_number, *args, **kwargs)
            self.chunk_size = chunk_size

        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            s = key.shape[0]
            if self.chunk_size and self.chunk_size < s:
                pos = torch.arange(s)
                attention_mask = ((pos[None, :] > pos[:, None]) | (pos[None, :] // self.chunk_size != pos[:, None] // self.chunk_size))[None, None]
            return super().forward(query, key, value, attention_mask, *args, **kwargs)

    return FullMaskCore


def child(*, mode: str, seq: int, chunk: int, heads: int, head_dim: int) -> None:
    """Forward + backward of a one-layer chunked Llama-4 model at ``seq`` tokens."""
    import torch

    from scalerl_mega.trainer.megatron import llama4, models, parallel
    from scalerl_mega.model.config import ModelConfig, ParallelConfig

    if mode == "full_mask":
        llama4.chunked_core_attention = _full_mask_core
    cfg = ModelConfig(name="bench", arch="llama4", vocab_size=256, hidden_size=heads * head_dim, ffn_hidden_size=256,
                      num_layers=1, num_attention_heads=heads, num_query_groups=heads, head_dim=head_dim,
                      max_position_embeddings=max(seq, 1024), attention_chunk_size=chunk, qk_l2_norm=True).validate()
    parallel.init_parallel(ParallelConfig(), model=cfg)
    gpt, _ = models.build_model(cfg, ParallelConfig())
    tokens = torch.randint(0, 256, (1, seq))
    out = gpt(tokens, torch.arange(seq)[None], None)
    out.float().square().mean().backward()
    print("ok", float(out.abs().mean()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=16)
    args = ap.parse_args()

    def peak(mode: str, seq: int) -> int:
        code = (f"import sys; sys.path.insert(0, 'bench'); import llama4_attention as b; "
                f"b.child(mode={mode!r}, seq={seq}, chunk={args.chunk}, heads={args.heads}, head_dim={args.head_dim})")
        return run_child(code)[1]

    mib = 1 << 20
    base = peak("folded", args.chunk)
    print(f"chunk {args.chunk}, {args.heads} heads x {args.head_dim}, one layer fwd+bwd, fp32, CPU")
    print(f"baseline (seq = chunk): peak RSS {base / mib:.0f} MiB")
    for mult in (4, 16):
        seq = mult * args.chunk
        folded, full = peak("folded", seq), peak("full_mask", seq)
        grow_f, grow_m = folded - base, full - base
        print(f"seq {seq:>5} ({mult:>2}x chunk): folded {folded / mib:7.0f} MiB (+{grow_f / mib:6.0f}), "
              f"full mask {full / mib:7.0f} MiB (+{grow_m / mib:6.0f}); "
              f"peak ratio full/folded {full / folded:.2f}, growth ratio {grow_m / max(grow_f, 1):.1f}")


if __name__ == "__main__":
    main()
