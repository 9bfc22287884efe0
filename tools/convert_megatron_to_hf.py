#!/usr/bin/env python
"""Convert a Megatron checkpoint (any TP/PP/EP) back to a Hugging Face checkpoint.

    python tools/convert_megatron_to_hf.py --ckpt CKPT --out HF_OUT [--layout auto|causal|conditional]

CKPT is either a directory written by tools/convert_hf_to_megatron.py, or a training checkpoint of
the scalerl-mega trainer: a `step_N` directory or the checkpoint root (its `latest` file is followed).
A training checkpoint is loaded on CPU in this one process (resharded from its saved layout) and
needs the `model_config.json` the trainer writes next to `COMPLETE`.

Writes safetensors shards + model.safetensors.index.json + config.json, loadable offline with
``transformers.AutoModelForCausalLM.from_pretrained(HF_OUT)`` (causal layout) or
``Llama4ForConditionalGeneration.from_pretrained`` (conditional). Nothing is written on error.

--layout conditional writes Meta's multimodal Llama4ForConditionalGeneration layout (text weights
under ``language_model.``, plus the vision tower when the checkpoint was converted from one): the
layout SGLang 0.5.23 serves Llama-4 through (its mllama4 loader). The text-only causal layout of a
Llama-4 model prints a warning: SGLang's Llama4ForCausalLM loader skips the fused experts.
--layout auto (default) keeps the layout the checkpoint was converted from (causal for trainer
checkpoints).
"""

from __future__ import annotations

import argparse
import sys

from scalerl_mega.model.archs import ARCHS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="converter checkpoint dir, trainer step_N dir, or trainer checkpoint root (follows 'latest')")
    p.add_argument("--out", required=True, help="output HF directory (must not exist)")
    p.add_argument("--arch", choices=tuple(ARCHS), default=None, help="fail unless the checkpoint is this architecture")
    p.add_argument("--layout", choices=("auto", "causal", "conditional"), default="auto",
                   help="HF layout to write: Llama4ForCausalLM/LlamaForCausalLM or Llama4ForConditionalGeneration")
    p.add_argument("--max-shard-gb", type=float, default=2.0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from scalerl_mega.convert.to_hf import convert_megatron_to_hf

    try:
        summary = convert_megatron_to_hf(ckpt=args.ckpt, out=args.out, expect_arch=args.arch, progress=not args.no_progress,
                                         max_shard_bytes=int(args.max_shard_gb * (1 << 30)), layout=args.layout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary.lines()))
    for w in summary.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
