#!/usr/bin/env python
"""Write a tiny random Hugging Face checkpoint of a supported architecture, offline (nothing is downloaded).

    .venv/bin/python tools/make_tiny_checkpoint.py qwen3 /tmp/tiny-qwen3          # Qwen3ForCausalLM
    .venv/bin/python tools/make_tiny_checkpoint.py qwen3_moe /tmp/tiny-qwen3-moe  # Qwen3MoeForCausalLM
    .venv/bin/python tools/make_tiny_checkpoint.py deepseek_v3 /tmp/tiny-dsv3    # DeepseekV3ForCausalLM (MLA)
    .venv/bin/python tools/make_tiny_checkpoint.py --list                         # every architecture

OUT gets config.json + model.safetensors (FP32, random init of `--seed`), the synthetic task's 47-token
tokenizer (scalerl_mega/data/tasks/tokenizer.py; `--vocab-size 48` pads the embedding for tensor parallelism at 2)
and scalerl_run.json, what the checkpoint is for: the overrides
that train it on the embedded task on CPU with an SFT warm start (scalerl_mega/model/tiny_run.py), which `scalerl-train`
adds when `init_from_hf=OUT` (`scalerl-train experiment=qwen3 init_from_hf=OUT train.steps=3`, nothing else). It
converts too (tools/convert_hf_to_megatron.py).
The shapes are those of the architecture's tiny preset under conf/model/ (table `TINY` below: a new architecture
is one entry), with the vocabulary cut to the tokenizer's. Exit 0, or 2 with one line naming the problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY = {  # model.arch -> the tiny preset (conf/model/<preset>.yaml) whose shapes the checkpoint takes
    "llama": "tiny_dense",
    "llama4": "tiny_moe",
    "qwen3": "tiny_qwen3",
    "qwen3_moe": "tiny_qwen3_moe",
    "deepseek_v3": "tiny_deepseek_v3",
    "qwen3_next": "tiny_qwen3_next",
    "qwen3_5": "tiny_qwen3_5",
    "qwen3_5_moe": "tiny_qwen3_5_moe",
}


def make_tiny_checkpoint(arch: str, out: Path, *, seed: int = 0, vocab_size: int | None = None) -> Path:
    """The tiny random `arch` checkpoint + the synthetic task's tokenizer in `out` (created; must be empty).
    `vocab_size` pads the embedding and head past the tokenizer's 47 tokens (rows no token maps to, as released
    checkpoints pad theirs), e.g. to 48 so that tensor parallelism at 2 splits the vocabulary evenly."""
    import torch
    import transformers

    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer
    from scalerl_mega.model.archs import arch_of
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.tiny_run import write_run_file

    if arch not in TINY:
        raise ValueError(f"architecture {arch!r} has no tiny checkpoint; known: {', '.join(TINY)}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty (choose a new directory)")
    tok = build_arith_tokenizer()
    if vocab_size is not None and vocab_size < len(tok):
        raise ValueError(f"--vocab-size {vocab_size} is below the tokenizer's {len(tok)} tokens")
    model_cfg = load_model_preset(TINY[arch], overrides={"vocab_size": vocab_size or len(tok)})
    arch_name, kwargs = hf_config_from_model(model_cfg)
    kwargs.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    record = arch_of(arch_name)
    config = getattr(transformers, record.config_class)(**kwargs)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, record.causal_lm)(config).float().eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_run_file(out, arch=arch, preset=TINY[arch])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arch", nargs="?", choices=sorted(TINY), help="model.arch of the checkpoint")
    ap.add_argument("out", nargs="?", type=Path, help="output directory (created; must be new or empty)")
    ap.add_argument("--seed", type=int, default=0, help="random init seed (default 0)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="embedding rows (default the tokenizer's 47; pad, e.g. 48, for parallel.tp=2)")
    ap.add_argument("--list", action="store_true", help="print each architecture and its tiny preset, then exit")
    args = ap.parse_args(argv)
    if args.list:
        for arch, preset in TINY.items():
            print(f"{arch:<10} conf/model/{preset}.yaml")
        return 0
    if args.arch is None or args.out is None:
        ap.error("give ARCH and OUT (or --list)")
    try:
        out = make_tiny_checkpoint(args.arch, args.out, seed=args.seed, vocab_size=args.vocab_size)
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is not installed in {sys.executable}; run the project's environment: "
              f".venv/bin/python tools/make_tiny_checkpoint.py", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a tiny random {args.arch} checkpoint (shapes of conf/model/{TINY[args.arch]}.yaml, seed "
          f"{args.seed}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
