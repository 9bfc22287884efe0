"""One-process worker: the trainer's Megatron model loaded straight from a multimodal Qwen3.5 checkpoint
(`Qwen3_5(Moe)ForConditionalGeneration`: text tensors under `model.language_model.`) against that model's logits on
text input (its interleaved multimodal RoPE is plain RoPE when every position axis carries the token index).
Prints `diff <max abs diff> <max abs logit>`."""

from __future__ import annotations

import os
import sys


def main() -> None:
    import torch
    import transformers

    from scalerl_mega.convert.load import load_hf_checkpoint
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.model.hf_import import model_from_hf_dir
    from scalerl_mega.trainer.megatron import models, parallel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from convert_worker import megatron_logits

    hf_dir, cls = sys.argv[1], sys.argv[2]
    m = model_from_hf_dir(hf_dir)
    pc = ParallelConfig()
    parallel.init_parallel(pc, model=m)
    gpt, _ = models.build_model(m, pc)
    gpt.eval()
    load_hf_checkpoint(gpt, hf_dir, dims=dims_from_model_config(m))
    torch.manual_seed(0)
    tokens = torch.randint(0, m.vocab_size, (2, 20))
    hf = getattr(transformers, cls).from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits
    out = megatron_logits(gpt, tokens)
    print("diff", float((out[..., :m.vocab_size] - ref).abs().max()), float(ref.abs().max()))
    parallel.teardown_parallel()


if __name__ == "__main__":
    main()
