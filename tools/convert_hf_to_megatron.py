#!/usr/bin/env python
"""Convert a Hugging Face Llama-3 / Llama-4 / Qwen3 / Qwen3-MoE checkpoint to the converter's Megatron layout.

Accepts LlamaForCausalLM, Llama4ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and Meta's multimodal Llama4ForConditionalGeneration
(text weights under ``language_model.``): its vision tower is reported and left out of the Megatron
model, and kept unchanged in OUT/hf_non_text/ so that ``convert_megatron_to_hf.py --layout
conditional`` writes the original checkpoint back.

    python tools/convert_hf_to_megatron.py --hf-dir HF --out OUT --tp 2 --pp 1 --ep 2

Writes OUT/mp_rank_TT_PPP_EEE/model.safetensors (TP-sharded, Megatron names) + megatron_convert.json,
streaming one tensor at a time; validates every name and shape first and writes nothing on error.
Load into a live model with ``scalerl_mega.convert.load.load_megatron_checkpoint``.

A blockwise FP8 checkpoint (DeepSeek-V3, Qwen3-*-FP8: ``weight_scale_inv`` scales, ``quantization_config`` with
``weight_block_size``) is dequantized on the way (``--dequantize-dtype``, default: the dtype its config.json
names); any other quantization format is refused with its name.
"""

from __future__ import annotations

import argparse
import sys

from scalerl_mega.model.archs import ARCHS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--out", required=True, help="output directory (must not exist)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None, help="expert tensor parallel size (default: --tp)")
    p.add_argument("--arch", choices=tuple(ARCHS), default=None, help="fail unless the checkpoint is this architecture")
    p.add_argument("--vocab-multiple", type=int, default=128, help="pad vocab to a multiple of this times --tp")
    p.add_argument("--dequantize-dtype", choices=("bfloat16", "float32"), default=None,
                   help="dtype of a blockwise FP8 checkpoint's dequantized weights (default: its config's dtype)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    import torch

    from scalerl_mega.convert.pipeline import convert_hf_to_megatron

    try:
        summary = convert_hf_to_megatron(hf_dir=args.hf_dir, out=args.out, tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp,
                                         vocab_multiple=args.vocab_multiple, expect_arch=args.arch, progress=not args.no_progress,
                                         dequantize_dtype=getattr(torch, args.dequantize_dtype) if args.dequantize_dtype else None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
