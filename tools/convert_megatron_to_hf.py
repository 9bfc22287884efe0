#!/usr/bin/env python
"""Convert a Megatron checkpoint (any TP/PP/EP) back to a Hugging Face checkpoint.

    python tools/convert_megatron_to_hf.py --ckpt CKPT --out HF_OUT [--layout auto|causal|conditional]
    python tools/convert_megatron_to_hf.py --ckpt LORA_CKPT --peft-out ADAPTER_DIR [--merge-lora --out HF_OUT] [--base DIR]

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

A LoRA run's checkpoint (`peft=lora`) holds the adapters only and references its base (`init_from_hf`, or the seed
of a random base): --peft-out writes the adapter as PEFT files (adapter_config.json + adapter_model.safetensors,
loadable with `peft.PeftModel.from_pretrained(model, ADAPTER_DIR)`); --merge-lora --out writes the base with the
adapters folded in (W + alpha/r B A) as a plain HF checkpoint. --base DIR: the base's directory if it moved (its
fingerprint must match the recorded one).
"""

from __future__ import annotations

import argparse
import sys

from scalerl_mega.model.archs import ARCHS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="converter checkpoint dir, trainer step_N dir, or trainer checkpoint root (follows 'latest')")
    p.add_argument("--out", help="output HF directory (must not exist); of a LoRA checkpoint only with --merge-lora")
    p.add_argument("--peft-out", help="LoRA checkpoint: write its adapter here as PEFT files (must not exist)")
    p.add_argument("--merge-lora", action="store_true", help="LoRA checkpoint: --out gets the base with the adapters merged")
    p.add_argument("--base", help="LoRA checkpoint: the base HF directory, if it moved since training")
    p.add_argument("--arch", choices=tuple(ARCHS), default=None, help="fail unless the checkpoint is this architecture")
    p.add_argument("--layout", choices=("auto", "causal", "conditional"), default="auto",
                   help="HF layout to write: Llama4ForCausalLM/LlamaForCausalLM or Llama4ForConditionalGeneration")
    p.add_argument("--max-shard-gb", type=float, default=2.0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.peft_out or args.merge_lora or args.base:
        return _lora(args)
    if not args.out:
        p.error("--out is required (or --peft-out for a LoRA checkpoint)")
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


def _lora(args) -> int:
    from scalerl_mega.convert.peft_convert import convert_lora_checkpoint

    if args.merge_lora != bool(args.out):
        print("error: --merge-lora and --out go together for a LoRA checkpoint (the merged model's directory)",
              file=sys.stderr)
        return 2
    try:
        written = convert_lora_checkpoint(ckpt=args.ckpt, peft_out=args.peft_out, merged_out=args.out,
                                          base_dir=args.base, max_shard_bytes=int(args.max_shard_gb * (1 << 30)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "peft" in written:
        print(f"peft adapter: {args.peft_out} ({written['peft']['tensors']} tensors, {written['peft']['bytes']} bytes)")
    if "merged" in written:
        print("\n".join(written["merged"].lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
